"""transformers DeepseekV32ForCausalLM (tiny, random init) compiled with backend="pulsar_dosa".

Every indexer layer is rewritten exactly once and the logits equal eager's bitwise: the downstream
is "eager" and only the indexer family runs (``INDEXER_ONLY``; the sparse attention rewrite
computes attention in fp32, equal to eager's to rounding only), so every other op runs as in the
eager model, and the indexer selections coincide (the chosen configuration has no exact tie at the kk-th score; a tie would make torch.topk's arbitrary
order and the op's lower-index order pick different, equally valid keys). The inductor case compares
within a tolerance: inductor's fused kernels reassociate the fp32 reductions of the rest of the graph
(norms, softmax, MoE), a ~1e-6 relative effect, while one differently selected key moves logits by
~1e-2. Rows of the selection check are per layer on the eager inputs (scripts/demo.py).
"""
import pytest
import torch

import compiler
from compiler.cost_model import default_min_keys
from scripts.demo import (DEMO_INDEXER, build_model, eager_run, indexers, per_layer_selection, set_trained_geometry,
                           tiny_config, topic_run_ids)
from tests.passes.test_dsa_indexer import rewritten_graph

SEQ = 64
INDEXER_ONLY = {"downstream": "eager", "stock_below": 0, "passes": ["dsa_indexer"]}

MATRIX = [  # (attention, dtype, use_cache, dynamic): each value of each axis appears twice
    ("sdpa", torch.float32, False, False),
    ("sdpa", torch.bfloat16, True, True),
    ("eager", torch.float32, True, False),
    ("eager", torch.bfloat16, False, True),
]


def _ids(n, seed=0):
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attn,dtype,use_cache,dynamic", MATRIX)
def test_each_indexer_rewritten_once_and_logits_equal_eager(attn, dtype, use_cache, dynamic):
    model = build_model(tiny_config(layers=2, attn=attn), dtype)
    ids = _ids(SEQ)
    with torch.no_grad():
        want = model(ids, use_cache=use_cache).logits
    report = compiler.explain(model, ids, options=INDEXER_ONLY, dynamic=dynamic, use_cache=use_cache)
    assert sorted(r.module for r in report.rewrites) == sorted(indexers(model))
    assert {r.kind for r in report.rewrites} == {"dsa_indexer"}
    assert torch.equal(report.output.logits, want)
    if dynamic:
        longer = _ids(SEQ + 16, seed=2)
        with torch.no_grad():
            got, want = report.compiled(longer, use_cache=use_cache).logits, model(longer, use_cache=use_cache).logits
        assert torch.equal(got, want)
        assert len(report.compiles) == 1


def test_bf16_indexer_operands_reach_the_op_in_bf16_under_dynamic_shapes():
    """Under dynamic=True Dynamo traces the indexer's softmax_scale as a scalar input of unknown sign:
    the op still gets q and k in bf16 (bf16 tensor cores on CUDA), not their fp32 upcasts."""
    model = build_model(tiny_config(layers=1), torch.bfloat16)
    with torch.no_grad():
        _, op, _ = rewritten_graph(model, _ids(SEQ), options=INDEXER_ONLY, dynamic=True, use_cache=False)
    assert [a.meta["example_value"].dtype for a in op.args[:2]] == [torch.bfloat16, torch.bfloat16]


def test_selection_equals_eager_per_layer():
    model = build_model(tiny_config(layers=2), torch.float32)
    run = eager_run(model, _ids(SEQ))
    selection = per_layer_selection(model, run, {"downstream": "eager", "stock_below": 0})
    assert set(selection) == set(indexers(model))
    for counts in selection.values():
        assert counts == {"equal": SEQ, "tie": 0, "differ": 0}


def test_inductor_downstream_logits_match_eager():
    model = build_model(tiny_config(layers=2, dense_layers=2), torch.float32)
    ids = _ids(SEQ)
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
    report = compiler.explain(model, ids, use_cache=False, options={"stock_below": 0})
    # the layers share one mask, built by the dsa_mask rewrite
    assert sorted(r.kind for r in report.rewrites) == ["dsa_indexer"] * 2 + ["dsa_mask"] + ["sparse_attention"] * 2
    torch.testing.assert_close(report.output.logits, want, rtol=1e-4, atol=1e-4)
    assert set(report.stats) == set(indexers(model))
    assert all(s["queries"] == SEQ for s in report.stats.values())


def test_with_a_trained_geometry_the_certificate_prunes_inside_the_model():
    """The demo's model: queries past the cost model's crossover (~770 keys) take the certified path and most of
    the keys they screen are pruned; selections and logits stay those of eager."""
    model = set_trained_geometry(build_model(tiny_config(layers=1, **DEMO_INDEXER), torch.float32))
    ids = topic_run_ids(840, model.config.vocab_size)
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
    report = compiler.explain(model, ids, options={"downstream": "eager", "stock_below": 0, "passes": ["dsa_indexer"]}, use_cache=False)
    (stats,) = report.stats.values()
    crossover = default_min_keys(DEMO_INDEXER["heads"], DEMO_INDEXER["head_dim"], DEMO_INDEXER["topk"], None, "cpu")
    assert [r.details["min_keys"] for r in report.rewrites if r.kind == "dsa_indexer"] == [crossover]
    assert crossover < 840
    assert stats["keys_screened"] > 10 * 840 and stats["pruned_frac"] > 0.9
    assert torch.equal(report.output.logits, want)
