"""Plan time: one layer's path from its calibration measurements (compiler.plan.choice)."""
import dataclasses

from compiler.cost_model import IndexerShape, KernelConstants, crossover_length
from compiler.plan.choice import choose_layer, short_candidates
from compiler.plan.schema import CandidateMeasurement
from compiler.topk_settings import TopkSettings

GEOMETRY = dict(heads=64, head_dim=128, topk=2048)
# Rates of an earlier H200 fit, fixed here so that the cases below test the decision rules, not
# what the current fit predicts.
CONSTANTS = KernelConstants(dense_macs_per_s=1.17e14, screen_macs_per_s=2.6e13, refine_macs_per_s=1.19e14,
                            select_keys_per_s=4.7e10, plan_s_per_query=1.5e-6, dense_fixed_s=1.9e-3,
                            certified_fixed_s=2.3e-3, screen_tile=1, screen_pow2=True,
                            source="an earlier H200 fit, fixed for these tests")
CALLS = [(1, 512, 131072)]  # one calibration chunk of 512 queries at 131072 keys


def candidate(r, survival, ms=None, redo=0.0, screened=10**8, certified=500, lists=None, witnesses=None):
    return CandidateMeasurement(r=r, survival=survival, redo_frac=redo, ms=ms, queries=512, certified_queries=certified,
                                keys_screened=screened, survivors=int(survival * screened), fallbacks={},
                                list_queries=lists, witnesses=witnesses)


def choose(candidates, dense_ms=None, design_length=131072, queries=16384):
    return choose_layer(candidates, dense_ms, CALLS, **GEOMETRY, constants=CONSTANTS, design_length=design_length,
                        queries=queries)


def test_short_candidates_are_the_tile_aligned_budgets_of_at_most_32_rows_and_half_the_heads():
    assert short_candidates(64) == [1, 3, 7, 15, 31] and short_candidates(128) == [1, 3, 7, 15, 31]
    assert short_candidates(8) == [1, 3] and short_candidates(4) == [1] and short_candidates(1) == []


def test_a_plan_refuses_to_certify_without_enough_evidence_and_says_why():
    few_keys = choose([candidate(3, 0.02, screened=1000)])
    few_queries = choose([candidate(3, 0.02, certified=10)])
    for choice in (few_keys, few_queries):
        assert choice.settings == TopkSettings("dense")
        assert choice.reason.startswith("not enough evidence")
    assert "1000 screened keys" in few_keys.reason and "10 certified queries" in few_queries.reason


def test_a_plan_picks_r_by_predicted_time_not_by_survival():
    # r=7 prunes more, but its 8 screen rows cost more than they save against r=1's 2 rows.
    choice = choose([candidate(1, 0.03), candidate(7, 0.02)])
    assert choice.settings.path == "auto" and choice.settings.r == 1 and choice.reason.startswith("r=1 predicted")
    # The same survivals, but r=1's measured calibration call is far slower than predicted.
    timed = choose([candidate(1, 0.03, ms=40.0), candidate(7, 0.02, ms=5.0)], dense_ms=10.0)
    assert timed.settings.r == 7 and "measured 2.00x on the calibration calls" in timed.reason


def test_a_plan_goes_dense_when_the_measured_call_loses_or_the_prediction_barely_wins():
    lost = choose([candidate(3, 0.03, ms=12.0), candidate(7, 0.01, ms=10.0)], dense_ms=10.0)
    assert lost.settings.path == "dense" and "(r=3 1.20x, r=7 1.00x the dense time)" in lost.reason
    # A budget that lost on calibration calls as long as the design's is never chosen, however
    # well it is predicted.
    other = choose([candidate(1, 0.001, ms=12.0), candidate(7, 0.02, ms=6.0)], dense_ms=10.0)
    assert other.settings.r == 7
    barely = choose([candidate(3, 0.9)])
    assert barely.settings.path == "dense" and "certified needs < 0.9" in barely.reason


def test_a_budget_that_lost_on_shorter_calls_may_pay_at_a_longer_design_length():
    """r=1 lost on the 131072-key calibration call; a layer designed for 2^19 keys extrapolates the
    scaled model and is certified only above the calibration length. At the calibration length
    itself the loss stands."""
    longer = choose([candidate(1, 0.03, ms=12.0)], dense_ms=10.0, design_length=2**19)
    assert longer.settings.path == "auto" and longer.settings.r == 1 and longer.settings.min_keys > CALLS[0][2]
    assert "measured 1.20x the dense time on the calibration calls" in longer.reason
    same = choose([candidate(1, 0.03, ms=12.0)], dense_ms=10.0, design_length=CALLS[0][2])
    assert same.settings.path == "dense" and same.reason.startswith("every budget measured slower")
    # Far slower than predicted: the scaled model no longer pays at the design length either.
    hopeless = choose([candidate(1, 0.03, ms=30.0)], dense_ms=10.0, design_length=2**19)
    assert hopeless.settings.path == "dense" and "certified needs < 0.9" in hopeless.reason


def test_redone_queries_are_charged():
    cheap = choose([candidate(3, 0.03)])
    redone = choose([candidate(3, 0.03, redo=0.3)])
    assert redone.predicted_speedup < cheap.predicted_speedup and redone.settings.min_keys > cheap.settings.min_keys


def test_the_min_keys_of_a_planned_layer_is_the_cost_models_crossover_with_the_measured_scale():
    choice = choose([candidate(3, 0.03, ms=5.0)], dense_ms=10.0, design_length=2**19)
    assert choice.settings.path == "auto"
    design = IndexerShape(**GEOMETRY, queries=16384)
    assert choice.settings.min_keys != crossover_length(3, 0.03, design, CONSTANTS)


def test_a_plan_picks_the_list_size_of_its_fastest_measurement():
    # The same budget measured with the default lists and with lists of 1 and 2 (the union of fewer
    # queries survives less): the fastest measured call wins, and its list size reaches the settings.
    measured = [candidate(15, 0.10, ms=8.0), candidate(15, 0.07, ms=6.0, lists=2),
                candidate(15, 0.05, ms=7.0, lists=1), candidate(7, 0.2, ms=9.0)]
    choice = choose(measured, dense_ms=10.0)
    assert choice.settings.path == "auto" and (choice.settings.r, choice.settings.list_queries) == (15, 2)
    assert choice.reason.startswith("r=15 lists of 2 predicted")
    # Where the default lists are the fastest, the plan keeps them (None: the pipeline's default).
    default = choose([candidate(15, 0.10, ms=5.0), candidate(15, 0.07, ms=6.0, lists=2)], dense_ms=10.0)
    assert (default.settings.r, default.settings.list_queries) == (15, None)
    lost = choose([candidate(15, 0.1, ms=12.0), candidate(15, 0.1, ms=11.0, lists=1)], dense_ms=10.0)
    assert lost.settings.path == "dense" and "r=15 lists of 1 1.10x" in lost.reason


def test_a_plan_picks_the_witnesses_of_its_fastest_measurement():
    # The best (r, list size) measured again with witnesses off and on: the fastest wins, and its
    # witnesses reach the settings; on a tie the runtime's default (None) is kept.
    measured = [candidate(15, 0.07, ms=6.0, lists=2), candidate(15, 0.07, ms=5.0, lists=2, witnesses=False),
                candidate(15, 0.07, ms=6.5, lists=2, witnesses=True)]
    choice = choose(measured, dense_ms=10.0)
    assert (choice.settings.r, choice.settings.list_queries, choice.settings.witnesses) == (15, 2, False)
    assert choice.reason.startswith("r=15 lists of 2 without witnesses predicted")
    on = choose([measured[0], dataclasses.replace(measured[2], ms=5.0)], dense_ms=10.0)
    assert on.settings.witnesses is True and on.reason.startswith("r=15 lists of 2 with witnesses predicted")
    tie = choose([dataclasses.replace(m, ms=5.0) for m in reversed(measured)], dense_ms=10.0)
    assert tie.settings.witnesses is None
