"""The sparse-attention pass on the cache path, as ``generate`` calls a model (``use_cache=True``):
a prefill, a chunk of prefill and decode steps over one cache, both DSA models, sdpa and eager
attention, in the transformers version installed (CI runs tests/passes under the newest release
and again under the declared minimum, 5.17: scripts/test.sh).

transformers' own cache keeps the latent in newer releases: every call takes the absorbed form. In
5.17 it keeps the expanded keys and values: the prefill (an empty cache) takes the absorbed form,
and a call over cached rows has no latent to read, the near miss ``CACHED_EXPANSION``. A latent
cache (``compiler.latent_cache``) gives every call the absorbed form in every version. The logits
stay within 1e-4 of the uncompiled model over transformers' cache."""
import pytest
import torch
from transformers import DynamicCache

from compiler.latent_cache import latent_cache
from compiler.passes.matcher import CACHED_EXPANSION
from compiler.report import collecting
from runtime.pulsar import cache_keyword
from tests.passes.test_dsa_sparse_attention import ATOL, _ids, dsa_model

STEPS = ((0, 40), (40, 48), (48, 49), (49, 50))
"""A prefill, a chunk of 8 tokens and two decode steps."""
EVERY_CALL = {"downstream": "eager", "stock_below": 0}


def caches_expanded_rows(model) -> bool:
    """Whether the installed transformers' cache keeps a DSA layer's expanded keys (5.17) rather
    than its latent."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(_ids(1, 2), use_cache=True, **{cache_keyword(type(model)): cache})
    return cache.layers[0].keys.shape[1] != 1


def run_steps(model, cache_kind: str, options=EVERY_CALL):
    """The report of the compiled model over ``STEPS`` on a cache of ``cache_kind`` ("transformers"
    or "latent"), each step's logits checked against the uncompiled model over transformers' cache."""
    kw = cache_keyword(type(model))
    ids = _ids(1, STEPS[-1][1], seed=1)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa", options=options)
    ours = latent_cache(model) if cache_kind == "latent" else DynamicCache(config=model.config)
    theirs = DynamicCache(config=model.config)
    with collecting() as report, torch.no_grad():
        for start, stop in STEPS:
            want = model(ids[:, start:stop], use_cache=True, **{kw: theirs}).logits
            got = compiled(ids[:, start:stop], use_cache=True, **{kw: ours}).logits
            torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
    return report


@pytest.mark.parametrize("name,attn,cache_kind", [
    ("DeepseekV32ForCausalLM", "sdpa", "transformers"),
    ("DeepseekV32ForCausalLM", "eager", "transformers"),
    ("GlmMoeDsaForCausalLM", "sdpa", "transformers"),
    ("GlmMoeDsaForCausalLM", "eager", "latent"),
    ("DeepseekV32ForCausalLM", "sdpa", "latent"),
])
def test_every_call_over_a_cache_of_the_latent_takes_the_absorbed_form(name, attn, cache_kind):
    model = dsa_model(name, attn)
    expanded = cache_kind == "transformers" and caches_expanded_rows(model)
    report = run_steps(model, cache_kind)
    sparse = [r for r in report.rewrites if r.kind == "sparse_attention"]
    layers = 2
    assert len(sparse) == layers * len(report.compiles) >= 3 * layers  # prefill, chunk, decode
    prefill = [r for r in sparse if r.compile_index == 0]
    cached = [r for r in sparse if r.compile_index > 0]
    assert {r.path for r in prefill} == {"auto"}  # absorbed op, form chosen per call
    if expanded:
        assert {r.path for r in cached} == {"union"}
        assert {m.reason for m in report.near_misses} == {f"absorbed form not taken: {CACHED_EXPANSION}"}
        assert len(report.near_misses) == len(cached)
    else:
        assert {r.path for r in cached} == {"auto", "absorbed"} and not report.near_misses
        decode = [r for r in cached if r.shapes["q"][2] == "1"]
        assert decode and {r.path for r in decode} == {"absorbed"}
