"""benchmarks/fused_bounds.py runs at smoke sizes and every bound it measures lets the row's top kk through."""
import json

import torch

from benchmarks import fused_bounds


def test_fused_bounds_smoke(tmp_path):
    out = tmp_path / "bounds.json"
    assert fused_bounds.main(["--smoke", "--families", "gaussian", "misaligned_runs", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["every_bound_below_the_kth"]
    assert {(r["inputs"], r["bound"]) for r in result["rows"]} == {
        (f, b) for f in ("gaussian", "misaligned_runs") for b in ("chunks_2kk", "chunks_4kk", "chunks_8kk", "exact_half_kth")}
    assert all(r["total"]["min"] >= 1 and r["emitted"]["max"] <= r["total"]["max"] for r in result["rows"])


def test_a_bound_above_the_kth_is_reported(tmp_path, monkeypatch):
    """Bounds taken at half the rank (above the kk-th) let fewer than kk keys through: the run's
    check says so and the script exits 1."""
    monkeypatch.setattr(fused_bounds, "kth", lambda x, r: torch.topk(x, max(1, r // 2), dim=-1).values[..., -1])
    out = tmp_path / "bounds.json"
    assert fused_bounds.main(["--smoke", "--families", "gaussian", "--out", str(out)]) == 1
    assert not json.loads(out.read_text())["every_bound_below_the_kth"]
