"""runtime.fp8_key_cache: keys appended in any steps hold exactly their quantisation at once, read as
unit-stride views; bad precisions, empty reads and mismatched keys are clear errors."""
import pytest
import torch

from runtime.fp8_key_cache import Fp8KeyCache
from runtime.fp8_quant import quantize_indexer_inputs, quantize_keys


def test_key_cache_appended_in_steps_holds_the_quantisation_of_all_keys():
    k = torch.randn(3, 50, 32, dtype=torch.bfloat16)
    cache = Fp8KeyCache("fp8")
    for start, stop in ((0, 1), (1, 17), (17, 18), (18, 50)):
        keys, scales = cache.append(k[:, start:stop])
        assert keys.shape == (3, stop, 32) and cache.length == stop
    want8, want_scale = quantize_keys(k, "fp8")
    assert torch.equal(cache.keys.view(torch.uint8), want8.view(torch.uint8))
    assert torch.equal(cache.scales, want_scale)
    assert cache.keys.stride(-1) == 1 and cache.scales.stride(-1) == 1
    _, q8_k, _, ks = quantize_indexer_inputs(torch.randn(3, 2, 4, 32), k, torch.randn(3, 2, 4))
    assert torch.equal(q8_k.view(torch.uint8), want8.view(torch.uint8)) and torch.equal(ks, want_scale)


def test_key_cache_refuses_bf16_an_empty_read_and_mismatched_keys():
    with pytest.raises(ValueError, match="fp8 precision"):
        Fp8KeyCache("bf16")
    cache = Fp8KeyCache("fp8_unrotated")
    with pytest.raises(ValueError, match="empty"):
        cache.keys
    cache.append(torch.randn(2, 4, 32))
    with pytest.raises(ValueError, match=r"expected \[B=2, t, D=32\]"):
        cache.append(torch.randn(2, 4, 16))
    with pytest.raises(TypeError, match="float tensor"):
        cache.append(torch.ones(2, 4, 32, dtype=torch.int64))
