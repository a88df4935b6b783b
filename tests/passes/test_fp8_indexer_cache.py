"""An FP8 indexer key cache in a compiled DSA model (``compiler.fp8_indexer_cache``): the indexer op
reads the cached E4M3 keys and scales directly, prefill and decode, with exactly the output of the
same model compiled with that precision over transformers' own cache; uncompiled, the model reads
the dequantised keys."""
import pytest
import torch
from transformers import DynamicCache, LlamaConfig

import compiler.ops.fp8_keys as fp8_keys
from benchmarks.e2e import SMOKE_SIZES, build
from scripts.demo import build_model, tiny_config
from compiler.fp8_indexer_cache import Fp8IndexedLayer, fp8_indexer_cache, to_fp8_indexer_cache
from compiler.passes.dsa_indexer import _moved_dims
from compiler.report import collecting
from runtime.fp8_quant import quantize_keys
from runtime.pulsar import cache_keyword

STEPS = ((0, 30), (30, 31), (31, 32))
"""Prefill and two decode steps."""


@pytest.fixture
def dequantised(monkeypatch):
    """Counts the calls that compute an FP8 cache's dequantised keys."""
    calls = []
    real = fp8_keys.dequantize_keys
    monkeypatch.setattr(fp8_keys, "dequantize_keys", lambda *a: calls.append(a[0].shape) or real(*a))
    return calls


@pytest.mark.parametrize("name", ["DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"])
def test_a_compiled_model_reads_the_fp8_cache_as_it_is_stored(name, dequantised):
    """bf16, as a model runs: the indexer's upcast keys are narrowed back to the cache's op and
    folded through it."""
    if name == "DeepseekV32ForCausalLM":
        model = build_model(tiny_config(layers=1), torch.bfloat16)
    else:
        model, _ = build(name, 1, SMOKE_SIZES, "cpu", torch.bfloat16)
    ids = torch.randint(0, 128, (1, STEPS[-1][1]), generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa", dynamic=True,
                             options={"downstream": "eager", "indexer_precision": "fp8"})
    ours, theirs = fp8_indexer_cache(model.config), DynamicCache(config=model.config)
    kw = cache_keyword(type(model))
    with torch.no_grad(), collecting() as report:
        for start, stop in STEPS:
            want = compiled(ids[:, start:stop], use_cache=True, **{kw: theirs}).logits
            got = compiled(ids[:, start:stop], use_cache=True, **{kw: ours}).logits
            assert torch.equal(got, want)
    indexer = [r for r in report.rewrites if r.kind == "dsa_indexer"]
    assert {r.details["fp8_key_cache"] for r in indexer} == {False, True}  # transformers' cache, then ours
    assert not dequantised  # the op took the E4M3 keys and their scales; the dequantised keys never existed
    layer = ours.layers[0]
    keys = theirs.layers[0].indexer_keys
    assert layer.indexer_keys.dtype == torch.float8_e4m3fn and layer.indexer_keys.shape == keys.shape
    want8, want_scales = quantize_keys(keys, "fp8")  # appended in steps = quantised at once, bit for bit
    assert torch.equal(layer.indexer_keys.view(torch.uint8), want8.view(torch.uint8))
    assert torch.equal(layer.indexer_key_scales, want_scales)


def test_another_precision_or_no_compile_reads_the_dequantised_keys(dequantised):
    model = build_model(tiny_config(layers=1), torch.float32)
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(4))
    kw = cache_keyword(type(model))
    with torch.no_grad():
        theirs, ours = DynamicCache(config=model.config), fp8_indexer_cache(model.config, "fp8_unrotated")
        model(ids, use_cache=True, **{kw: theirs})
        eager = model(ids, use_cache=True, **{kw: ours}).logits
        assert dequantised and torch.isfinite(eager).all()
        keys, layer = theirs.layers[0].indexer_keys, ours.layers[0]
        read = fp8_keys.dequantize_keys(layer.indexer_keys, layer.indexer_key_scales, "fp8_unrotated", keys.dtype)
        # E4M3 keeps 3 mantissa bits: each key within 2^-4 of its row's largest magnitude
        assert ((read - keys).abs() <= keys.abs().amax(-1, keepdim=True) / 16).all()
        dequantised.clear()
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="pulsar_dosa", dynamic=True,
                                 options={"downstream": "eager", "indexer_precision": "fp8"})
        got = compiled(ids, use_cache=True, **{kw: fp8_indexer_cache(model.config, "fp8_unrotated")}).logits
    assert dequantised and torch.isfinite(got).all()  # an fp8_unrotated cache under "fp8": dequantised, scored in fp8


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="config"):
        fp8_indexer_cache(LlamaConfig(num_hidden_layers=2))
    with pytest.raises(ValueError, match="precision"):
        fp8_indexer_cache(tiny_config(layers=1), "bf16")
    with pytest.raises(NotImplementedError, match="crop"):
        Fp8IndexedLayer().crop(1)
    k8, scales = torch.ops.pulsar_dosa.fp8_quantize_keys(torch.randn(1, 5, 16), "fp8")
    with pytest.raises(ValueError, match="keys"):
        torch.ops.pulsar_dosa.fp8_cached_keys(k8.float(), scales, "fp8", torch.float32)
    with pytest.raises(ValueError, match="scales"):
        torch.ops.pulsar_dosa.fp8_cached_keys(k8, scales[:, :4], "fp8", torch.float32)
    with pytest.raises(ValueError, match="k:"):
        torch.ops.pulsar_dosa.fp8_quantize_keys(torch.randn(5, 16), "fp8")
    with pytest.raises(ValueError, match="k: precision 'fp8' rotates q and k by a Hadamard transform"):
        torch.ops.pulsar_dosa.fp8_quantize_keys(torch.randn(1, 5, 24, device="meta"), "fp8")
    with pytest.raises(TypeError, match="config: expected a transformers configuration"):
        fp8_indexer_cache(None)
    with pytest.raises(TypeError, match="cache: expected a transformers cache"):
        to_fp8_indexer_cache({})
    with pytest.raises(ValueError, match="precision"):
        to_fp8_indexer_cache(DynamicCache(config=LlamaConfig(num_hidden_layers=2)), "bf16")


def test_keys_that_cannot_follow_the_cached_ones_are_named():
    layer = fp8_indexer_cache(tiny_config(layers=1)).layers[0]
    with pytest.raises(TypeError, match=r"k: expected a float tensor \[B,t,D\]"):
        layer.update_indexer(torch.randn(3, 16))
    layer.update_indexer(torch.randn(1, 3, 16))
    for keys in (torch.randn(1, 3, 32), torch.randn(2, 3, 16), torch.randn(1, 3, 16, device="meta")):
        with pytest.raises(ValueError, match=r"k: expected \[B=1, t, D=16\] on cpu \(the cache's\)"):
            layer.update_indexer(keys)
    assert layer.update_indexer(torch.randn(1, 2, 16)).shape == (1, 5, 16)


def test_only_dim_moves_that_undo_each_other_fold():
    """The pass folds the cache into the op only when the k operand is the cache element for element."""
    dims = ["B", "T", "D"]
    moved = _moved_dims(_moved_dims(dims, "transpose", (-1, -2)), "unsqueeze", (1,))
    assert moved == ["B", None, "D", "T"]
    assert _moved_dims(_moved_dims(moved, "squeeze", (1,)), "transpose", (1, 2)) == dims
    assert _moved_dims(moved, "squeeze", (1,)) == ["B", "D", "T"]
    assert _moved_dims(dims, "squeeze", (1,)) is None  # T is not a unit dim
    assert _moved_dims(dims, "squeeze", ()) is None  # squeeze() of every unit dim: not followed
    assert _moved_dims(dims, "permute", ((0, 2, 1),)) == _moved_dims(dims, "permute", (0, 2, 1)) == ["B", "D", "T"]
    assert _moved_dims(dims, "transpose", (0, 3)) is None
