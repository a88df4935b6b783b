"""benchmarks/models/tiny_eval.py without --dsa (the long-context evidence of the Llama model, at
lengths /128): loss at each --loss-lengths, retrieval at each --retrieval-lengths with its Wilson
interval, no DSA rows."""
import json
import shutil
import sys
from pathlib import Path

MODELS = Path(__file__).resolve().parents[3] / "benchmarks" / "models"
sys.path.insert(0, str(MODELS))
import tiny_eval  # noqa: E402


def test_the_llama_only_evidence_at_given_lengths(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(MODELS / "heldout_tokens.npy", corpus / "train.npy")
    (corpus / "manifest.json").write_text(json.dumps({"heldout": {"bytes": 3_700_000, "tokens": 1_000_000}}))
    out = tmp_path / "evidence.json"
    tiny_eval.main(["--llama", str(MODELS / "tiny-llama"), "--corpus", str(corpus), "--out", str(out),
                    "--scale", "128", "--loss-windows", "1", "--loss-lengths", "16384", "32768",
                    "--retrieval-lengths", "32768", "65536", "--trials", "2", "--device", "cpu"])
    result = json.loads(out.read_text())
    assert [(r["model"], r["length"]) for r in result["loss"]] == [("llama", 128), ("llama", 256)]
    assert all(abs(r["bits_per_byte"] - r["bits_per_token"] / 3.7) < 1e-3 for r in result["loss"])
    assert [(r["model"], r["length"], r["trials"]) for r in result["retrieval"]] == [("llama", 256, 2), ("llama", 512, 2)]
    for row in result["retrieval"]:
        low, high = row["wilson_95"]
        assert low <= row["accuracy"] <= high and len(row["correct"]) == 2
    assert "mass" not in result
