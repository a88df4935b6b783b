"""benchmarks/harness.py on the CPU: timing, the bitwise check, the results header, the tables."""
import json
import time

import torch

from benchmarks import harness


def test_measure_times_every_call_after_the_warm_up_and_keeps_the_last_result():
    calls = []
    timing = harness.measure(lambda: calls.append(len(calls)) or len(calls), "cpu", reps=3, warmup=2,
                             before=lambda: calls.append("before"))
    assert calls.count("before") == 3 and len(calls) == 2 + 3 + 3
    assert len(timing.times) == 3 and timing.ms == sorted(timing.times)[1] and timing.peak_gib is None
    assert timing.out == len(calls)


def test_a_budget_stops_after_the_minimum_of_calls():
    timing = harness.measure(lambda: time.sleep(0.01), "cpu", reps=100, warmup=0, budget_s=0.0, min_reps=2)
    assert len(timing.times) == 2 and all(t >= 10 for t in timing.times)


def test_identical_compares_the_bits_of_values_and_indices():
    values = torch.tensor([1.0, -0.0, float("nan")])
    indices = torch.tensor([3, 1, 2])
    assert harness.identical((values, indices), (values.clone(), indices.clone()))
    assert not harness.identical((torch.tensor([1.0, 0.0, float("nan")]), indices), (values, indices))
    assert not harness.identical((values, indices), (values, indices.flip(0)))
    assert not harness.identical(values, values.double())


def test_same_pairs_takes_each_row_in_any_order_but_every_pair_to_the_bit():
    values = torch.tensor([[3.0, 2.0, -0.0], [5.0, 4.0, 1.0]])
    indices = torch.tensor([[7, 1, 4], [0, 9, 2]])
    order = torch.tensor([[2, 0, 1], [1, 2, 0]])
    shuffled = (values.gather(-1, order), indices.gather(-1, order))
    assert harness.same_pairs(shuffled, (values, indices))
    assert not harness.same_pairs((values.abs(), indices), (values, indices))  # -0.0 against 0.0
    swapped = indices.clone()
    swapped[0, :2] = swapped[0, :2].flip(0)  # the same indices, paired with other values
    assert not harness.same_pairs((values, swapped), (values, indices))
    assert not harness.same_pairs((values[:, :2], indices[:, :2]), (values, indices))


def test_results_carry_the_device_and_versions_and_a_table_beside_them(tmp_path, capsys):
    doc = harness.header("cpu", rows=[{"S": 4, "ms": 1.23456}, {"S": 8, "error": "x"}])
    assert doc["device"].startswith("cpu") and doc["versions"]["torch"] == torch.__version__
    assert "python" in doc["versions"] and harness.versions_of(doc) == doc["versions"]
    assert harness.versions_of({"torch": "2", "triton": "3"}) == {"torch": "2", "triton": "3"}
    table = harness.rows_table(doc["rows"])
    assert table.splitlines() == ["| S | ms | error |", "|---|---|---|", "| 4 | 1.235 | - |", "| 8 | - | x |"]
    path = harness.write_results(tmp_path / "r" / "out.json", doc, table)
    assert json.loads(path.read_text()) == doc and path.with_suffix(".md").read_text() == table + "\n"
    assert table in capsys.readouterr().out
    assert harness.ceilings("cpu") == {} and harness.graph_ms(lambda: None, "cpu") is None
    assert harness.loop_ms(lambda: None, "cpu", calls=3) >= 0


def test_settle_guard_calls_until_the_layer_s_guard_has_decided():
    """The op with default settings on the CPU: the guard's warm-ups, trials and rungs take more
    than one call, and settle_guard stops at the first call after which the layer is decided."""
    from compiler.ops.guard import GUARD

    GUARD.reset()
    g = torch.Generator().manual_seed(0)
    q, k, w = torch.randn(1, 64, 8, 16, generator=g), torch.randn(1, 1024, 16, generator=g), torch.rand(1, 64, 8, generator=g)
    decided = []

    def call():
        torch.ops.pulsar_dosa.certified_topk(q, k, w, 16, layer="settle", min_keys=0)
        decided.append(GUARD.summaries()["settle"][0]["path"] != "undecided")

    calls = harness.settle_guard(call, "cpu", layer="settle")
    assert calls == len(decided) and calls >= 4 and decided[-1] and not any(decided[:-1])
    GUARD.reset()


def test_issue_ms_is_the_median_host_time_of_one_call():
    pauses = iter([0.001, 0.030, 0.002])
    assert 1 <= harness.issue_ms(lambda: time.sleep(next(pauses)), "cpu", reps=3) < 25


def _slow_step():
    time.sleep(0.002)


def test_host_profile_puts_a_call_s_host_time_in_the_function_that_spends_it():
    def call():
        _slow_step()
        _slow_step()

    prof = harness.host_profile(call, "cpu", calls=5, top=3)
    assert prof["us_per_call"] >= 4000 and len(prof["functions"]) == 3
    sleep, = [f for f in prof["functions"] if "sleep" in f["function"]]
    assert sleep["per_call"] == 2 and sleep["own_us"] >= 4000
    step, = [f for f in prof["functions"] if "_slow_step" in f["function"]]
    assert step["function"].startswith("tests/benchmarks/test_harness.py:") and step["cum_us"] >= 4000


def test_notes_lines_are_a_bullet_a_note():
    assert harness.notes_lines({"rows": []}) == []
    assert harness.notes_lines({"notes": ["one", "two"]}) == ["- one", "- two"]
