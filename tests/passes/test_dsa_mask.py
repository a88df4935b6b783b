"""The DSA mask pass (compiler/passes/dsa_mask.py): transformers' masks read only by DSA ops become
one conjunctive_mask op with the same bits; masks read elsewhere, or not an AND of row-vs-column
comparisons, stay as they are."""
import pytest
import torch

import compiler
from scripts.demo import build_model, tiny_config
from tests.passes.test_dsa_sparse_attention import dsa_model

ALL = {"downstream": "eager", "stock_below": 0}
WITHOUT_MASK_PASS = {**ALL, "passes": ["dsa_indexer", "sparse_attention"]}


def _masks(report):
    return [r for r in report.rewrites if r.kind == "dsa_mask"]


@pytest.mark.parametrize("padded,dynamic,use_cache", [(False, False, False), (True, True, False), (True, False, True)])
def test_deepseek_v32_mask_is_rewritten_and_logits_are_bitwise_the_same(padded, dynamic, use_cache):
    """Causal + packed-sequence ids (no attention_mask) or causal + padding: the graph's mask and the
    op's are the same bits, so every later op computes the same values."""
    model = build_model(tiny_config(layers=2), torch.float32)
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(1))
    kwargs = {"use_cache": use_cache}
    if padded:
        kwargs["attention_mask"] = torch.ones(2, 48, dtype=torch.long)
        kwargs["attention_mask"][1, :7] = 0
    with torch.no_grad():
        got = compiler.explain(model, ids, options=ALL, dynamic=dynamic, **kwargs)
        want = compiler.explain(model, ids, options=WITHOUT_MASK_PASS, dynamic=dynamic, **kwargs)
    (rewrite,) = _masks(got)
    assert ("col" in rewrite.variant) == padded
    assert not _masks(want)
    assert torch.equal(got.output.logits, want.output.logits)


def test_glm_moe_dsa_mask_is_rewritten():
    model = dsa_model("GlmMoeDsaForCausalLM", "sdpa")
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = compiler.explain(model, ids, options=ALL, use_cache=False)
        want = compiler.explain(model, ids, options=WITHOUT_MASK_PASS, use_cache=False)
    assert len(_masks(got)) == 1
    assert torch.equal(got.output.logits, want.output.logits)


class OwnMask(torch.nn.Module):
    """The indexer op reading a mask built in the graph (``form``), optionally read by a sum too."""

    def __init__(self, form, also_summed=False):
        super().__init__()
        self.form, self.also_summed = form, also_summed

    def forward(self, q, k, w, pos):
        rows, cols = pos[:, :, None], pos[:, None, :]
        if self.form == "causal":
            mask = cols <= rows
        elif self.form == "or":
            mask = (cols <= rows) | (cols == 0)
        else:  # float positions
            mask = cols.float() <= rows.float()
        mask = mask & (rows >= 0)
        values, indices = torch.ops.pulsar_dosa.certified_topk(q, k, w, 4, mask)
        return (values, indices, mask.sum()) if self.also_summed else (values, indices)


def _run(module):
    g = torch.Generator().manual_seed(0)
    q, k, w = torch.randn(1, 16, 2, 8, generator=g), torch.randn(1, 16, 8, generator=g), torch.rand(1, 16, 2, generator=g)
    pos = torch.arange(16).view(1, 16)
    torch._dynamo.reset()
    report = compiler.explain(module, q, k, w, pos, options=ALL)
    return report, module(q, k, w, pos)


def test_own_causal_mask_is_rewritten_with_the_same_result():
    report, want = _run(OwnMask("causal"))
    assert [r.variant for r in _masks(report)] == ["ge+row"]
    assert all(torch.equal(a, b) for a, b in zip(report.output, want))


@pytest.mark.parametrize("form,reason", [("or", "neither an AND"), ("float", "float32")])
def test_other_forms_are_near_misses(form, reason):
    report, want = _run(OwnMask(form))
    assert not _masks(report)
    assert any(m.kind == "dsa_mask" and reason in m.reason for m in report.near_misses)
    assert all(torch.equal(a, b) for a, b in zip(report.output, want))


def test_a_mask_read_by_another_op_stays_in_the_graph():
    report, want = _run(OwnMask("causal", also_summed=True))
    assert not _masks(report) and not [m for m in report.near_misses if m.kind == "dsa_mask"]
    assert all(torch.equal(a, b) for a, b in zip(report.output, want))
