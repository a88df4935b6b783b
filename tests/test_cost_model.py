"""The cost model against hand-computed cases and a brute-force sum over queries."""
import dataclasses
import json
from pathlib import Path

import pytest
import sympy

from compiler.cost_model import (CPU_REFERENCE, H200_FITTED, IndexerShape, KernelConstants, T,
                                 amdahl_speedup, assumed_budget, candidate_rs, certified_call_time, choose_layer,
                                 crossover_length, default_choice, dense_call_time, screen_rows)

# Unit rates and no fixed costs: every term of the work model is a count that can be done by hand.
UNIT = KernelConstants(dense_macs_per_s=1.0, screen_macs_per_s=1.0, refine_macs_per_s=1.0,
                       select_keys_per_s=1.0, plan_s_per_query=0.0, dense_fixed_s=0.0,
                       certified_fixed_s=0.0, screen_tile=1, screen_pow2=False,
                       source="hand-computed test rates")
# H = 8, D = 1, N0 = topk = 1, one anchor per 8 queries: dense(n) = 9n and, for r = 1 (2 screen rows),
# certified(n) = n (anchor) + 8 (seed) + 2(n-1) (screen) + 8m(n-1) (refine) + 1 + m(n-1) (select).
CHUNK = IndexerShape(heads=8, head_dim=1, topk=1, queries=1, sink=0, window=0, anchor_stride=8)
PREFILL = dataclasses.replace(CHUNK, queries=None)


def brute_force_times(shape, c, r, m, length):
    """Sum the per-query model over every query of a call, one query at a time."""
    hd = shape.heads * shape.head_dim
    lo = 1 if shape.queries is None else length - shape.queries + 1
    dense = cert = 0.0
    for n in range(lo, length + 1):
        d = n * hd / c.dense_macs_per_s + n / c.select_keys_per_s
        dense += d
        if n <= shape.n0:
            cert += d
            continue
        s = n - shape.n0
        cert += (c.plan_s_per_query + n * hd / (shape.anchor_stride * c.dense_macs_per_s)
                 + shape.n0 * hd / c.refine_macs_per_s
                 + s * screen_rows(r, c) * shape.head_dim / c.screen_macs_per_s
                 + m * s * hd / c.refine_macs_per_s + (shape.n0 + m * s) / c.select_keys_per_s)
    return (c.dense_fixed_s + shape.batch * dense, c.certified_fixed_s + shape.batch * cert)


def padded(tile, pow2):
    return dataclasses.replace(UNIT, screen_tile=tile, screen_pow2=pow2)


def test_screen_rows_pad_r_plus_the_aux_row_to_the_tile_and_power_of_two():
    assert screen_rows(1, UNIT) == 2 and screen_rows(6, UNIT) == 7
    assert screen_rows(15, padded(16, False)) == 16 and screen_rows(16, padded(16, False)) == 32
    assert screen_rows(4, padded(1, True)) == 8 and screen_rows(7, padded(1, True)) == 8
    assert screen_rows(1, padded(16, True)) == 16 and screen_rows(16, padded(16, True)) == 32


def test_candidate_budgets_fill_their_padded_rows_and_stay_below_the_head_count():
    assert candidate_rs(64, padded(16, False)) == [15, 31, 47, 63]
    assert candidate_rs(64, padded(1, True)) == [1, 3, 7, 15, 31, 63]
    assert candidate_rs(32, H200_FITTED) == [1, 3, 7, 15, 31]
    assert candidate_rs(8, UNIT) == [1, 2, 3, 4, 5, 6, 7]
    assert candidate_rs(8, padded(16, False)) == []


def test_chunk_call_times_match_the_hand_computed_polynomials():
    assert sympy.simplify(dense_call_time(CHUNK, UNIT) - 9 * T) == 0
    # m = 0: n + 8 + 2(n - 1) + 1 = 3n + 7.
    assert sympy.simplify(certified_call_time(1, 0.0, CHUNK, UNIT) - (3 * T + 7)) == 0


def test_prefill_call_times_match_the_hand_computed_polynomials():
    # dense: sum_{n=1..T} 9n; certified: 9 (query 1 is dense) + sum_{n=2..T} (3n + 7) = 1.5T^2 + 8.5T - 1.
    assert sympy.expand(dense_call_time(PREFILL, UNIT) - sympy.Rational(9, 2) * T * (T + 1)) == 0
    expected = sympy.Rational(3, 2) * T**2 + sympy.Rational(17, 2) * T - 1
    assert sympy.expand(certified_call_time(1, 0.0, PREFILL, UNIT) - expected) == 0


@pytest.mark.parametrize("shape", [CHUNK, PREFILL, dataclasses.replace(CHUNK, queries=5, batch=3)])
@pytest.mark.parametrize("c", [UNIT, CPU_REFERENCE, H200_FITTED])
def test_symbolic_call_times_equal_the_brute_force_sum_over_queries(shape, c):
    for length in (40, 97):
        dense, cert = brute_force_times(shape, c, 5, 0.25, length)
        assert float(dense_call_time(shape, c).subs(T, length)) == pytest.approx(dense, rel=1e-12)
        assert float(certified_call_time(5, 0.25, shape, c).subs(T, length)) == pytest.approx(cert, rel=1e-12)


def test_crossover_of_a_chunk_is_the_first_length_strictly_past_the_root():
    fixed = dataclasses.replace(UNIT, certified_fixed_s=100.0)
    # m = 0: 107 + 3T < 9T  <=>  T > 17.83.
    assert crossover_length(1, 0.0, CHUNK, fixed) == 18
    # m = 1/2, fixed 101: 103.5 + 7.5T < 9T  <=>  T > 69; at T = 69 the paths tie, so certified starts at 70.
    assert crossover_length(1, 0.5, CHUNK, dataclasses.replace(UNIT, certified_fixed_s=101.0)) == 70


def test_crossover_of_a_prefill_solves_the_quadratic():
    fixed = dataclasses.replace(UNIT, certified_fixed_s=100.0)
    # 1.5T^2 + 8.5T + 99 < 4.5T^2 + 4.5T  <=>  T > (4 + sqrt(1204)) / 6 = 6.45...
    assert crossover_length(1, 0.0, PREFILL, fixed) == 7
    for length in (6, 7):
        dense, cert = brute_force_times(PREFILL, fixed, 1, 0.0, length)
        assert (cert < dense) == (length == 7)


def test_crossover_never_precedes_the_lengths_where_queries_can_be_screened():
    # Without fixed costs certified wins from the first screened key: T >= N0 + queries.
    assert crossover_length(1, 0.0, CHUNK, UNIT) == 2
    assert crossover_length(1, 0.0, dataclasses.replace(CHUNK, queries=7), UNIT) == 8


def test_no_crossover_when_survivors_cost_more_than_the_screen_saves():
    # Slope 3 + 9m >= 9 for m >= 2/3: dense stays cheaper at every length.
    assert crossover_length(1, 0.75, CHUNK, UNIT) is None
    assert crossover_length(1, 0.9, PREFILL, UNIT) is None
    assert crossover_length(1, 0.625, CHUNK, UNIT) is not None


def test_choice_is_dense_when_the_design_length_is_short_and_certified_when_long():
    fixed = dataclasses.replace(UNIT, certified_fixed_s=100.0)
    short = choose_layer({1: 0.0}, CHUNK, fixed, design_length=17)
    long = choose_layer({1: 0.0}, CHUNK, fixed, design_length=1000)
    assert (short.path, short.r, short.crossover) == ("dense", None, None)
    assert (long.path, long.r, long.crossover) == ("certified", 1, 18)
    assert long.predicted_pruned_frac == 1.0
    assert long.predicted_speedup == pytest.approx(9000 / (100 + 3 * 1000 + 7))


def test_choice_is_dense_when_every_measured_budget_prunes_too_little():
    choice = choose_layer({1: 0.95, 2: 0.9, 3: 0.8}, CHUNK, UNIT, design_length=10**6)
    assert choice.path == "dense" and choice.r is None and choice.predicted_speedup == 1.0


def test_choice_takes_the_budget_with_the_lowest_predicted_time():
    # Per-key slopes (anchor 1 + rows r + 1 + 9m): r=1: 7.5; r=2: 4 + 0.9 = 4.9; r=4: 6.
    choice = choose_layer({1: 0.5, 2: 0.1, 4: 0.0}, CHUNK, UNIT, design_length=1000)
    assert choice.r == 2 and choice.predicted_pruned_frac == pytest.approx(0.9)


def test_choice_breaks_ties_towards_the_smaller_budget():
    # With a screen tile of 4, r = 1 and r = 2 both pad to 4 rows: equal m gives equal times.
    tiled = dataclasses.replace(UNIT, screen_tile=4)
    assert choose_layer({2: 0.25, 1: 0.25}, CHUNK, tiled, design_length=1000).r == 1


def test_budgets_at_or_above_the_head_count_are_never_chosen():
    assert choose_layer({8: 0.0}, CHUNK, UNIT, design_length=1000).path == "dense"


def test_assumed_budget_is_the_first_aligned_budget_of_at_least_four_heads():
    assert assumed_budget(64, padded(16, False)) == 15
    assert assumed_budget(64, H200_FITTED) == 7
    assert assumed_budget(64, UNIT) == 4
    assert assumed_budget(4, UNIT) is None
    assert assumed_budget(8, padded(16, False)) is None


def test_default_choice_leaves_r_to_the_runtime_and_predicts_a_crossover():
    shape = IndexerShape(heads=64, head_dim=128, topk=2048)
    choice = default_choice(shape, H200_FITTED, 131072)
    assert choice.path == "certified" and choice.r is None
    assert shape.n0 < choice.crossover < 131072
    no_budget = padded(16, False)
    assert default_choice(IndexerShape(heads=8, head_dim=128, topk=2048), no_budget, 131072).path == "dense"


def test_amdahl_matches_hand_values():
    assert amdahl_speedup(0.9, 10.0) == pytest.approx(1 / 0.19)
    assert amdahl_speedup(0.0, 5.0) == 1.0
    assert amdahl_speedup(1.0, 2.5) == pytest.approx(2.5)


@pytest.mark.parametrize("bad", [{"dense_macs_per_s": 0.0}, {"plan_s_per_query": -1.0},
                                 {"screen_tile": 0}, {"select_keys_per_s": float("inf")}])
def test_constants_reject_non_physical_values_naming_the_field(bad):
    field = next(iter(bad))
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(UNIT, **bad)


def test_constants_round_trip_through_a_dict_and_reject_unknown_keys():
    assert KernelConstants.from_dict(UNIT.to_dict()) == UNIT
    with pytest.raises(ValueError, match="unknown keys"):
        KernelConstants.from_dict({**UNIT.to_dict(), "warp_size": 32})


def test_bad_arguments_are_rejected_naming_them():
    with pytest.raises(ValueError, match="m: "):
        crossover_length(1, 1.5, CHUNK, UNIT)
    with pytest.raises(TypeError, match="IndexerShape.heads"):
        IndexerShape(heads=8.0, head_dim=1, topk=1)
    with pytest.raises(ValueError, match="fraction"):
        amdahl_speedup(1.2, 2.0)


def test_h200_constants_reproduce_the_indexer_benchmark_within_thirty_percent():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "indexer_h200.json"
    rows = {}
    for row in json.loads(path.read_text())["rows"]:
        if row["input"] == "structured" and row["method"] in ("triton_dense", "certified_forced"):
            rows.setdefault((row["H"], row["S"], row["T"], row["D"], row["topk"]), {})[row["method"]] = row
    checked = 0
    for (H, S, length, D, topk), methods in rows.items():
        if len(methods) < 2:
            continue
        shape = IndexerShape(heads=H, head_dim=D, topk=topk, queries=S)
        # The benchmark's certified path: default budget rule (few positive heads: r = 4, 8 padded rows).
        m = methods["certified_forced"]["survivors_per_query"] / (length - S / 2 - shape.n0)
        dense = float(dense_call_time(shape, H200_FITTED).subs(T, length)) * 1e3
        cert = float(certified_call_time(4, m, shape, H200_FITTED).subs(T, length)) * 1e3
        assert dense == pytest.approx(methods["triton_dense"]["ms"], rel=0.3)
        assert cert == pytest.approx(methods["certified_forced"]["ms"], rel=0.3)
        checked += 1
    assert checked >= 6
