"""benchmarks/certified_buffer.py runs on the CPU (interpreter sizes): every buffer size is exact."""
import json

from benchmarks import certified_buffer, dense_roofline
from compiler.lowering import defaults


def test_certified_buffer_smoke(tmp_path, monkeypatch):
    for name in ("H", "D", "DEVICE", "TOPK"):  # main(--smoke) sets the roofline module's sizes: restored after
        monkeypatch.setattr(dense_roofline, name, getattr(dense_roofline, name))
    factor = defaults.CERTIFIED_BUFFER_K
    out = tmp_path / "buffer.json"
    assert certified_buffer.main(["--smoke", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert all(row[f"buffer_{f}kk_identical"] for f in certified_buffer.FACTORS)
    assert 0 < row["candidates_mean_kk"] <= row["candidates_max_kk"]
    assert defaults.CERTIFIED_BUFFER_K == factor
