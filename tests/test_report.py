"""compiler.explain and the Report: entries, counters, printed tables, the current-report stack."""
import pytest
import torch

import compiler
from compiler.report import Report, collecting, current_report, format_table

EAGER_OPS = {"downstream": "eager", "stock_below": 0}
"""Eager downstream, the ops on every call (on the CPU the backend otherwise keeps every stock subgraph)."""


class Indexer(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(3, dim=-1).indices


class Smallest(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(3, dim=-1, largest=False).indices


def _args():
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 4, 2, 8, generator=g), torch.randn(1, 12, 8, generator=g), torch.rand(1, 4, 2, generator=g)


def test_explain_returns_rewrites_stats_and_a_printable_table():
    report = compiler.explain(Indexer(), *_args(), options=EAGER_OPS)
    (rw,) = report.rewrites
    assert (rw.kind, rw.compile_index) == ("dsa_indexer", 0) and rw.path in ("auto", "dense", "certified")
    assert report.stats[rw.module]["queries"] == 4
    assert sum(report.fallback_totals().values()) == 4  # 12 keys: every query is answered densely
    text = str(report)
    assert "dsa_indexer" in text and rw.variant in text and "queries" in text


def test_near_miss_appears_in_the_printed_table():
    report = compiler.explain(Smallest(), *_args(), options=EAGER_OPS)
    assert report.rewrites == []
    assert "largest=False" in str(report)


def test_record_stats_false_leaves_no_statistics():
    report = compiler.explain(Indexer(), *_args(), options={**EAGER_OPS, "record_stats": False})
    assert len(report.rewrites) == 1 and report.stats == {}


def test_collecting_nests_and_restores_the_current_report():
    outer = current_report()
    with collecting() as a:
        assert current_report() is a
        with collecting(Report()) as b:
            assert current_report() is b
        assert current_report() is a
    assert current_report() is outer


def test_format_table_aligns_columns():
    assert format_table(["a", "bb"], [[1, 2], [333, 4]]).splitlines() == ["a    bb", "---  --", "1    2", "333  4"]


def test_static_recompilation_rewrites_again_and_is_recorded_per_compile():
    report = compiler.explain(Indexer(), *_args(), options=EAGER_OPS, dynamic=False)
    q, k, w = _args()
    longer = torch.cat([k, torch.randn(1, 7, 8, generator=torch.Generator().manual_seed(1))], dim=1)
    with collecting(report):
        out = report.compiled(q, longer, w)
    assert torch.equal(out, Indexer()(q, longer, w))
    assert len(report.compiles) == 2
    assert [r.compile_index for r in report.rewrites] == [0, 1]
    assert "1  dsa_indexer" in str(report)


def test_explain_names_a_model_that_is_not_callable_and_a_dynamic_that_is_not_a_bool():
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module or another callable, got str"):
        compiler.explain("model", torch.zeros(2))
    with pytest.raises(TypeError, match="dynamic: expected None, True or False .*got 'yes'"):
        compiler.explain(torch.nn.Linear(2, 2), torch.zeros(2), dynamic="yes")


def test_the_guard_table_names_the_rung_a_layer_climbed_to():
    """A guard bucket on the layer's own settings prints "-" as its rung; one that climbed prints
    the rung's r and list size."""
    from compiler.ops.guard import GuardBucket, guard_ladder
    from compiler.topk_settings import TopkSettings

    climbed = GuardBucket(ladder=guard_ladder(TopkSettings()), rung=1, favoured="certified").summary()
    own = GuardBucket(ladder=guard_ladder(TopkSettings())).summary()
    where = {"device": "cuda:0", "queries_bucket": 4096, "keys_bucket": 131072}
    report = Report(guard={"layers.1": [{**where, **climbed}], "layers.0": [{**where, **own}]})
    lines = {line.split()[0]: line for line in str(report).splitlines() if line.startswith("layers.")}
    assert "r=15 lists of 2" in lines["layers.1"] and "certified" in lines["layers.1"]
    assert "r=" not in lines["layers.0"] and " - " in lines["layers.0"]
