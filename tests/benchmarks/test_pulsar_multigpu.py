"""benchmarks/pulsar_multigpu.py on CPU: its gloo run (2 processes, started as the script is) and its
ranks-in-turn run (3 ranks, its main in this process) report the one-device driver's tokens and kept
KV, in the JSON and Markdown they write."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "pulsar_multigpu.py"
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def run_script(tmp_path: Path, *how: str) -> tuple[dict, str]:
    """Run the script on the tiny model (pulsar, L = 128) and return its JSON result and Markdown."""
    out, md = tmp_path / "result.json", tmp_path / "result.md"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for name in MULTICAST_OFF:
        env.pop(name, None)
    done = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--modes", "pulsar",
                           "--lengths", "128", *how, "--out", str(out), "--md", str(md)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text(encoding="utf-8")), md.read_text(encoding="utf-8")


def check_ranked_row(result: dict, markdown: str, ranks: int, simulated: bool) -> None:
    rows = {row["world_size"]: row for row in result["rows"]}
    assert sorted(rows) == [1, ranks]
    reference, ranked = rows[1], rows[ranks]
    assert reference["tokens_equal"] is None and reference["kv_max_abs_diff"] is None
    assert ranked["tokens_equal"] is True
    assert 0.0 <= ranked["kv_max_abs_diff"] <= 1e-5
    assert ranked["simulated"] is simulated
    assert len(ranked["phase1_rank_ms"]) == ranks
    assert ranked["phase1_ms"] == max(ranked["phase1_rank_ms"])
    assert ranked["tokens_per_device"] < reference["tokens_per_device"]
    assert result["environment"]["multicast_env"] == MULTICAST_OFF
    assert f"| pulsar | 128 | {ranks} | {ranked['tokens_per_device']} |" in markdown


def test_gloo_processes_give_the_one_device_tokens_and_kept_kv(tmp_path):
    result, markdown = run_script(tmp_path, "--backend", "gloo", "--world-size", "2")
    assert result["environment"]["backend"] == "gloo"
    check_ranked_row(result, markdown, ranks=2, simulated=False)


def test_ranks_in_turn_merge_gives_the_one_device_tokens_and_kept_kv(tmp_path, monkeypatch):
    """In this process: the script's own start (its environment before anything initialises) is
    the gloo test's; here its import sets MULTICAST_OFF, which this test's monkeypatch removes
    afterwards, and Dynamo's recompile limit, which the script raises, is put back."""
    import torch

    for name, value in MULTICAST_OFF.items():
        monkeypatch.setenv(name, value)
    from benchmarks import pulsar_multigpu

    out, md = tmp_path / "result.json", tmp_path / "result.md"
    limit = torch._dynamo.config.recompile_limit  # not monkeypatch: its undo deletes a config entry
    try:
        pulsar_multigpu.main(["--tiny", "--device", "cpu", "--modes", "pulsar", "--lengths", "128",
                              "--ranks-in-turn", "3", "--out", str(out), "--md", str(md)])
    finally:
        torch._dynamo.config.recompile_limit = limit
    result, markdown = json.loads(out.read_text(encoding="utf-8")), md.read_text(encoding="utf-8")
    check_ranked_row(result, markdown, ranks=3, simulated=True)
