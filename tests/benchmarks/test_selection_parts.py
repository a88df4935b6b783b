"""benchmarks/selection_parts.py runs on the CPU (interpreter sizes) and its checks hold."""
import json
import time

import pytest

from benchmarks import dense_roofline, harness, selection_parts


@pytest.fixture(autouse=True)
def one_timed_call(monkeypatch):
    """Time one call instead of a median of 5 (the interpreter is slow; the checks are what is
    tested): every timed part still runs."""
    def once(fn, reps, device="cuda"):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    monkeypatch.setattr(harness, "median_ms", once)


def test_selection_parts_smoke(tmp_path, monkeypatch):
    for name in ("H", "D", "DEVICE"):  # main(--smoke) sets the roofline module's sizes: restored after
        monkeypatch.setattr(dense_roofline, name, getattr(dense_roofline, name))
    monkeypatch.setattr(dense_roofline.scorer, "SEQUENTIAL", dense_roofline.scorer.SEQUENTIAL)
    out = tmp_path / "parts.json"
    assert selection_parts.main(["--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["identical_to_torch_topk"] and result["compaction_same_for_every_form"]
    assert result["final_window_same"] and result["overflow_rows"] == 0
    assert {f"compact_tile_{t}" for t in selection_parts.TILES} <= set(result)
    assert {f"compact_segments_{g}" for g in selection_parts.SEGMENTS} <= set(result)


def test_selection_constants_sweep_smoke(tmp_path, monkeypatch):
    for name in ("H", "D", "DEVICE"):
        monkeypatch.setattr(dense_roofline, name, getattr(dense_roofline, name))
    monkeypatch.setattr(dense_roofline.scorer, "SEQUENTIAL", dense_roofline.scorer.SEQUENTIAL)
    out = tmp_path / "sweep.json"
    assert selection_parts.main(["--smoke", "--sweep", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["inputs"] for r in rows} == {"random", "structured"}
    totals = [r for r in rows if "top_codes" in r]
    assert len(totals) == 12 and all(r["identical_to_torch_topk"] for r in totals)  # 2 inputs x 2 x 3, one form
    tau_rows = [r for r in rows if "passing_mean" in r]
    assert all(r["passing_max"] >= 16 for r in tau_rows)  # tau never exceeds the kk-th code
