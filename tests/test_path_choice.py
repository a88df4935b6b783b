"""The one home of the path decision: plan-time choice, compile-time settings, call-time path and
the runtime guard (its state machine on given times, and the real op on the CPU)."""
import dataclasses

import pytest
import torch

import compiler.path_choice as path_choice
from compiler.cost_model import IndexerShape, KernelConstants, crossover_length
from compiler.ops.stats import TOPK_STATS
from compiler.options import CompileOptions
from compiler.path_choice import (CHOICES, GUARD, PATHS, RETRY_FIRST, GuardBucket, LayerSettings, call_path,
                                  choose_layer, default_crossover, layer_settings, short_candidates)
from compiler.plan.schema import CandidateMeasurement
from runtime.dense_scorer import dense_topk

GEOMETRY = dict(heads=64, head_dim=128, topk=2048)
# Rates of an earlier H200 fit, fixed here so that the cases below test the decision rules, not
# what the current fit predicts.
CONSTANTS = KernelConstants(dense_macs_per_s=1.17e14, screen_macs_per_s=2.6e13, refine_macs_per_s=1.19e14,
                            select_keys_per_s=4.7e10, plan_s_per_query=1.5e-6, dense_fixed_s=1.9e-3,
                            certified_fixed_s=2.3e-3, screen_tile=1, screen_pow2=True,
                            source="an earlier H200 fit, fixed for these tests")
CALLS = [(1, 512, 131072)]  # one calibration chunk of 512 queries at 131072 keys


def candidate(r, survival, ms=None, redo=0.0, screened=10**8, certified=500):
    return CandidateMeasurement(r=r, survival=survival, redo_frac=redo, ms=ms, queries=512, certified_queries=certified,
                                keys_screened=screened, survivors=int(survival * screened), fallbacks={})


def choose(candidates, dense_ms=None, design_length=131072, queries=16384):
    return choose_layer(candidates, dense_ms, CALLS, **GEOMETRY, constants=CONSTANTS, design_length=design_length,
                        queries=queries)


def test_the_path_names_are_defined_once_and_shared():
    from compiler.ops.certified_topk import check_choice as op_check_choice
    from compiler.plan import schema
    from runtime import certified_topk

    assert PATHS is certified_topk.PATHS is schema.PATHS and CHOICES == ("auto",) + PATHS
    assert op_check_choice is path_choice.check_choice
    with pytest.raises(ValueError, match="option 'certified': expected one of"):
        CompileOptions.from_user({"certified": "fast"})


def test_short_candidates_are_the_tile_aligned_budgets_of_at_most_eight_rows():
    assert short_candidates(64) == [1, 3, 7] and short_candidates(4) == [1, 3] and short_candidates(1) == []


def test_a_plan_refuses_to_certify_without_enough_evidence_and_says_why():
    few_keys = choose([candidate(3, 0.02, screened=1000)])
    few_queries = choose([candidate(3, 0.02, certified=10)])
    for choice in (few_keys, few_queries):
        assert (choice.path, choice.r, choice.crossover) == ("dense", None, None)
        assert choice.reason.startswith("not enough evidence")
    assert "1000 screened keys" in few_keys.reason and "10 certified queries" in few_queries.reason


def test_a_plan_picks_r_by_predicted_time_not_by_survival():
    # r=7 prunes more, but its 8 screen rows cost more than they save against r=1's 2 rows.
    choice = choose([candidate(1, 0.03), candidate(7, 0.02)])
    assert choice.path == "certified" and choice.r == 1 and choice.reason.startswith("r=1 predicted")
    # The same survivals, but r=1's measured calibration call is far slower than predicted.
    timed = choose([candidate(1, 0.03, ms=40.0), candidate(7, 0.02, ms=5.0)], dense_ms=10.0)
    assert timed.r == 7 and "measured 2.00x on the calibration calls" in timed.reason


def test_a_plan_goes_dense_when_the_measured_call_loses_or_the_prediction_barely_wins():
    lost = choose([candidate(3, 0.03, ms=12.0), candidate(7, 0.01, ms=10.0)], dense_ms=10.0)
    assert lost.path == "dense" and "(r=3 1.20x, r=7 1.00x the dense time)" in lost.reason
    # A budget that lost on calibration calls as long as the design's is never chosen, however
    # well it is predicted.
    other = choose([candidate(1, 0.001, ms=12.0), candidate(7, 0.02, ms=6.0)], dense_ms=10.0)
    assert other.r == 7
    barely = choose([candidate(3, 0.9)])
    assert barely.path == "dense" and "certified needs < 0.9" in barely.reason


def test_a_budget_that_lost_on_shorter_calls_may_pay_at_a_longer_design_length():
    """r=1 lost on the 131072-key calibration call; a layer designed for 2^19 keys extrapolates the
    scaled model and is certified only above the calibration length. At the calibration length
    itself the loss stands."""
    longer = choose([candidate(1, 0.03, ms=12.0)], dense_ms=10.0, design_length=2**19)
    assert longer.path == "certified" and longer.r == 1 and longer.crossover > CALLS[0][2]
    assert "measured 1.20x the dense time on the calibration calls" in longer.reason
    same = choose([candidate(1, 0.03, ms=12.0)], dense_ms=10.0, design_length=CALLS[0][2])
    assert same.path == "dense" and same.reason.startswith("every budget measured slower")
    # Far slower than predicted: the scaled model no longer pays at the design length either.
    hopeless = choose([candidate(1, 0.03, ms=30.0)], dense_ms=10.0, design_length=2**19)
    assert hopeless.path == "dense" and "certified needs < 0.9" in hopeless.reason


def test_redone_queries_are_charged():
    cheap = choose([candidate(3, 0.03)])
    redone = choose([candidate(3, 0.03, redo=0.3)])
    assert redone.predicted_speedup < cheap.predicted_speedup and redone.crossover > cheap.crossover


def test_the_crossover_of_a_planned_layer_is_the_cost_models_with_the_measured_scale():
    choice = choose([candidate(3, 0.03, ms=5.0)], dense_ms=10.0, design_length=2**19)
    assert choice.path == "certified"
    design = IndexerShape(**GEOMETRY, queries=16384)
    assert choice.crossover != crossover_length(3, 0.03, design, CONSTANTS)


def test_default_crossover_follows_the_call_shape():
    prefill = default_crossover(64, 128, 2048, None, "cuda")
    chunk = default_crossover(64, 128, 2048, 4096, "cuda")
    assert 2048 < min(chunk, prefill) and max(chunk, prefill) < 131072 and chunk != prefill
    assert default_crossover(64, 128, 2048, 1, "cuda") is None  # one query is its own anchor: never pays
    assert default_crossover(2, 128, 2048, None, "cuda") is None  # no aligned budget of 4 heads below 2


def settings(plan=None, forced="auto", **sizes):
    return layer_settings("layers.0", plan=plan, forced_path=forced, device_type="cuda",
                          **{**GEOMETRY, **sizes})


def test_compile_time_settings_report_the_decision_and_give_the_op_its_guarded_arguments():
    default = settings()
    assert (default.path, default.source) == ("certified", "cost model")
    assert default.op_kwargs() == {"path": "auto", "r": -1, "min_keys": default.crossover}
    forced = settings(forced="certified")
    assert forced.op_kwargs() == {"path": "certified", "r": -1, "min_keys": -1}
    assert settings(forced="dense").op_kwargs()["path"] == "dense"
    symbolic = settings(heads=None)
    assert (symbolic.path, symbolic.op_kwargs()["min_keys"]) == ("auto", -1)
    assert settings(heads=2).path == "dense"
    with pytest.raises(ValueError, match="forced_path"):
        settings(forced="fast")
    planned = LayerSettings("certified", 3, 50000, 0.9, "plan 0123")
    assert planned.op_kwargs() == {"path": "auto", "r": 3, "min_keys": 50000}
    assert planned.report_fields()["path"] == "certified"


def test_call_time_path_obeys_a_forced_choice_and_dispatches_auto_on_static_sizes():
    GUARD.reset()
    common = dict(layer="call", device=torch.device("cpu"), H=64, D=128, kk=2048)
    assert call_path(choice="dense", crossover=None, B=1, S=4096, T=2**20, **common).path == "dense"
    assert call_path(choice="certified", crossover=None, B=1, S=1, T=100, **common).path == "certified"
    auto = dict(choice="auto", crossover=50000, **common)
    assert call_path(B=1, S=4096, T=40000, **auto).path == "dense"          # below the crossover
    assert call_path(B=1, S=16, T=2**20, **auto).path == "dense"            # too few queries
    assert call_path(B=1, S=4096, T=2048, **{**auto, "crossover": 0}).path == "dense"  # kk >= T
    assert call_path(B=1, S=4096, T=2**20, **auto).path == "certified"      # the guard's warm-up
    assert GUARD.summaries()["call"][0]["certified_calls"] == 1
    with pytest.raises(ValueError, match="path: expected one of"):
        call_path(B=1, S=4096, T=2**20, **{**auto, "choice": "fast"})
    GUARD.reset()


def run(bucket, path, ms=None):
    """Take the bucket's next path (it must be ``path``) and, when measured, record ``ms``."""
    got, measured = bucket.next_path()
    assert got == path
    bucket.issued(got, measured)
    if measured and ms is not None:
        bucket.record(got, ms)
    return measured


def test_guard_warms_up_then_measures_both_paths_and_keeps_the_faster():
    bucket = GuardBucket()
    assert run(bucket, "certified") is False  # warm-up, not measured
    run(bucket, "dense", 10.0)
    run(bucket, "certified", 6.0)
    assert bucket.favoured == "certified"
    for _ in range(5):
        run(bucket, "certified", 6.5)
    run(bucket, "certified", 12.0)  # one slow call: the better of the last two still wins
    assert bucket.favoured == "certified"
    run(bucket, "certified", 11.0)  # two: the layer goes dense
    assert bucket.favoured == "dense"
    assert bucket.summary()["path"] == "dense" and bucket.capture_path() == "dense"


def test_guard_retries_a_losing_certified_path_with_a_doubling_wait():
    bucket = GuardBucket()
    run(bucket, "certified")
    run(bucket, "dense", 10.0)
    run(bucket, "certified", 30.0)
    assert bucket.favoured == "dense"
    for wait in (RETRY_FIRST, 2 * RETRY_FIRST, 4 * RETRY_FIRST):
        for _ in range(wait):
            run(bucket, "dense", 10.0)
        run(bucket, "certified", 30.0)  # the retry loses again
        assert bucket.favoured == "dense" and bucket.backoff == 2 * wait
    for _ in range(8 * RETRY_FIRST):
        run(bucket, "dense", 10.0)
    run(bucket, "certified", 4.0)  # the input changed: certified wins again
    assert bucket.favoured == "certified" and bucket.backoff == RETRY_FIRST and bucket.retries == 4


def test_guard_waits_on_the_safe_path_while_measurements_are_in_flight():
    bucket = GuardBucket()
    run(bucket, "certified")
    run(bucket, "dense")  # measured, not yet read
    run(bucket, "certified")  # measured, not yet read
    assert run(bucket, "dense") and bucket.favoured is None and bucket.capture_path() == "certified"
    bucket.record("dense", 10.0)
    bucket.record("certified", 5.0)
    assert bucket.favoured == "certified" and bucket.next_path() == ("certified", True)


def test_guard_goes_dense_on_the_counters_of_a_certified_call_that_cannot_have_won():
    bucket = GuardBucket()
    run(bucket, "certified")
    bucket.record("certified", None, (0.5, 0.1))  # the warm-up could have won: wait for the times
    assert bucket.favoured is None
    bucket.record("certified", None, (0.97, 0.0))  # refined nearly every key: lost
    assert bucket.favoured == "dense" and bucket.sure_losses == 1
    assert bucket.next_path() == ("dense", True)
    for _ in range(RETRY_FIRST):
        run(bucket, "dense", 10.0)
    assert bucket.next_path() == ("certified", True)
    bucket.issued("certified", True)
    bucket.record("certified", 4.0, (0.1, 0.8))  # fast, but most queries redone densely: lost, once
    assert bucket.favoured == "dense" and bucket.backoff == 2 * RETRY_FIRST and bucket.sure_losses == 2


def test_the_op_on_an_input_that_does_not_prune_goes_dense_after_its_first_call():
    """16 positive heads of random directions and one retained (r=1): the bound of the 15 others
    is loose, so the first (warm-up) certified call of the CPU reference refines nearly every key
    and its counters alone send the layer dense; the retry after RETRY_FIRST dense calls loses the
    same way and doubles the wait."""
    GUARD.reset()
    TOPK_STATS.reset()
    g = torch.Generator().manual_seed(0)
    q, k, w = torch.randn(1, 64, 16, 16, generator=g), torch.randn(1, 4096, 16, generator=g), torch.rand(1, 64, 16, generator=g)
    want = dense_topk(q, k, w, 32)
    calls = 1 + RETRY_FIRST + 1 + 2
    for _ in range(calls):
        got = torch.ops.pulsar_dosa.certified_topk(q, k, w, 32, layer="random", r=1, min_keys=0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    (state,) = GUARD.summaries()["random"]
    assert state["path"] == "dense" and state["retries"] == 1 and state["next_retry_after"] == 2 * RETRY_FIRST
    assert (state["certified_calls"], state["dense_calls"], state["sure_losses"]) == (2, calls - 2, 2)
    assert state["dense_ms_per_Gpair"] > 0
    summary = TOPK_STATS.summaries()["random"]
    assert summary["fallbacks"]["dense_cheaper"] == 64 * (calls - 2) and summary["queries"] == 64 * calls
    GUARD.reset()
    TOPK_STATS.reset()


class _Indexer(torch.nn.Module):
    def forward(self, q, k, w):
        x = torch.relu(torch.einsum("bshd,btd->bsht", q, k))
        return torch.matmul(w.unsqueeze(-2), x).squeeze(-2).topk(4, dim=-1).indices


def test_explain_reports_the_guard_of_every_guarded_layer():
    import compiler
    from compiler.plan.schema import LayerPlan, Plan
    from compiler.cost_model import CPU_REFERENCE

    entry = LayerPlan(layer="", path="certified", r=3, crossover=8, heads=8, head_dim=16, topk=4,
                      predicted_pruned_frac=0.5, predicted_speedup=1.5, reason="tests", dense_ms=None,
                      calibration_calls=(), candidates=(), seed_gap=None, slack=None)
    plan = Plan(model={}, inputs={}, design_length=64, queries=None, constants=CPU_REFERENCE, layers=(entry,))
    g = torch.Generator().manual_seed(0)
    args = torch.randn(1, 40, 8, 16, generator=g), torch.randn(1, 64, 16, generator=g), torch.randn(1, 40, 8, generator=g)
    report = compiler.explain(_Indexer(), *args, options={"downstream": "eager", "stock_below": 0, "plan": plan})
    (rewrite,) = report.rewrites
    assert (rewrite.path, rewrite.r, rewrite.details["min_keys"]) == ("certified", 3, 8)
    (state,) = report.guard[""]
    assert (state["certified_calls"], state["dense_calls"], state["path"]) == (1, 0, "undecided")
    assert "runtime guard" in str(report) and "undecided" in str(report)
