"""The op's ``precision`` and ``k_scale`` arguments: the FP8 scorer's dense top-K on the quantised
inputs, bitwise, every path and input dtype; an FP8 key cache read in place of the keys; their
errors, raised before any work."""
import pytest
import torch

import compiler  # noqa: F401  (registers the ops)
from runtime.dense_scorer import dense_topk
from runtime.fp8_key_cache import Fp8KeyCache
from runtime.fp8_quant import quantize_indexer_inputs

OP = torch.ops.pulsar_dosa.certified_topk


def inputs(B=2, S=6, H=3, D=32, T=40, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, w = torch.randn(B, S, H, D, generator=g), torch.randn(B, T, D, generator=g), torch.randn(B, S, H, generator=g)
    visible = torch.rand(B, S, T, generator=g) > 0.3
    return q.to(dtype), k.to(dtype), w.to(dtype), visible


def fp8_reference(q, k, w, topk, mask, precision):
    q8, k8, w8, scale = quantize_indexer_inputs(q, k, w, precision)
    return dense_topk(q8, k8, w8, topk, mask, key_scale=scale)


def assert_same(got, want):
    assert torch.equal(got[1], want[1]) and torch.equal(got[0].view(torch.int32), want[0].view(torch.int32))


@pytest.mark.parametrize("precision", ["fp8", "fp8_unrotated"])
def test_opcheck(precision):
    q, k, w, visible = inputs()
    torch.library.opcheck(OP.default, (q, k, w, 4, visible), {"record_stats": False, "precision": precision})
    k8, scale = quantize_indexer_inputs(q, k, w, precision)[1::2]
    # test_schema compares inputs before and after with a multiply that float8 tensors lack on the CPU
    torch.library.opcheck(OP.default, (q, k8, w, 4, visible),
                          {"record_stats": False, "precision": precision, "k_scale": scale},
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("path", ["auto", "dense", "certified"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("precision", ["fp8", "fp8_unrotated"])
def test_equals_the_fp8_dense_reference_bitwise(path, dtype, precision):
    q, k, w, visible = inputs(seed=1, dtype=dtype, T=120)
    got = OP(q, k, w, 9, visible, path=path, record_stats=False, precision=precision)
    assert_same(got, fp8_reference(q, k, w, 9, visible, precision))


def test_an_fp8_key_cache_is_read_in_place_of_the_keys():
    q, k, w, visible = inputs(seed=2, T=90, dtype=torch.bfloat16)
    cache = Fp8KeyCache("fp8")
    for start in range(0, 90, 30):
        cache.append(k[:, start:start + 30])
    want = OP(q, k, w, 7, visible, path="certified", record_stats=False, precision="fp8")
    got = OP(q, cache.keys, w, 7, visible, path="certified", record_stats=False, precision="fp8",
             k_scale=cache.scales)
    assert_same(got, want)


def test_bad_fp8_arguments_are_clear_errors():
    q, k, w, visible = inputs()
    k8, scale = quantize_indexer_inputs(q, k, w)[1::2]
    with pytest.raises(ValueError, match="precision: expected one of"):
        OP(q, k, w, 4, precision="fp16")
    with pytest.raises(ValueError, match="k_scale: pre-quantised keys are scored by an fp8 precision"):
        OP(q, k8, w, 4, k_scale=scale)
    with pytest.raises(TypeError, match="k: expected float8_e4m3fn keys"):
        OP(q, k, w, 4, precision="fp8", k_scale=scale)
    with pytest.raises(ValueError, match=r"k_scale: expected float32 \[B,T\] = \(2, 40\)"):
        OP(q, k8, w, 4, precision="fp8", k_scale=scale[:, :5])
    with pytest.raises(ValueError, match="Hadamard.*power of two, got D=24"):
        OP(q[..., :24], k[..., :24], w, 4, precision="fp8")
    unrotated = OP(q[..., :24], k[..., :24], w, 4, precision="fp8_unrotated", record_stats=False)
    assert_same(unrotated, fp8_reference(q[..., :24], k[..., :24], w, 4, None, "fp8_unrotated"))
