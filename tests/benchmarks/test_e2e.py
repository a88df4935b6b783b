"""benchmarks/e2e.py --smoke: the prefill rows of stock, the backend's defaults and the FP8 indexer
option (``pulsar_dosa_fp8``) on a tiny DeepSeek-V3.2 model, with the last-token argmax agreement
against stock reported."""
import json

from benchmarks import e2e


def test_smoke_rows_for_stock_bf16_and_fp8_indexers(tmp_path):
    out = tmp_path / "e2e.json"
    assert e2e.main(["--smoke", "--models", "DeepseekV32ForCausalLM", "--methods", "stock", "pulsar_dosa",
                     "pulsar_dosa_fp8", "--lengths", "64", "--reps", "1", "--out", str(out)]) == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"stock", "pulsar_dosa", "pulsar_dosa_fp8"}
    assert all(r["error"] is None and r["ms"] > 0 for r in rows.values())
    for method in ("pulsar_dosa", "pulsar_dosa_fp8"):
        assert isinstance(rows[method]["argmax_agree"], bool) and rows[method]["max_abs_diff"] < 1.0
    assert "pulsar_dosa_fp8" in out.with_suffix(".md").read_text()
