"""benchmarks/pulsar_e2e.py --smoke (downstream eager, to keep it short): every row, check and
target is written (generate rows with the times of their parts), the driver's dense tokens
agree with HF generate and with the compiled model, and --profile writes a trace per mode and model."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_smoke_run_writes_every_row_check_and_target(tmp_path):
    out, md, profiles = tmp_path / "e2e.json", tmp_path / "e2e.md", tmp_path / "profiles.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pulsar_e2e.py"), "--smoke", "--downstream",
                           "eager", "--out", str(out), "--md", str(md), "--profile", str(profiles)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    rows = {(r["how"], r["mode"]): r for r in result["rows"]}
    assert sorted(rows) == sorted([("hf_generate", "dense")] + [(how, mode) for how in ("generate_eager",
                                  "generate_compiled") for mode in ("dense", "pulsar", "star")])
    for row in result["rows"]:
        assert row["ms"] > 0 and len(row["tokens"]) == result["settings"]["new_tokens"] and "error" not in row
        parts = ("layout_ms", "phase1_ms", "phase2_decode_ms")
        assert all(row[part] > 0 for part in parts) if row["how"] != "hf_generate" else not set(parts) & set(row)
    assert rows[("generate_eager", "star")]["packed_tokens"] > rows[("generate_eager", "dense")]["packed_tokens"]
    checks = {(c["mode"], c["compare"]): c["tokens_equal"] for c in result["checks"]}
    assert checks[("dense", "generate_eager vs hf_generate")]
    assert all(checks[(mode, "generate_eager vs generate_compiled")] for mode in ("dense", "star", "pulsar"))
    assert len(result["targets"]) == 3
    assert "| 192 | star |" in md.read_text(encoding="utf-8")
    traces = profiles.read_text(encoding="utf-8")
    assert all(f"## {how}, {mode}," in traces for how in ("generate_eager", "generate_compiled")
               for mode in ("dense", "star", "pulsar"))
    assert "aten::" in traces
