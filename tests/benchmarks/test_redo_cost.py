"""benchmarks/redo_cost.py runs on the CPU (interpreter sizes) and its checks hold."""
import json

from benchmarks import redo_cost
from compiler.lowering import defaults


def test_redo_cost_smoke(tmp_path):
    out = tmp_path / "redo.json"
    assert redo_cost.main(["--smoke", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["all_identical"]
    cells = {(r["flagged"], r["head"]) for r in doc["rows"]}
    assert cells == {(f, h) for f in redo_cost.SMOKE["flagged"] for h in (defaults.REDO_FEW_ROWS, 0)}
    assert defaults.REDO_FEW_ROWS == doc["default_head"]  # restored after every cell
