"""benchmarks/selection_parts.py runs on the CPU (interpreter sizes) and its checks hold."""
import json

from benchmarks import dense_roofline, selection_parts


def test_selection_parts_smoke(tmp_path, monkeypatch):
    for name in ("H", "D", "DEVICE"):  # main(--smoke) sets the roofline module's sizes: restored after
        monkeypatch.setattr(dense_roofline, name, getattr(dense_roofline, name))
    monkeypatch.setattr(dense_roofline.scorer, "SEQUENTIAL", dense_roofline.scorer.SEQUENTIAL)
    out = tmp_path / "parts.json"
    assert selection_parts.main(["--smoke", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["identical_to_torch_topk"] and result["compaction_same_for_every_step"]
    assert result["overflow_rows"] == 0
    assert {f"compact_{step}" for step in selection_parts.STEPS} <= set(result)
