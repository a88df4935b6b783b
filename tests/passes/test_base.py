"""The pass contract (compiler/passes/base.py): one error policy for every family, counters, and the
import order of options and passes."""
import ast
import logging
from pathlib import Path

import pytest
import torch
import torch.fx as fx

import compiler
from compiler.options import CompileOptions
from compiler.options import PASS_FAMILIES
from compiler.passes import PASSES
from compiler.passes.base import NearMiss, PassContext, PatternPass, run_pattern_pass
from compiler.report import Report
from runtime.dense_scorer import dense_topk


def _graph():
    def f(x):
        return torch.relu(x).sin() + 1

    return fx.symbolic_trace(f)


def _run(family):
    gm = _graph()
    before = gm.code
    report = Report()
    run_pattern_pass(PassContext(gm, CompileOptions(), report), family)
    gm.graph.lint()
    gm.recompile()
    return gm, before, report


class _SinToCos(PatternPass):
    """A family of this test: every ``sin`` is an anchor, rewritten to ``cos`` unless ``fail`` says where it breaks."""

    kind = "sin_to_cos"

    def __init__(self, fail: str = ""):
        self.fail = fail

    def anchors(self, graph):
        if self.fail == "anchors":
            raise RuntimeError("cannot list anchors")
        return [n for n in graph.nodes if n.op == "call_method" and n.target == "sin"]

    def match(self, anchor, analysis):
        if self.fail == "match":
            return {}["missing"]  # an unexpected KeyError while matching
        if self.fail == "near_miss":
            raise NearMiss("sin of a relu is not wanted")
        return _Match(anchor)

    def rewrite(self, ctx, match, settings):
        graph = ctx.gm.graph
        with graph.inserting_before(match.anchor):
            node = graph.call_method("cos", (match.anchor.args[0],))
            if self.fail == "rewrite":
                graph.call_method("neg", (node,))
                raise ZeroDivisionError("broken replacement")
        return node

    def describe(self, match, settings, node):
        return dict(variant="cos", shapes={}, path="-")


class _Match:
    def __init__(self, anchor):
        self.anchor, self.interior, self.operand_nodes = anchor, [], []


def test_a_match_is_rewritten_counted_and_its_anchor_erased():
    gm, _, report = _run(_SinToCos())
    assert "cos" in gm.code and "sin" not in gm.code
    assert torch.equal(gm(torch.tensor([-1.0, 2.0])), torch.relu(torch.tensor([-1.0, 2.0])).cos() + 1)
    assert report.counters["sin_to_cos.anchors"] == 1 and report.counters["sin_to_cos.rewritten"] == 1
    assert [r.variant for r in report.rewrites] == ["cos"] and not report.near_misses


@pytest.mark.parametrize("fail, reason", [
    ("match", "unsupported form: KeyError: 'missing'"),
    ("rewrite", "rewrite failed: ZeroDivisionError: broken replacement"),
    ("anchors", "unsupported graph: RuntimeError: cannot list anchors"),
])
def test_an_unexpected_exception_is_a_near_miss_and_the_graph_is_untouched(fail, reason):
    gm, before, report = _run(_SinToCos(fail))
    assert gm.code == before
    assert [m.reason for m in report.near_misses] == [reason]
    assert report.counters["sin_to_cos.unsupported"] == 1 and report.counters["sin_to_cos.near_miss"] == 1
    assert not report.rewrites


def test_a_near_miss_keeps_its_reason_and_is_not_unsupported():
    gm, before, report = _run(_SinToCos("near_miss"))
    assert gm.code == before
    assert [(m.kind, m.reason, m.node) for m in report.near_misses] == [("sin_to_cos", "sin of a relu is not wanted", "sin")]
    assert report.counters["sin_to_cos.unsupported"] == 0


def test_every_family_follows_the_contract_and_is_named_in_the_options():
    assert all(isinstance(family, PatternPass) and family.kind == name for name, family in PASSES.items())
    assert set(PASSES) == set(PASS_FAMILIES)


class _Layer(torch.nn.Module):
    """An indexer-like top-K next to an SDPA call, a router top-K and a plain matmul."""

    def forward(self, q, k, w, x):
        scores = torch.matmul(w.unsqueeze(-2), torch.relu(torch.einsum("bshd,btd->bsht", q, k))).squeeze(-2)
        att = torch.nn.functional.scaled_dot_product_attention(query=x, key=x, value=x)
        router = torch.topk(x.sum(-1), 2, dim=-1).indices
        return scores.topk(3, dim=-1).indices, torch.matmul(att, x.transpose(-1, -2)), router


def test_counters_of_both_families_in_one_compile():
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 4, 2, 8, generator=g), torch.randn(1, 6, 8, generator=g),
            torch.randn(1, 4, 2, generator=g), torch.randn(1, 2, 5, 8, generator=g))
    report = compiler.explain(_Layer(), *args, options={"downstream": "eager", "stock_below": 0})
    c = report.counters
    assert (c["dsa_indexer.anchors"], c["dsa_indexer.rewritten"], c["dsa_indexer.not_candidate"]) == (2, 1, 1)
    assert (c["attention.anchors"], c["attention.rewritten"], c["attention.not_candidate"]) == (2, 1, 1)
    assert c["dsa_indexer.near_miss"] == c["attention.near_miss"] == 0
    indices, att, router = report.output
    assert torch.equal(indices, dense_topk(*args[:3], 3)[1])  # the op orders ties by the lower key index
    _, want_att, want_router = _Layer()(*args)
    assert torch.equal(att, want_att) and torch.equal(router, want_router)


def _runtime_imports(path: Path) -> set[str]:
    """Modules a file imports when it runs (imports under ``if TYPE_CHECKING:`` left out)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_options_import_no_pass_and_no_pass_imports_another():
    """The passes read the options, so the options must not import them back; the matchers the
    families share live in matcher.py (and the contract in base.py), never in another family."""
    root = Path(compiler.__file__).parent
    assert not [m for m in _runtime_imports(root / "options.py") if m.startswith("compiler.passes")]
    families = [p for p in sorted((root / "passes").glob("*.py")) if p.stem not in ("__init__", "base", "matcher")]
    assert len(families) >= 3
    for path in families:
        others = {m for m in _runtime_imports(path) if m.startswith("compiler.passes")}
        assert others <= {"compiler.passes.base", "compiler.passes.matcher"}, path.name


def test_rewrites_and_near_misses_are_logged_below_warning(caplog):
    caplog.set_level(logging.DEBUG, logger="compiler")
    _run(_SinToCos())
    _run(_SinToCos("match"))
    records = [r for r in caplog.records if r.name.startswith("compiler.")]
    messages = [r.getMessage() for r in records]
    assert any("sin_to_cos rewrite" in m for m in messages)
    assert any("near miss" in m and "unsupported form: KeyError" in m for m in messages)
    assert all(r.levelno < logging.WARNING for r in records)  # nothing is printed by default
