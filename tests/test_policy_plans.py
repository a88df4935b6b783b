"""A plan at compile time: per-layer r, min_keys and list size in the op calls and the report, mismatches
rejected, the options id tracking the plan, and the length dispatch without recompilation."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from compiler.cost_model import CPU_REFERENCE
from compiler.ops.guard import GUARD
from compiler.ops.stats import TOPK_STATS
from compiler.options import CompileOptions
from compiler.plan.schema import LayerPlan, Plan, PlanError, save_plan
from compiler.report import collecting
from compiler.topk_settings import TopkSettings

H, D, K, HIDDEN = 8, 16, 8, 32


class Indexer(torch.nn.Module):
    """The DeepSeek-V3.2 indexer spelling: matmul, relu, head-weighting matmul, additive mask, topk."""

    def __init__(self):
        super().__init__()
        self.wq = torch.nn.Linear(HIDDEN, H * D, bias=False)
        self.wk = torch.nn.Linear(HIDDEN, D, bias=False)
        self.weights_proj = torch.nn.Linear(HIDDEN, H, bias=False)

    def forward(self, x, mask):
        B, S, _ = x.shape
        q = self.wq(x).view(B, S, H, D)
        k = self.wk(x)
        scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * D ** -0.5)
        weights = self.weights_proj(x).float() * H ** -0.5
        index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2) + mask
        return index_scores.topk(min(K, index_scores.shape[-1]), dim=-1).indices


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Indexer()
        self.second = Indexer()

    def forward(self, x, mask):
        return self.first(x, mask), self.second(x, mask)


def causal_mask(T):
    return torch.full((T, T), float("-inf")).triu(1)[None]


def layer(name, path="auto", r=3, min_keys=50, heads=H, list_queries=None, witnesses=None):
    settings = TopkSettings(path, r, min_keys, list_queries, witnesses) if path == "auto" else TopkSettings(path)
    return LayerPlan(layer=name, settings=settings, heads=heads, head_dim=D, topk=K,
                     predicted_pruned_frac=0.9 if path == "auto" else None, predicted_speedup=1.0,
                     reason="tests", dense_ms=None, calibration_calls=(), candidates=(), seed_gap=None, slack=None)


def plan_of(*layers):
    return Plan(model={"spec": "tests"}, inputs={}, design_length=4096, queries=None, constants=CPU_REFERENCE,
                layers=tuple(layers))


def compile_and_run(model, options, lengths, dynamic=None):
    torch._dynamo.reset()
    TOPK_STATS.reset()
    GUARD.reset()
    torch.manual_seed(0)
    summaries = []
    with collecting() as report, torch.no_grad():
        compiled = torch.compile(model, backend="pulsar_dosa", options={"stock_below": 0, **options}, fullgraph=True,
                                 dynamic=dynamic)
        for T in lengths:
            compiled(torch.randn(1, T, HIDDEN), causal_mask(T))
            summaries.append(TOPK_STATS.summaries())
            TOPK_STATS.reset()
    return report, summaries


def test_report_shows_the_plans_r_path_and_min_keys_per_layer(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "plan.json"
    save_plan(plan_of(layer("first", r=3, min_keys=50, list_queries=2, witnesses=False), layer("second", path="dense")),
              path)
    report, _ = compile_and_run(TwoLayers().eval(), {"plan": str(path), "downstream": "eager"}, [24])
    by_layer = {rw.module: rw for rw in report.rewrites}
    assert set(by_layer) == {"first", "second"}
    assert (by_layer["first"].r, by_layer["first"].path, by_layer["first"].details["min_keys"]) == (3, "auto", 50)
    assert by_layer["first"].details["predicted_pruned_frac"] == 0.9
    assert (by_layer["first"].details["list_queries"], by_layer["second"].details["list_queries"]) == (2, None)
    assert (by_layer["first"].details["witnesses"], by_layer["second"].details["witnesses"]) == (False, None)
    assert (by_layer["second"].r, by_layer["second"].path) == (None, "dense")
    assert by_layer["first"].details["settings_from"].startswith("plan ")


def test_without_a_plan_the_cost_model_sets_min_keys():
    torch.manual_seed(0)
    report, _ = compile_and_run(TwoLayers().eval(), {"downstream": "eager"}, [24])
    for rw in report.rewrites:
        assert rw.r is None and rw.path == "auto" and rw.details["settings_from"] == "cost model"
        assert rw.details["min_keys"] > K


def test_a_plan_missing_a_layer_of_the_model_is_rejected(tmp_path):
    torch.manual_seed(0)
    with pytest.raises(Exception, match="plan has no layer 'second'"):
        compile_and_run(TwoLayers().eval(), {"plan": plan_of(layer("first")), "downstream": "eager"}, [24])


def test_a_plan_made_for_another_geometry_is_rejected():
    torch.manual_seed(0)
    plan = plan_of(layer("first", heads=2 * H), layer("second"))
    with pytest.raises(Exception, match="heads=16 in the plan but 8 in the model"):
        compile_and_run(TwoLayers().eval(), {"plan": plan, "downstream": "eager"}, [24])


def test_options_id_changes_with_the_plan_content_not_its_path(tmp_path):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    save_plan(plan_of(layer("first", min_keys=50)), a)
    save_plan(plan_of(layer("first", min_keys=50)), b)
    save_plan(plan_of(layer("first", min_keys=51)), c)
    ids = [CompileOptions.from_user({"plan": str(p)}).uuid() for p in (a, b, c)]
    assert ids[0] == ids[1] != ids[2]
    assert CompileOptions.from_user({}).uuid() not in ids


def test_bad_plan_options_are_rejected_naming_the_option(tmp_path):
    with pytest.raises(TypeError, match="option 'plan'"):
        CompileOptions.from_user({"plan": 3})
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PlanError, match="not valid JSON"):
        CompileOptions.from_user({"plan": str(tmp_path / "bad.json")})


def test_length_dispatch_happens_in_the_op_without_recompiling_per_length():
    torch.manual_seed(0)
    model = Indexer().eval()
    plan = plan_of(layer("", r=3, min_keys=50))
    lengths = [40, 56, 72]
    report, summaries = compile_and_run(model, {"plan": plan, "downstream": "eager"}, lengths, dynamic=True)
    assert len(report.compiles) == 1 and len(report.rewrites) == 1
    for T, summary in zip(lengths, summaries):
        stats = summary[""]
        # Query i sees i + 1 keys: at most K -> topk_ge_visible; a call below min_keys 50 is dense,
        # a longer one certified (the first call of its length bucket is the guard's certified warm-up).
        assert stats["fallbacks"]["topk_ge_visible"] == K
        assert stats["fallbacks"]["dense_cheaper"] == (T - K if T < 50 else 0)
        assert stats["queries"] == T


def test_a_forced_path_overrides_the_plan_but_keeps_its_r_list_size_and_witnesses():
    torch.manual_seed(0)
    plan = plan_of(layer("first", path="dense"), layer("second", r=5, list_queries=1, witnesses=False))
    report, _ = compile_and_run(TwoLayers().eval(), {"plan": plan, "path": "certified",
                                                     "downstream": "eager"}, [24])
    by_layer = {rw.module: rw for rw in report.rewrites}
    assert (by_layer["first"].path, by_layer["first"].r) == ("certified", None)
    assert (by_layer["second"].path, by_layer["second"].r) == ("certified", 5)
    assert (by_layer["second"].details["list_queries"], by_layer["second"].details["witnesses"]) == (1, False)


def test_plan_dataclass_is_accepted_as_the_option_value():
    plan = plan_of(layer("first"))
    assert CompileOptions.from_user({"plan": plan}).plan is plan
    assert dataclasses.replace(plan, design_length=8).hash != plan.hash
