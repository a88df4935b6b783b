"""benchmarks/dense_roofline.py runs end to end on the CPU (interpreter sizes): the sweep's checks
hold (same codes for every scan step, bitwise row lists), and the grid's and decode rows check out."""
import json
import time

import pytest

from benchmarks import dense_roofline


@pytest.fixture(autouse=True)
def one_timed_call(monkeypatch):
    """Time one call instead of a median (the interpreter is slow; the checks are what is tested);
    the module state ``main(--smoke)`` changes is restored afterwards."""
    for name in ("H", "D", "TOPK", "DEVICE"):
        monkeypatch.setattr(dense_roofline, name, getattr(dense_roofline, name))
    monkeypatch.setattr(dense_roofline.scorer, "SEQUENTIAL", dense_roofline.scorer.SEQUENTIAL)
    def once(fn, reps=1, warmup=0):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    monkeypatch.setattr(dense_roofline, "timed", once)


def test_the_sweep_runs_and_its_checks_hold(tmp_path, monkeypatch):
    monkeypatch.setattr(dense_roofline, "FORMS", dense_roofline.FORMS[:1])
    monkeypatch.setattr(dense_roofline, "SCAN_STEPS", [(4, 1024), (8, 4096)])
    monkeypatch.setattr(dense_roofline, "FP32_CONFIGS", dense_roofline.FP32_CONFIGS[:1])
    out = tmp_path / "sweep.json"
    assert dense_roofline.main(["--smoke", "--sweep", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["kind"] for r in rows} == {"scorer_form", "mask_scan", "fp32_tf32"}
    assert not [r for r in rows if "error" in r]
    assert all(r["same_codes"] in (True, None) for r in rows if r["kind"] == "mask_scan")
    assert all(r["row_list_bitwise"] for r in rows if "row_list_bitwise" in r)
    assert "op_ratio" in [r for r in rows if r["kind"] == "fp32_tf32"][0]


def test_the_grid_times_dense_the_torch_baseline_and_decode(tmp_path):
    """The grid's rows, then the decode rows (one query, and 3), scored densely and identical, and
    the transformers indexer's own decode beside them."""
    out = tmp_path / "grid.json"
    assert dense_roofline.main(["--smoke", "--no-structured", "--S", "8", "--T", "512", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    by_method = {r["method"]: r for r in rows if r["method"] != "decode"}
    assert by_method["dense"]["identical"] and "error" not in by_method["torch_gemm_topk"]
    assert 0.5 <= by_method["torch_gemm_topk"]["same_index_fraction"] <= 1.0
    decode = [r for r in rows if r["method"] == "decode"]
    assert [r["B"] for r in decode] == [1, 3] and all(r["identical"] for r in decode)
    assert all(0.5 <= r["stock_same_index_fraction"] <= 1.0 and r["stock_ms"] > 0 for r in decode)
    assert all(r[f"{form}_loop_ms"] > 0 for r in decode for form in ("op", "dense", "stock"))
