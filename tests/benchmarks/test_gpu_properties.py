"""benchmarks/gpu_properties.py runs on the CPU (--smoke: the op's plain-torch reference), and its
cases cover what the GPU run is for: every budget r, ties, non-finite values, empty mask rows."""
import json

from benchmarks import gpu_properties


def test_smoke_run_times_first_calls_and_finds_certified_equal_to_dense(tmp_path):
    out = tmp_path / "props.json"
    assert gpu_properties.main(["--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    for stage in result["first_calls"].values():
        assert not stage["timed_out"] and stage["exit_code"] == 0
        assert len(stage["calls"]) == 2 * len(gpu_properties.SMOKE_FIRST_CALL_SHAPES)
        assert all(c["identical"] for c in stage["calls"] if c["path"] == "certified")
    props = result["properties"]
    assert props["cases"] >= 20 and props["mismatches"] == props["errors"] == props["failed_workers"] == 0
    assert props["shapes"] == sum(-(-w["cases"] // gpu_properties.GROUP_CASES) for w in props["workers"])
    assert sum(c["cases"] for tag, c in props["by_category"].items() if tag.startswith("dtype=")) == props["cases"]


def test_cases_are_reproducible_and_adversarial():
    tags = set()
    for seed in range(300):
        (q, k, w, topk, mask, r), case_tags = gpu_properties.draw_case(seed, "float32", 4, 8, "cpu", smoke=True)
        tags.update(case_tags)
        assert q.shape[2:] == (4, 8) and w.shape == q.shape[:3] and k.shape[0] == q.shape[0]
    again, _ = gpu_properties.draw_case(7, "float32", 4, 8, "cpu", smoke=True)
    first, _ = gpu_properties.draw_case(7, "float32", 4, 8, "cpu", smoke=True)
    assert all((a is None and b is None) or a.equal(b) for a, b in zip(first, again) if not isinstance(a, int))
    wanted = {f"r={r}" for r in (-1, 1, 2, 3, 4)} | {"values=ties", "values=relu_zeros", "values=repeated_keys",
                                                     "mask=none", "mask=bool", "mask=additive", "empty_rows",
                                                     "nonfinite_q", "nonfinite_k", "nonfinite_weights",
                                                     "nonfinite_mask", "topk>=T", "bias=integers"}
    assert wanted <= tags


def test_a_group_of_cases_shares_its_shape_and_draws_everything_else_afresh():
    def case(seed, shape_seed=None):
        return gpu_properties.draw_case(seed, "bfloat16", 4, 8, "cpu", True, shape_seed)

    (q0, k0, _, topk0, _, _), _ = case(40)
    (q1, k1, _, topk1, _, _), _ = case(40, shape_seed=40)
    assert q0.equal(q1) and k0.equal(k1) and topk0 == topk1  # a group's first case is the case of its seed
    shapes, values = set(), set()
    for seed in range(41, 41 + 30):
        (q, k, w, topk, mask, r), _ = case(seed, shape_seed=40)
        shapes.add((tuple(q.shape), tuple(k.shape), topk))
        values.add((q.float().sum().item(), r, None if mask is None else mask.dtype))
    assert shapes == {(tuple(q0.shape), tuple(k0.shape), topk0)} and len(values) > 20
    assert len({case(seed)[0][0].shape for seed in range(41, 71)}) > 1  # without a group: shapes vary


def test_a_worker_keeps_its_tally_on_disk_as_it_goes(tmp_path, monkeypatch):
    """A worker stopped past the deadline (in a compilation) is counted from the tally it wrote last."""
    monkeypatch.setattr(gpu_properties, "TALLY_EVERY_S", 0.0)
    path = tmp_path / "worker.json"
    tally = gpu_properties.property_worker(("float32", 2, 8), 3, float("inf"), 0, "cpu", True, path)
    assert tally["cases"] == 3
    assert json.loads(path.read_text())["cases"] == 2  # written before the third case


def test_a_first_call_process_past_its_timeout_is_stopped_and_reported(tmp_path):
    import os

    result = gpu_properties.run_first_calls(gpu_properties.SMOKE_FIRST_CALL_SHAPES, "cpu", dict(os.environ), 0.2)
    assert result["timed_out"] and result["exit_code"] is None and "stderr_tail" in result
    assert result["wall_s"] < 0.2 + gpu_properties.STACK_DUMP_S + 5


def test_workers_past_the_deadline_are_all_cut_at_one_time(monkeypatch):
    """The stage ends WORKER_GRACE_S after its deadline, not a grace per worker."""
    import os
    import time

    monkeypatch.setattr(gpu_properties, "WORKER_GRACE_S", 1.0)
    monkeypatch.setattr(gpu_properties, "STACK_DUMP_S", 0.5)
    classes = gpu_properties.SMOKE_CLASSES * 3
    start = time.perf_counter()
    tallies = gpu_properties.run_workers(classes, 10_000, 0.1, "cpu", True, 0, dict(os.environ))
    assert len(tallies) == len(classes)
    assert time.perf_counter() - start < 0.1 + 1.0 + 0.5 + 3.0  # a grace per worker would take >= 6 s


def test_an_overdue_worker_is_asked_for_its_stacks_before_it_is_stopped(tmp_path):
    import sys
    import time

    child = ("import faulthandler, signal, time; faulthandler.register(signal.SIGUSR1); "
             "print('ready', flush=True); time.sleep(120)")
    out, err = tmp_path / "out", tmp_path / "err"
    proc = gpu_properties.start_child([sys.executable, "-c", child], {}, out, err)
    while "ready" not in out.read_text():
        time.sleep(0.05)
    quick = gpu_properties.start_child([sys.executable, "-c", "pass"], {}, tmp_path / "o2", tmp_path / "e2")
    start = time.perf_counter()
    assert gpu_properties.stop_overdue([proc, quick], time.time() + 1.0) == [proc]
    assert time.perf_counter() - start < 1.0 + gpu_properties.STACK_DUMP_S + 2.0
    assert proc.returncode is not None and "Current thread" in err.read_text()


def test_compile_bound_classes_get_more_workers():
    workers = gpu_properties.worker_classes(gpu_properties.CLASSES)
    for klass in gpu_properties.CLASSES:
        want = 1 if klass[0] == "float32" else gpu_properties.LOW_PRECISION_WORKERS
        assert workers.count(klass) == want
