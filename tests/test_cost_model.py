"""The cost model against hand-computed cases and a brute-force sum over queries."""
import dataclasses
import json
import math
from pathlib import Path

import pytest
import sympy

from compiler.cost_model import (CPU_REFERENCE, H200_FITTED, IndexerShape, KernelConstants, T, candidate_rs,
                                 certified_call_time, crossover_length, default_min_keys, dense_call_time, predicted_ratio,
                                 screen_rows)
from benchmarks import fit_cost_model
from runtime.defaults import SAMPLE_PER_KEYS

# Unit rates and no fixed costs: every term of the work model is a count that can be done by hand.
UNIT = KernelConstants(dense_macs_per_s=1.0, screen_macs_per_s=1.0, refine_macs_per_s=1.0,
                       select_keys_per_s=1.0, plan_s_per_query=0.0, dense_fixed_s=0.0,
                       certified_fixed_s=0.0, screen_tile=1, screen_pow2=False,
                       source="hand-computed test rates")
# H = 8, D = 1, N0 = topk = 1, no sample, a chunk of 8 queries with one anchor: per query dense(n) = 9n
# and, for r = 1 (2 screen rows), certified(n) = n (1/8 anchor) + 8 (seed) + 2(n-1) (screen)
# + 8m(n-1) (refine) + 1 + m(n-1) (select). The chunk's queries see n = T-7 .. T keys.
CHUNK = IndexerShape(heads=8, head_dim=1, topk=1, queries=8, sink=0, window=0, anchor_stride=8, sample=False)
PREFILL = dataclasses.replace(CHUNK, queries=None)


def brute_force_times(shape, c, r, m, length, redo=0.0):
    """Sum the per-query model over every query of a call, one query at a time."""
    hd = shape.heads * shape.head_dim
    lo = 1 if shape.queries is None else length - shape.queries + 1
    anchors = 1 / shape.anchor_stride if shape.queries is None else \
        math.ceil(shape.queries / shape.anchor_stride) / shape.queries
    sample = length / SAMPLE_PER_KEYS if shape.sample else 0
    dense = cert = 0.0
    for n in range(lo, length + 1):
        d = n * hd / c.dense_macs_per_s + n / c.select_keys_per_s
        dense += d
        if n <= shape.n0:
            cert += d
            continue
        s = n - shape.n0
        cert += (c.plan_s_per_query + anchors * n * hd / c.dense_macs_per_s
                 + (shape.n0 + sample) * hd / c.refine_macs_per_s
                 + s * screen_rows(r, c) * shape.head_dim / c.screen_macs_per_s
                 + m * s * hd / c.refine_macs_per_s + (shape.n0 + m * s) / c.select_keys_per_s + redo * d)
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
    assert sympy.simplify(dense_call_time(CHUNK, UNIT) - (72 * T - 252)) == 0  # 9 (8T - 28)
    # m = 0: sum of 3n + 7 over the 8 queries.
    assert sympy.simplify(certified_call_time(1, 0.0, CHUNK, UNIT) - (24 * T - 28)) == 0
    # A chunk of one query is its own anchor: dense scoring plus every certified stage.
    one = dataclasses.replace(CHUNK, queries=1)
    assert sympy.simplify(certified_call_time(1, 0.0, one, UNIT) - (10 * T + 7)) == 0
    # Redone queries pay dense scoring on top; a scale multiplies the whole call.
    assert sympy.simplify(certified_call_time(1, 0.0, CHUNK, UNIT, redo=0.5) - (24 * T - 28 + 36 * T - 126)) == 0
    assert sympy.simplify(certified_call_time(1, 0.0, CHUNK, UNIT, scale=2.0) - 2 * (24 * T - 28)) == 0


def test_prefill_call_times_match_the_hand_computed_polynomials():
    # dense: sum_{n=1..T} 9n; certified: 9 (query 1 is dense) + sum_{n=2..T} (3n + 7) = 1.5T^2 + 8.5T - 1.
    assert sympy.expand(dense_call_time(PREFILL, UNIT) - sympy.Rational(9, 2) * T * (T + 1)) == 0
    expected = sympy.Rational(3, 2) * T**2 + sympy.Rational(17, 2) * T - 1
    assert sympy.expand(certified_call_time(1, 0.0, PREFILL, UNIT) - expected) == 0


@pytest.mark.parametrize("shape", [CHUNK, PREFILL, dataclasses.replace(CHUNK, queries=5, batch=3),
                                   dataclasses.replace(CHUNK, sample=True, queries=20)])
@pytest.mark.parametrize("c", [UNIT, CPU_REFERENCE, H200_FITTED])
def test_symbolic_call_times_equal_the_brute_force_sum_over_queries(shape, c):
    for length in (40, 97):
        dense, cert = brute_force_times(shape, c, 5, 0.25, length, redo=0.125)
        assert float(dense_call_time(shape, c).subs(T, length)) == pytest.approx(dense, rel=1e-12)
        got = float(certified_call_time(5, 0.25, shape, c, redo=0.125).subs(T, length))
        assert got == pytest.approx(cert, rel=1e-12)


def test_crossover_of_a_chunk_is_the_first_length_strictly_past_the_root():
    # m = 0, fixed 1000: 1000 + 24T - 28 < 72T - 252  <=>  T > 25.5.
    assert crossover_length(1, 0.0, CHUNK, dataclasses.replace(UNIT, certified_fixed_s=1000.0)) == 26
    # m = 1/2 (60T - 190), fixed 130: 12T > 192; at T = 16 the paths tie, so certified starts at 17.
    assert crossover_length(1, 0.5, CHUNK, dataclasses.replace(UNIT, certified_fixed_s=130.0)) == 17
    # A measured scale of 3 (72T - 84 + 3000 < 72T - 252 never): no crossover.
    assert crossover_length(1, 0.0, CHUNK, dataclasses.replace(UNIT, certified_fixed_s=1000.0), scale=3.0) is None


def test_crossover_of_a_prefill_solves_the_quadratic():
    fixed = dataclasses.replace(UNIT, certified_fixed_s=100.0)
    # 1.5T^2 + 8.5T + 99 < 4.5T^2 + 4.5T  <=>  T > (4 + sqrt(1204)) / 6 = 6.45...
    assert crossover_length(1, 0.0, PREFILL, fixed) == 7
    for length in (6, 7):
        dense, cert = brute_force_times(PREFILL, fixed, 1, 0.0, length)
        assert (cert < dense) == (length == 7)


def test_crossover_never_precedes_the_lengths_where_queries_can_be_screened():
    # Without fixed costs certified wins from the first screened key: T >= N0 + queries.
    assert crossover_length(1, 0.0, CHUNK, UNIT) == 9
    assert crossover_length(1, 0.0, dataclasses.replace(CHUNK, queries=7), UNIT) == 8


def test_no_crossover_when_survivors_cost_more_than_the_screen_saves():
    # Slope 3 + 9m >= 9 for m >= 2/3: dense stays cheaper at every length.
    assert crossover_length(1, 0.75, CHUNK, UNIT) is None
    assert crossover_length(1, 0.9, PREFILL, UNIT) is None
    assert crossover_length(1, 0.625, CHUNK, UNIT) is not None


def test_predicted_ratio_is_certified_over_dense_time_at_one_length():
    assert predicted_ratio(1000, 1, 0.0, CHUNK, UNIT) == pytest.approx((24 * 1000 - 28) / (72 * 1000 - 252))
    assert predicted_ratio(1000, 1, 0.0, CHUNK, UNIT, scale=2.0) == pytest.approx(2 * (24 * 1000 - 28) / (72 * 1000 - 252))


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
    with pytest.raises(ValueError, match="redo: expected a fraction"):
        certified_call_time(1, 0.5, CHUNK, UNIT, redo=1.5)
    with pytest.raises(ValueError, match="scale"):
        certified_call_time(1, 0.5, CHUNK, UNIT, scale=0.0)


def test_h200_constants_reproduce_the_committed_h200_measurements():
    """H200_FITTED predicts every dense op of the roofline within 30%, and the zoo's certified calls
    (plan calibrations and best fixed budgets) with a relative rms error under 0.2."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    roofline = json.loads((results / "dense_roofline_h200.json").read_text())
    dense_rows = [row for row in roofline["rows"] if row["method"] == "dense"]
    for row in dense_rows:
        shape = IndexerShape(heads=row["H"], head_dim=row["D"], topk=row["topk"], queries=row["S"])
        assert float(dense_call_time(shape, H200_FITTED).subs(T, row["T"])) * 1e3 == pytest.approx(row["ms"], rel=0.3)
    zoo = json.loads((results / "indexer_zoo_h200.json").read_text())
    sizes = zoo["sizes"]
    shape = lambda S: IndexerShape(heads=sizes["H"], head_dim=sizes["D"], topk=sizes["topk"], queries=S)  # noqa: E731
    errors = [float(certified_call_time(p["r"], p["m"], shape(p["S"]), H200_FITTED, redo=p["redo"]).subs(T, p["T"]))
              * 1e3 / p["ms"] - 1.0 for p in fit_cost_model.certified_points(zoo)]
    assert len(dense_rows) >= 6 and len(errors) >= 40
    assert math.sqrt(sum(e * e for e in errors) / len(errors)) < 0.2


def test_default_min_keys_follows_the_call_shape():
    prefill = default_min_keys(64, 128, 2048, None, "cuda")
    chunk = default_min_keys(64, 128, 2048, 4096, "cuda")
    assert 2048 < min(chunk, prefill) and max(chunk, prefill) < 131072 and chunk != prefill
    assert default_min_keys(64, 128, 2048, 1, "cuda") is None  # one query is its own anchor: never pays
    assert default_min_keys(2, 128, 2048, None, "cuda") is None  # no aligned budget of 4 heads below 2
