"""The sparse_attention pass on transformers' DSA models (tiny, random init, fp32): every layer's
``indices -> index mask -> attention`` chain becomes ``pulsar_dosa.sparse_attention`` or, in MLA's
absorbed form, ``pulsar_dosa.absorbed_sparse_attention`` (one report entry per layer) and the logits stay within 1e-4 of the uncompiled model, for the sdpa and eager
implementations, with left padding (rows that see no key), a cache (prefill, chunked prefill,
decode), dynamic shapes, either pass order, GLM's shared-indexer layers; chains the op cannot
reproduce are reported near misses and left untouched."""
import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

import compiler
from compiler.backend import pulsar_dosa
from scripts.demo import build_model, tiny_config
from compiler.latent_cache import latent_cache
from compiler.report import collecting
from runtime.pulsar import cache_keyword

ATOL = 1e-4
EAGER = {"downstream": "eager", "stock_below": 0}
ABSORBED_OP = torch.ops.pulsar_dosa.absorbed_sparse_attention.default


def _ids(b, n, seed=0):
    return torch.randint(0, 128, (b, n), generator=torch.Generator().manual_seed(seed))


def _attention_layers(model):
    return sorted(name for name, mod in model.named_modules() if name.endswith("self_attn"))


def _sparse(report):
    return [r for r in report.rewrites if r.kind == "sparse_attention"]


def dsa_model(name, attn, layers=2):
    """A tiny fp32 DSA model: DeepseekV32, or GlmMoeDsa of the same sizes (its second layer shares the
    first one's selection)."""
    if name == "DeepseekV32ForCausalLM":
        return build_model(tiny_config(layers=layers, attn=attn, dense_layers=layers), torch.float32)
    import dataclasses

    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    fields = {f.name for f in dataclasses.fields(GlmMoeDsaConfig)} - {"layer_types", "mlp_layer_types"}
    sizes = {k: v for k, v in tiny_config(layers=layers, attn=attn, dense_layers=layers).to_dict().items()
             if k in fields}
    torch.manual_seed(0)
    config = GlmMoeDsaConfig(**{**sizes, "indexer_types": ["full", "shared"][:layers]})
    config._attn_implementation = attn
    return GlmMoeDsaForCausalLM(config).eval()


@pytest.mark.parametrize("name,attn,form,variant", [
    ("DeepseekV32ForCausalLM", "sdpa", "union", "sdpa+bool_mask"),
    ("DeepseekV32ForCausalLM", "eager", "union", "eager+additive_mask"),
    ("DeepseekV32ForCausalLM", "sdpa", "absorbed", "sdpa+bool_mask+absorbed"),
    ("DeepseekV32ForCausalLM", "eager", "absorbed", "eager+additive_mask+absorbed"),
    ("GlmMoeDsaForCausalLM", "sdpa", "absorbed", "sdpa+bool_mask+absorbed"),
    ("GlmMoeDsaForCausalLM", "eager", "absorbed", "eager+additive_mask+absorbed"),
])
def test_padded_batch_every_layer_rewritten_and_logits_match_eager(name, attn, form, variant):
    model = dsa_model(name, attn)
    assert model.config._attn_implementation == attn
    ids, pad = _ids(2, 40), torch.ones(2, 40, dtype=torch.long)
    pad[1, :5] = 0  # left padding: five query rows see no key
    with torch.no_grad():
        want = model(ids, attention_mask=pad, use_cache=False).logits
    graphs = []

    def backend(gm, example_inputs):
        compiled = pulsar_dosa(gm, example_inputs, options={**EAGER, "sparse_form": form})
        graphs.append(gm)
        return compiled

    torch._dynamo.reset()
    with collecting() as report, torch.no_grad():
        got = torch.compile(model, backend=backend)(ids, attention_mask=pad, use_cache=False).logits
    assert [r.module for r in _sparse(report)] == _attention_layers(model)
    assert {(r.variant, r.path, r.details["distinct_indices"]) for r in _sparse(report)} == {(variant, form, True)}
    assert {r.details["masked_rows"] for r in _sparse(report)} == {"zero" if attn == "sdpa" else "mean"}
    assert not report.near_misses
    # The [B,S,T] index masks and the dense attention are gone from the graph; in the absorbed form the
    # key/value expansion too: kv_b_proj's weight is read by the absorbed op only.
    targets = [n.target for g in graphs for n in g.graph.nodes]
    assert not {"scatter", "softmax", F.scaled_dot_product_attention, torch.softmax, F.softmax} & set(targets)
    if form == "absorbed":
        assert not {"new_empty", "copy_", torch._C._nn.scaled_dot_product_attention} & set(targets)
        weights = [n for g in graphs for n in g.graph.nodes if n.op == "placeholder" and "kv_b_proj" in n.name]
        assert weights and all([u.target for u in w.users] == [ABSORBED_OP] for w in weights)
        sites = [n.args[-1] for g in graphs for n in g.graph.nodes if n.target == ABSORBED_OP]
        assert sites == _attention_layers(model)  # an "auto" call's measurements are kept per attention module
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("attn,dynamic,form,steps", [("sdpa", False, "absorbed", ((0, 40), (40, 48), (48, 49), (49, 50))),
                                                     ("eager", True, "auto", ((0, 40), (40, 41), (41, 42)))])
def test_prefill_chunked_prefill_and_decode_with_a_cache(attn, dynamic, form, steps):
    """Forced absorbed: every call. "auto": the prefill takes the absorbed op choosing its form per
    call, decode (one query per row) the absorbed form, which reads the latent cache unexpanded
    (``compiler.latent_cache``: a latent in every transformers version; transformers' own cache in
    each version: tests/passes/test_cache_path.py)."""
    model = build_model(tiny_config(layers=1, attn=attn, dense_layers=1), torch.float32)
    ids = _ids(1, 50, seed=1)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa", options={**EAGER, "sparse_form": form}, dynamic=dynamic)
    ours, theirs = latent_cache(model), DynamicCache(config=model.config)
    kw = cache_keyword(type(model))
    with collecting() as report, torch.no_grad():
        for start, stop in steps:
            want = model(ids[:, start:stop], use_cache=True, **{kw: theirs}).logits
            got = compiled(ids[:, start:stop], use_cache=True, **{kw: ours}).logits
            torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
    assert len(_sparse(report)) == len(report.compiles) and not report.near_misses
    paths = [r.path for r in _sparse(report)]
    assert set(paths) == {"absorbed"} if form == "absorbed" else (paths[0], paths[-1]) == ("auto", "absorbed")
    decode = [r for r in _sparse(report) if r.shapes["q"][2] == "1"]
    assert decode and all(r.path == "absorbed" and r.shapes["latent"][2] != "1" for r in decode)
    if form == "auto":
        assert "no neighbours share keys" in decode[-1].details["form_reason"]


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


@pytest.mark.parametrize("passes", [["dsa_indexer", "attention"], ["attention"]])
def test_a_dsa_selections_attention_is_never_the_pulsar_attention_op(passes):
    """Without the sparse-attention pass (or where it keeps the stock form) the attention that reads a
    DSA selection stays as the model wrote it, whether the indexer was rewritten or not: Pulsar
    layouts do not run DSA models, and the op would only add its per-call cost."""
    model = build_model(tiny_config(layers=1, dense_layers=1), torch.float32)
    report = compiler.explain(model, _ids(1, 24), use_cache=False, options={**EAGER, "passes": passes})
    assert not _sparse(report)
    assert not [r for r in report.rewrites if r.kind == "attention"]
    assert not [m for m in report.near_misses if m.kind == "attention"]


def test_a_decode_step_kept_stock_adds_no_attention_op():
    """Keys and values of one width (as the trained tiny-dsa's), so that the Pulsar attention pass
    would otherwise take the stock decode attention."""
    from transformers import DynamicCache

    config = tiny_config(layers=2, dense_layers=2)
    config.v_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
    model = build_model(config, torch.float32)
    ids = _ids(1, 40, seed=3)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        step = model(ids, past_key_values=cache).logits[:, -1:].argmax(-1)
    report = compiler.explain(model, step, past_key_values=cache, options={"downstream": "eager", "stock_below": 1 << 40})
    assert [m.kind for m in report.near_misses].count("sparse_attention") == 2  # kept stock
    assert not report.rewrites


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


def dsa_sdpa_float64(q, k, v, indices, mask):
    return dsa_sdpa_keywords(q.double(), k.double(), v.double(), indices, mask)


def plain_masked_sdpa(q, k, v, indices, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("fn,reason", [
    (dsa_sdpa_keywords, None),
    (dsa_dropout, "dropout_p=0.1 may be active"),
    (dsa_unknown_additive_mask, "not where(bool, 0, finfo.min)"),
    (dsa_eager_weights_returned, "used outside the attention chain"),
    (dsa_sdpa_float64, "torch.float64: the op computes bfloat16, float16 or float32"),
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
    # Ten queries per row: the absorbed form would run, but k and v are inputs, not a latent's expansion.
    absorbed = [m for m in misses if m.startswith("absorbed form not taken")]
    misses = [m for m in misses if m not in absorbed]
    if reason is None:
        assert len(_sparse(report)) == 1 and not misses and _sparse(report)[0].path == "union"
        assert absorbed == ["absorbed form not taken: the value is not the last-dim part of an expanded projection "
                            "(split or slice)"]
    elif reason == "not a candidate":
        assert not _sparse(report) and not misses and report.counters["sparse_attention.not_candidate"] >= 1
    else:
        assert not _sparse(report) and len(misses) == 1 and reason in misses[0]


def test_a_compiled_dsa_model_is_refused_by_runtime_pulsar_with_the_reason():
    from runtime.pulsar import PulsarConfig, generate

    model = build_model(tiny_config(layers=1, dense_layers=1), torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa", options=EAGER)
    with pytest.raises(ValueError, match="has DSA indexers .* does not follow Pulsar layouts"):
        generate(compiled, _ids(1, 48)[0], _ids(1, 4)[0], PulsarConfig(block_size=16, sink=4, chunk=4),
                 max_new_tokens=1)


def _operand_nodes(t_of):
    """fx nodes of a DSA attention's operands whose example values have key lengths ``t_of[name]``: an
    int, or a name: each name its own symbol (Dynamo without duck sizing, as after a recompilation)."""
    from types import SimpleNamespace

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv(duck_shape=False))
    shapes = {"q": (1, 2, 10, 24), "k": (1, 2, None, 24), "v": (1, 2, None, 16), "indices": (1, 10, 4),
              "ones": (1, 10, None), "mask": (1, 1, 10, None), "out": (1, 2, 10, 16)}
    graph, nodes = torch.fx.Graph(), {}
    for name, shape in shapes.items():
        t = t_of.get(name, 12)
        length = 12 if isinstance(t, str) else t
        real = torch.zeros([length if d is None else d for d in shape],
                           dtype={"indices": torch.int64, "ones": torch.bool, "mask": torch.bool}.get(name))
        dims = [DimDynamic.DYNAMIC if d is None and isinstance(t, str) else DimDynamic.STATIC for d in shape]
        with mode:
            fake = mode.from_tensor(real, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims))
        nodes[name] = graph.placeholder(name)
        nodes[name].meta["val"] = fake
    att = SimpleNamespace(q=nodes["q"], k=nodes["k"], v=nodes["v"], scale=0.3)
    return att, SimpleNamespace(indices=nodes["indices"], nodes=[None, None, nodes["ones"]]), nodes["mask"], nodes["out"]


def test_key_lengths_of_separate_symbols_match_and_provably_different_ones_do_not():
    """After a recompilation Dynamo can name k's, v's and the masks' key lengths apart; the graph
    contracts and broadcasts them against each other, so they are equal whenever it runs (the op
    checks them again)."""
    from compiler.passes.matcher import NearMiss
    from compiler.passes.dsa_sparse_attention import check_operands

    check_operands(*_operand_nodes({"k": "t_k", "v": "t_v", "ones": "t_i", "mask": "t_m"}))
    for name in ("v", "ones", "mask"):
        with pytest.raises(NearMiss):
            check_operands(*_operand_nodes({name: 13}))
