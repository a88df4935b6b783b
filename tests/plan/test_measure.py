"""Plan measurements: m(r), redo fraction and times from the runtime's statistics, seed gaps and slacks,
and the layer decision built from them."""
import pytest
import torch

from compiler.cost_model import H200_FITTED
from compiler.ops.capture_topk import CapturedCall
from compiler.plan import measure
from compiler.plan.measure import (certificate_diagnostics, choose_from_measurement, distribution,
                                   measure_candidate, measure_layer, measurement_count)
from compiler.topk_settings import TopkSettings
from runtime.certified_topk import CertifiedTopkConfig, TopkStats, certified_topk
from runtime.structured_indexer import structured_indexer_inputs

S, T, H, D, K = 16, 1000, 16, 16, 128


def causal(B=1):
    return torch.ones(B, S, T, dtype=torch.bool).tril(diagonal=T - S)


def structured_call(seed=0):
    q, k, w, _ = structured_indexer_inputs(1, S, T, H, D, seed=seed)
    return CapturedCall(q, k, w, K, causal())


def random_call(seed=0):
    g = torch.Generator().manual_seed(seed)
    additive = torch.where(causal(), 0.0, float("-inf")) + 0.01 * torch.randn(1, S, T, generator=g)
    return CapturedCall(torch.randn(1, S, H, D, generator=g), torch.randn(1, T, D, generator=g),
                        torch.randn(1, S, H, generator=g), K, additive)


def test_survival_is_survivors_over_screened_keys_of_the_runtime_statistics():
    calls = [structured_call(0), random_call(1)]
    stats = TopkStats()
    for c in calls:
        certified_topk(c.q, c.k, c.weights, c.topk, c.mask, config=CertifiedTopkConfig(r=3, path="certified"),
                       stats=stats)
    s = stats.summary()
    m = measure_candidate(calls, 3)
    assert (m.keys_screened, m.survivors, m.queries) == (s["keys_screened"], s["survivors"], s["queries"])
    assert m.survival == s["survivors"] / s["keys_screened"]
    assert m.certified_queries == s["queries"] - s["anchors"] - s["fallbacks"]["topk_ge_visible"]
    assert m.redo_frac == (s["fallbacks"]["overflow"] + s["fallbacks"]["threshold_miss"]) / m.certified_queries
    assert 0 < m.keys_screened and m.ms > 0
    assert measure_candidate(calls, 3, timed=False).ms is None


def test_structured_inputs_prune_far_more_than_random_ones():
    assert measure_candidate([structured_call()], 4).survival < 0.1
    assert measure_candidate([random_call()], 4).survival > 0.5


def test_nothing_screened_counts_as_full_survival():
    q, k, w, _ = structured_indexer_inputs(1, 8, 500, H, D, seed=0)
    m = measure_candidate([CapturedCall(q, k, w, K, None)], 4)  # sink + window + K cover every key
    assert m.keys_screened == 0 and m.survival == 1.0


def test_seed_gaps_and_slacks_are_non_negative_and_cover_the_screened_keys():
    for call in (structured_call(), random_call()):
        config = CertifiedTopkConfig(r=3, path="certified")
        gaps, slacks = certificate_diagnostics(call, config)
        stats = TopkStats()
        certified_topk(call.q, call.k, call.weights, call.topk, call.mask, config=config, stats=stats)
        summary = stats.summary()
        assert gaps.numel() == summary["queries"] - summary["anchors"]
        assert slacks.numel() == summary["keys_screened"]
        assert bool((gaps >= 0).all()) and bool((slacks >= 0).all())


def test_distribution_summarises_a_sample():
    d = distribution(torch.arange(101, dtype=torch.float64))
    assert (d.count, d.mean, d.min, d.max, d.p05, d.p50, d.p95) == (101, 50.0, 0.0, 100.0, 5.0, 50.0, 95.0)
    assert distribution(torch.zeros(0)) is None


def test_a_layer_measured_on_too_few_keys_is_planned_dense_and_the_plan_says_why():
    measurement = measure_layer("b", [structured_call()], [4])
    assert measurement.dense_ms > 0 and measurement.call_sizes == [(1, S, T)]
    plan = choose_from_measurement(measurement, H200_FITTED, design_length=2**20, queries=None)
    assert plan.settings == TopkSettings("dense")
    assert plan.reason.startswith("not enough evidence") and str(measurement.candidates[0].keys_screened) in plan.reason
    assert plan.dense_ms == measurement.dense_ms and plan.calibration_calls == ((1, S, T),)
    assert plan.seed_gap.count > 0 and plan.slack.min >= 0


def test_distribution_quantiles_match_torch_quantile():
    v = torch.randn(999, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    d = distribution(v)
    expected = torch.quantile(v, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64))
    assert (d.p05, d.p50, d.p95) == pytest.approx(expected.tolist(), rel=1e-12)


def test_the_best_budgets_are_measured_again_with_each_list_size_and_the_best_with_each_witnesses(monkeypatch):
    calls = [structured_call()]
    assert measure.list_sizes(calls) == ()  # the CPU reference screens each query alone
    monkeypatch.setattr(measure, "list_sizes", lambda calls: (1, 2))
    configs, run = [], measure._certified_run
    monkeypatch.setattr(measure, "_certified_run", lambda call, config, stats: configs.append(config)
                        or run(call, config, stats))
    measurement = measure_layer("b", calls, [1, 3, 7], timed=False)
    plain = [c for c in measurement.candidates if c.witnesses is None]
    by_default = {c.r: c for c in plain if c.list_queries is None}
    lists = [(c.r, c.list_queries) for c in plain if c.list_queries is not None]
    best = sorted(by_default.values(), key=lambda c: (c.survival, c.r))[:measure.LIST_BUDGETS]
    assert sorted(by_default) == [1, 3, 7] and lists == [(c.r, n) for c in best for n in (1, 2)]
    fastest = sorted(plain, key=lambda c: (c.survival, c.r))[0]
    witnessed = [(c.r, c.list_queries, c.witnesses) for c in measurement.candidates if c.witnesses is not None]
    assert witnessed == [(fastest.r, fastest.list_queries, w) for w in measure.WITNESSES] == \
        [(c.r, c.list_queries, c.witnesses) for c in configs[-2:]]  # what ran is what is recorded
    assert measure.WITNESSES == (False, True)
    assert len(measurement.candidates) == measurement_count(3, calls) == 3 + 2 * measure.LIST_BUDGETS + 2


def test_a_candidate_measured_without_witnesses_has_no_anchor():
    q, k, w, _ = structured_indexer_inputs(1, S, 8192, H, D, seed=0)  # long enough for a sample of its own
    calls = [CapturedCall(q, k, w, K, None)]
    off, on = (measure_candidate(calls, 3, timed=False, witnesses=x) for x in (False, True))
    assert (off.witnesses, on.witnesses) == (False, True)
    assert off.certified_queries == on.certified_queries + 1 == off.queries  # query 0 is the only anchor
