"""benchmarks/trained_selections.py: the sharing measure on known selections, and a tiny run on the
trained measuring model."""
import json

import torch

from benchmarks import trained_selections as ts


def test_sharing_tells_a_sliding_window_from_disjoint_selections():
    S, K, T = 128, 32, 8192
    position = torch.arange(T - S, T)[:, None]
    window = position - torch.arange(K)[None, :]
    shared = ts.sharing(window, T)
    assert shared["recent_share"] == 1.0
    assert abs(shared["union_over_k"] - (K + ts.UNION_BLOCK - 1) / K) < 1e-9
    disjoint = torch.arange(S * K).view(S, K)  # far keys, no two queries alike
    apart = ts.sharing(disjoint, T)
    assert apart["union_over_k"] == ts.UNION_BLOCK and apart["recent_share"] == 0.0


def test_a_tiny_run_on_the_trained_model_writes_rows_and_the_selections(tmp_path):
    out, saved = tmp_path / "sel.json", tmp_path / "sel.pt"
    assert ts.main(["--T", "512", "--S", "128", "--topk", "64", "--layers", "0", "3", "--out", str(out),
                    "--save", str(saved)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["layer"] for r in rows] == [0, 3]
    assert all(64 / 64 <= r["union_over_k"] <= ts.UNION_BLOCK and 0 <= r["recent_share"] <= 1 for r in rows)
    data = torch.load(saved)
    assert data["indices"].shape == (2, 128, 64) and data["T"] == 512
    visible = data["indices"] <= torch.arange(512 - 128, 512)[None, :, None]
    assert visible.all()
