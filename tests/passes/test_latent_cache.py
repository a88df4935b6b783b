"""A latent cache (``compiler.latent_cache``) in a DSA model: the logits equal those over
transformers' cache to rounding (prefill, chunked prefill, decode; compiled and not), the compiled
model's attention reads the cached latent without expanding it, the uncompiled model reads the
expansion, its memory per token is ``bytes_per_token``'s, and ``generate`` runs on it."""
import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import compiler.ops.latent_kv as latent_kv
from benchmarks.e2e import V32_SIZES
from compiler.latent_cache import LatentFp8Layer, LatentLayer, bytes_per_token, latent_cache, pending_latent
from compiler.report import collecting
from runtime.absorbed_attention import expand_latent
from runtime.pulsar import cache_keyword
from tests.passes.test_cache_path import STEPS, caches_expanded_rows
from tests.passes.test_dsa_sparse_attention import ATOL, _ids, dsa_model


@pytest.fixture
def expansions(monkeypatch):
    """Counts the calls that expand a latent cache's rows (``pulsar_dosa::latent_cached_kv``)."""
    calls = []
    monkeypatch.setattr(latent_kv, "expand_latent", lambda *a: calls.append(a[0].shape) or expand_latent(*a))
    return calls


def _cache_bytes(layer) -> int:
    return sum(t.numel() * t.element_size() for t in vars(layer).values() if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("name,attn,dynamic", [("DeepseekV32ForCausalLM", "sdpa", None),
                                               ("GlmMoeDsaForCausalLM", "eager", True)])
def test_logits_equal_transformers_cache_and_the_compiled_model_never_expands_the_latent(name, attn, dynamic,
                                                                                          expansions):
    model = dsa_model(name, attn)
    kw = cache_keyword(type(model))
    ids = _ids(1, STEPS[-1][1], seed=2)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa", options={"downstream": "eager", "stock_below": 0},
                             dynamic=dynamic)
    theirs, uncompiled, ours = DynamicCache(config=model.config), latent_cache(model), latent_cache(compiled)
    with collecting() as report, torch.no_grad():
        for start, stop in STEPS:
            want = model(ids[:, start:stop], use_cache=True, **{kw: theirs}).logits
            plain = model(ids[:, start:stop], use_cache=True, **{kw: uncompiled}).logits
            torch.testing.assert_close(plain, want, rtol=0, atol=ATOL)
            read = len(expansions)
            got = compiled(ids[:, start:stop], use_cache=True, **{kw: ours}).logits
            torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
            assert len(expansions) == read  # the absorbed op read the latent rows as they are
    # transformers 5.17 hands the cache expanded rows and reads the expansion back, newer releases
    # hand it the latent and expand it themselves
    assert bool(expansions) == caches_expanded_rows(model)
    assert {r.path for r in report.rewrites if r.kind == "sparse_attention"} == {"auto", "absorbed"}
    assert not report.near_misses
    for cache in (uncompiled, ours):
        assert all(isinstance(layer, LatentLayer) for layer in cache.layers) and cache.get_seq_length() == STEPS[-1][1]
        latent = cache.layers[0]
        assert latent.keys.shape == (1, 1, STEPS[-1][1], model.config.kv_lora_rank)
        assert latent.values.shape == (1, 1, STEPS[-1][1], model.config.qk_rope_head_dim)
        torch.testing.assert_close(latent.keys, ours.layers[0].keys, rtol=0, atol=1e-5)
    # the hooks that hand a call's latent to the cache keep nothing after it
    attention = model.model.layers[0].self_attn
    assert pending_latent(attention).latent is None


def test_memory_per_token_is_the_latent_the_rope_key_and_the_indexer_key():
    from transformers import DeepseekV32Config

    model = dsa_model("DeepseekV32ForCausalLM", "sdpa")
    batch, tokens = 2, 24
    cache = latent_cache(model)
    fp8 = latent_cache(model, indexer_precision="fp8")
    with torch.no_grad():
        for c in (cache, fp8):
            model(_ids(batch, tokens), use_cache=True, **{cache_keyword(type(model)): c})
    config = model.config
    assert bytes_per_token(config, torch.float32) == 4 * (config.kv_lora_rank + config.qk_rope_head_dim
                                                          + config.index_head_dim)
    for layer in cache.layers:
        assert _cache_bytes(layer) == batch * tokens * bytes_per_token(config, torch.float32)
    for layer in fp8.layers:
        assert isinstance(layer, LatentFp8Layer) and layer.indexer_keys.dtype == torch.float8_e4m3fn
        assert _cache_bytes(layer) == batch * tokens * bytes_per_token(config, torch.float32,
                                                                        indexer_precision="fp8")
    if caches_expanded_rows(model):  # transformers' own cache holds what ``expanded`` counts
        theirs = DynamicCache(config=config)
        with torch.no_grad():
            model(_ids(batch, tokens), use_cache=True, **{cache_keyword(type(model)): theirs})
        assert _cache_bytes(theirs.layers[0]) == batch * tokens * bytes_per_token(config, torch.float32,
                                                                                  expanded=True)
    v32 = DeepseekV32Config(num_hidden_layers=1, **V32_SIZES)
    assert bytes_per_token(v32) == 1408 and bytes_per_token(v32, expanded=True) == 82176  # the module docstring's


def test_cropping_batch_repetition_and_beam_reordering_act_on_the_latent_rows():
    model = dsa_model("DeepseekV32ForCausalLM", "sdpa")
    cache = latent_cache(model)
    with torch.no_grad():
        model(_ids(2, 30), use_cache=True, **{cache_keyword(type(model)): cache})
    layer = cache.layers[0]
    kept = layer.keys[..., :25, :].clone(), layer.indexer_keys[:, :25].clone()
    cache.crop(-5)
    assert cache.get_seq_length() == 25 and torch.equal(layer.keys, kept[0]) and torch.equal(layer.indexer_keys, kept[1])
    cache.batch_repeat_interleave(2)
    cache.reorder_cache(torch.tensor([3, 2, 1, 0]))
    assert torch.equal(layer.keys, kept[0].repeat_interleave(2, 0).flip(0)) and layer.values.shape == (4, 1, 25, 8)
    with pytest.raises(NotImplementedError, match="crop"):
        latent_cache(model, indexer_precision="fp8").crop(-1)


def test_with_fp8_indexer_keys_both_ops_read_the_cache_as_stored():
    """``latent_cache(model, "fp8")`` under ``indexer_precision="fp8"``: the indexer op takes the E4M3
    keys (as over ``fp8_indexer_cache``), the attention the latent; the logits are those over the FP8
    indexer cache of transformers' main cache."""
    from compiler.fp8_indexer_cache import fp8_indexer_cache

    model = dsa_model("DeepseekV32ForCausalLM", "sdpa")
    kw = cache_keyword(type(model))
    ids = _ids(1, 41, seed=4)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa",
                             options={"downstream": "eager", "stock_below": 0, "indexer_precision": "fp8"})
    ours, theirs = latent_cache(model, indexer_precision="fp8"), fp8_indexer_cache(model.config)
    with collecting() as report, torch.no_grad():
        for start, stop in ((0, 40), (40, 41)):
            want = compiled(ids[:, start:stop], use_cache=True, **{kw: theirs}).logits
            report.rewrites.clear()
            got = compiled(ids[:, start:stop], use_cache=True, **{kw: ours}).logits
            torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
            assert {r.details["fp8_key_cache"] for r in report.rewrites if r.kind == "dsa_indexer"} == {True}
            assert {r.path for r in report.rewrites if r.kind == "sparse_attention"} <= {"auto", "absorbed"}
            assert report.rewrites


def test_generate_on_a_latent_cache_gives_the_tokens_of_transformers_cache():
    model = dsa_model("DeepseekV32ForCausalLM", "sdpa")
    prompt = _ids(1, 30, seed=3)
    with torch.no_grad():
        want = model.generate(prompt, max_new_tokens=6, do_sample=False)
        cache = latent_cache(model)
        got = model.generate(prompt, max_new_tokens=6, do_sample=False, **{cache_keyword(type(model)): cache})
    assert torch.equal(got, want) and cache.get_seq_length() == 35


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="MLA attention"):
        latent_cache(LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                                  num_attention_heads=2, num_key_value_heads=2, vocab_size=64)))
    latent, rope, weight = torch.randn(1, 5, 16), torch.randn(1, 5, 8), torch.randn(4 * (16 + 16), 16)
    k, v = torch.ops.pulsar_dosa.latent_cached_kv(latent, rope, weight, 4, 16)
    assert k.shape == (1, 4, 5, 24) and v.shape == (1, 4, 5, 16)
    with pytest.raises(ValueError, match="rope_key"):
        torch.ops.pulsar_dosa.latent_cached_kv(latent, rope[:, :4], weight, 4, 16)
    with pytest.raises(ValueError, match="kv_b_weight"):
        torch.ops.pulsar_dosa.latent_cached_kv(latent, rope, weight[:, :8], 4, 16)
    with pytest.raises(ValueError, match="kv_b_weight"):
        torch.ops.pulsar_dosa.latent_cached_kv(latent, rope, weight, 4, 32)
    torch.library.opcheck(torch.ops.pulsar_dosa.latent_cached_kv.default, (latent, rope, weight, 4, 16))
