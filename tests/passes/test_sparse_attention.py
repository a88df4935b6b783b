"""The sparse_attention pass on transformers' DSA models (tiny, random init, fp32): every layer's
``indices -> index mask -> attention`` chain becomes ``pulsar_dosa.sparse_attention`` (one report
entry per layer) and the logits stay within 1e-4 of the uncompiled model, for the sdpa and eager
implementations, with left padding (rows that see no key), a cache (prefill, chunked prefill,
decode), dynamic shapes, either pass order, GLM's shared-indexer layers; chains the op cannot
reproduce are reported near misses and left untouched."""
import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

import compiler
from compiler.backend import pulsar_dosa
from compiler.demo import build_model, tiny_config
from compiler.report import collecting

ATOL = 1e-4
EAGER = {"downstream": "eager", "stock_below": 0}


def _ids(b, n, seed=0):
    return torch.randint(0, 128, (b, n), generator=torch.Generator().manual_seed(seed))


def _attention_layers(model):
    return sorted(name for name, mod in model.named_modules() if name.endswith("self_attn"))


def _sparse(report):
    return [r for r in report.rewrites if r.kind == "sparse_attention"]


@pytest.mark.parametrize("attn,variant", [("sdpa", "sdpa+bool_mask"), ("eager", "eager+additive_mask")])
def test_padded_batch_every_layer_rewritten_and_logits_match_eager(attn, variant):
    model = build_model(tiny_config(layers=2, attn=attn, dense_layers=2), torch.float32)
    ids, pad = _ids(2, 40), torch.ones(2, 40, dtype=torch.long)
    pad[1, :5] = 0  # left padding: five query rows see no key
    with torch.no_grad():
        want = model(ids, attention_mask=pad, use_cache=False).logits
    graphs = []

    def backend(gm, example_inputs):
        compiled = pulsar_dosa(gm, example_inputs, options=EAGER)
        graphs.append(gm)
        return compiled

    torch._dynamo.reset()
    with collecting() as report, torch.no_grad():
        got = torch.compile(model, backend=backend)(ids, attention_mask=pad, use_cache=False).logits
    assert [r.module for r in _sparse(report)] == _attention_layers(model)
    assert {r.variant for r in _sparse(report)} == {variant}
    assert {r.details["masked_rows"] for r in _sparse(report)} == {"zero" if attn == "sdpa" else "mean"}
    assert not report.near_misses
    # The [B,S,T] index masks and the dense attention are gone from the graph.
    targets = [n.target for g in graphs for n in g.graph.nodes]
    assert not {"scatter", "softmax", F.scaled_dot_product_attention, torch.softmax, F.softmax} & set(targets)
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("attn,dynamic,steps", [("sdpa", False, ((0, 40), (40, 48), (48, 49))),
                                                ("eager", True, ((0, 40), (40, 41)))])
def test_prefill_chunked_prefill_and_decode_with_a_cache(attn, dynamic, steps):
    model = build_model(tiny_config(layers=1, attn=attn, dense_layers=1), torch.float32)
    ids = _ids(1, 50, seed=1)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa", options=EAGER, dynamic=dynamic)
    ours, theirs = DynamicCache(config=model.config), DynamicCache(config=model.config)
    with collecting() as report, torch.no_grad():
        for start, stop in steps:
            want = model(ids[:, start:stop], cache=theirs, use_cache=True).logits
            got = compiled(ids[:, start:stop], cache=ours, use_cache=True).logits
            torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
    assert len(_sparse(report)) == len(report.compiles) and not report.near_misses


@pytest.mark.parametrize("passes", [["sparse_attention"], ["attention", "sparse_attention", "dsa_indexer"]])
def test_with_or_without_the_indexer_rewrite(passes):
    model = build_model(tiny_config(layers=1, dense_layers=1), torch.float32)
    ids = _ids(1, 40, seed=2)
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
    report = compiler.explain(model, ids, use_cache=False, options={**EAGER, "passes": passes})
    assert len(_sparse(report)) == 1
    assert sum(r.kind == "dsa_indexer" for r in report.rewrites) == (1 if "dsa_indexer" in passes else 0)
    torch.testing.assert_close(report.output.logits, want, rtol=0, atol=ATOL)


def test_without_the_pass_mla_attention_stays_a_pulsar_near_miss():
    model = build_model(tiny_config(layers=1, dense_layers=1), torch.float32)
    report = compiler.explain(model, _ids(1, 24), use_cache=False,
                              options={**EAGER, "passes": ["dsa_indexer", "attention"]})
    assert not _sparse(report)
    assert [m.kind for m in report.near_misses] == ["attention"]
    assert "different shapes" in report.near_misses[0].reason


def test_glm_shared_indexer_layers_reuse_the_previous_selection():
    import dataclasses

    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    fields = {f.name for f in dataclasses.fields(GlmMoeDsaConfig)} - {"layer_types", "mlp_layer_types"}
    sizes = {k: v for k, v in tiny_config(layers=3, dense_layers=3).to_dict().items() if k in fields}
    torch.manual_seed(0)
    model = GlmMoeDsaForCausalLM(GlmMoeDsaConfig(**{**sizes, "indexer_types": ["full", "shared", "full"]})).eval()
    ids = _ids(1, 40, seed=3)
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
    report = compiler.explain(model, ids, use_cache=False, options=EAGER)
    assert [r.module for r in _sparse(report)] == _attention_layers(model)
    assert sum(r.kind == "dsa_indexer" for r in report.rewrites) == 2
    torch.testing.assert_close(report.output.logits, want, rtol=0, atol=ATOL)


def _index_mask(indices, t):
    b, s, _ = indices.shape
    return indices.new_ones((b, s, t), dtype=torch.bool).scatter(-1, indices.long(), False).unsqueeze(1)


def dsa_sdpa_keywords(q, k, v, indices, mask):
    return F.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=mask & ~_index_mask(indices, k.shape[2]),
                                          dropout_p=0.0, scale=0.3)


def dsa_dropout(q, k, v, indices, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask & ~_index_mask(indices, k.shape[2]), dropout_p=0.1)


def dsa_unknown_additive_mask(q, k, v, indices, mask):
    additive = mask.float() * -5.0  # values other than 0 and finfo.min
    fill = additive.masked_fill(_index_mask(indices, k.shape[2]), torch.finfo(torch.float32).min)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=fill)


def dsa_eager_weights_returned(q, k, v, indices, mask):
    additive = torch.where(mask, torch.zeros(()), torch.finfo(torch.float32).min)
    additive = additive.masked_fill(_index_mask(indices, k.shape[2]), torch.finfo(torch.float32).min)
    weights = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * 0.3 + additive, dim=-1, dtype=torch.float32)
    return torch.matmul(weights, v), weights


def plain_masked_sdpa(q, k, v, indices, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("fn,reason", [
    (dsa_sdpa_keywords, None),
    (dsa_dropout, "dropout_p=0.1 may be active"),
    (dsa_unknown_additive_mask, "not where(bool, 0, finfo.min)"),
    (dsa_eager_weights_returned, "used outside the attention chain"),
    (plain_masked_sdpa, "not a candidate"),
])
def test_chains_the_op_cannot_reproduce_are_near_misses(fn, reason):
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(1, 2, 10, 24, generator=g), torch.randn(1, 2, 12, 24, generator=g), torch.randn(1, 2, 12, 16, generator=g)
    indices = torch.randint(0, 12, (1, 10, 4), generator=g, dtype=torch.int32)
    mask = (torch.arange(12)[None, :] <= torch.arange(2, 12)[:, None]).view(1, 1, 10, 12)
    torch._dynamo.reset()
    with collecting() as report:
        got = torch.compile(fn, backend="pulsar_dosa", options=EAGER)(q, k, v, indices, mask)
    if fn is not dsa_dropout:
        torch.testing.assert_close(got, fn(q, k, v, indices, mask), rtol=0, atol=1e-5)
    misses = [m.reason for m in report.near_misses if m.kind == "sparse_attention"]
    if reason is None:
        assert len(_sparse(report)) == 1 and not misses
    elif reason == "not a candidate":
        assert not _sparse(report) and not misses and report.counters["sparse_attention.not_candidate"] >= 1
    else:
        assert not _sparse(report) and len(misses) == 1 and reason in misses[0]


def test_a_dsa_model_under_runtime_pulsar_stops_with_the_reason():
    from runtime.pulsar import PulsarConfig, generate

    model = build_model(tiny_config(layers=1, dense_layers=1), torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa", options=EAGER)
    with pytest.raises(RuntimeError, match="does not follow Pulsar layouts"):
        generate(compiled, _ids(1, 48)[0], _ids(1, 4)[0], PulsarConfig(block_size=16, sink=4, chunk=4),
                 max_new_tokens=1)
