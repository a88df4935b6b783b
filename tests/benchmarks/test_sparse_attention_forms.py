"""benchmarks/sparse_attention_forms.py in its CPU smoke mode (Triton interpreter, tiny MLA shape): every
method checked against the fp32 reference, the selection kinds distinct and visible, a selections
file, the time budget."""
import json

import pytest
import torch

from benchmarks.sparse_attention_forms import KINDS, distinct_rows, main, selections

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0:DeprecationWarning")  # Triton interpreter internals
METHODS = {"absorbed:h64_n64_w8_s2", "union", "masked_sdpa"}


def test_every_kind_selects_distinct_visible_keys():
    for kind in KINDS:
        for s, t in ((300, 300), (1, 700)):
            indices = selections(kind, 2, s, t, 64, torch.device("cpu"), seed=1)
            pos = torch.arange(t - s, t)
            assert indices.shape == (2, s, 64) and distinct_rows(indices), kind
            long_rows = pos >= 64  # rows with more visible keys than top-K select visible keys only
            assert (indices[:, long_rows] <= pos[long_rows, None]).all() and (indices >= 0).all(), kind


def test_smoke_run_with_a_selections_file_and_the_budget(tmp_path):
    picked = selections("uniform", 1, 40, 40, 32, torch.device("cpu"), seed=2)
    picked[0, 39, :4] = 3  # repeats: the op is told the rows are not distinct
    torch.save({"indices": picked, "T": 40}, tmp_path / "trained.pt")
    out = tmp_path / "smoke.json"
    assert main(["--smoke", "--out", str(out), "--cases", "2:1:64:16", "--kinds", "shared16",
                 "--selections", str(tmp_path / "trained.pt"), "--heads", "16"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["kind"], r["S"], r["B"]) for r in rows} == {("file:trained", 40, 1), ("shared16", 1, 2)}
    for kind in ("file:trained", "shared16"):
        mine = [r for r in rows if r["kind"] == kind]
        prefill = kind == "file:trained"  # the compile-time form is "auto": the op's own choice is timed too
        assert {r["method"] for r in mine} == METHODS | ({"auto", "union:latent"} if prefill else set())
        assert all("error" not in r and r["union_ratio"] > 0 for r in mine)
        assert all(r["auto_form"] in ("absorbed", "union") for r in mine if r["method"] == "auto")
        assert all(r["err_vs_reference"] < 3e-2 and r["ms"] > 0 and r["regret"] >= 1 for r in mine)
        assert {r["distinct"] for r in mine} == {kind == "shared16"}
    assert "| absorbed |" in out.with_suffix(".md").read_text()
    assert main(["--smoke", "--out", str(out), "--budget-s", "0"]) == 0
    skipped = json.loads(out.read_text())["rows"]
    assert skipped and all(r["error"].startswith("skipped: past the 0 s budget") for r in skipped)
