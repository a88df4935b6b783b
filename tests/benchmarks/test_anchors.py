"""benchmarks/anchors.py on the CPU (Triton interpreter, tiny sizes, no anchors): the inputs' layouts
agree (the absorbed q is q_nope W_UK, the flat FlashMLA indices are the per-sequence ones offset
into the shared kv), the project's kernels and op match the fp32 references through those layouts,
the FP8 dense top-K matches the float64 reference of the DeepGEMM operands, missing anchors are
recorded, and the DeepGEMM patch's scanner finds what std::regex finds."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks import anchor_inputs as inputs
from benchmarks import anchor_tables
from benchmarks import anchors
from benchmarks.anchor_runs import load_anchor

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0:DeprecationWarning")  # Triton interpreter internals
PATCHES = Path(__file__).resolve().parents[2] / "benchmarks" / "anchor_patches"


def test_the_layouts_agree():
    case = inputs.absorbed_case(2, 3, 80, 4, 32, "clustered", "cpu", seed=5)
    w_uk = case.weights()[0].float()
    want = torch.einsum("rhn,hnc->rhc", case.q_rows[..., :inputs.NOPE].float(), w_uk)
    assert (case.q_abs[..., :inputs.LATENT].float() - want).abs().max() <= 0.01 * want.abs().max()
    assert torch.equal(case.q_abs[..., inputs.LATENT:], case.q_rows[..., inputs.NOPE:])
    assert case.q.shape == (2, 4, 3, 192) and case.latent.shape == (2, 80, 512) and case.q_lat.shape == (2, 4, 3, 512)
    positions = torch.arange(77, 80)
    for b in range(2):
        idx, flat = case.indices[b], case.flat_indices[b * 3:(b + 1) * 3, 0]
        assert ((idx <= positions[:, None]) & (idx >= -1)).all()
        assert torch.equal(torch.where(idx >= 0, idx + 80 * b, -1), flat)
        assert torch.equal(case.kv[80 * b:80 * (b + 1), 0, :512], case.latent[b])
    with pytest.raises(ValueError, match="unknown selection kind"):
        inputs.visible_selection("nearest", 1, 2, 8, 4, "cpu", 0)


def test_smoke_run_checks_every_project_variant(tmp_path):
    argv = ["--smoke", "--out-dir", str(tmp_path), "--kinds", "clustered", "--decode-B", "2", "--decode-queries", "2"]
    assert anchors.main(argv) == 0
    doc = json.loads((tmp_path / "anchors_cpu.json").read_text())
    rows = {r["part"]: r for r in doc["rows"]}
    assert set(rows) == {"prefill", "decode", "indexer"} and "### Decode-sized calls" in \
        (tmp_path / "anchors_cpu.md").read_text()
    for part in ("prefill", "decode"):
        res = rows[part]["results"]
        assert "not loaded" in res["flashmla"]["skipped"] and "sm_90" in res["project_ws"]["skipped"]
        for name in ("project_dispatch", "project_op"):
            err = res[name]["err_vs_fp32"]
            assert res[name]["ms"] > 0 and err["max_abs"] <= 0.01 * err["ref_max_abs"], (part, name, err)
            # decode calls also split host and device time (no CUDA graph off CUDA)
            assert (res[name]["issue_ms"] > 0 and res[name]["graph_ms"] is None) if part == "decode" \
                else "issue_ms" not in res[name], (part, name)
    assert "### Decode-sized calls: device ms replayed from CUDA graphs" in (tmp_path / "anchors_cpu.md").read_text()
    # where the op's host time goes, on decode rows only: its own entry point among the functions
    prof = rows["decode"]["op_host_profile"]
    assert "op_host_profile" not in rows["prefill"] and prof["us_per_call"] > 0
    assert any("absorbed_sparse_attention" in f["function"] for f in prof["functions"])
    assert "### The op's host time by function" in (tmp_path / "anchors_cpu.md").read_text()
    res = rows["indexer"]["results"]
    assert "not loaded" in res["dg_logits"]["skipped"]
    for name in ("project_scorer", "project_dense_fp8", "project_op_fp8", "project_op_bf16"):
        assert res[name]["err_vs_fp64"]["max_rel"] < 1e-5 and res[name]["err_vs_fp64"]["nonfinite"] == 0, name
    assert all(res[n]["topk_overlap_min"] == 1.0 for n in ("project_dense_fp8", "project_op_fp8", "project_op_bf16"))
    # a document combined from several runs says so under its header
    text = anchor_tables.tables({**doc, "notes": ["two runs, rows combined"]})
    assert text.splitlines()[2] == "- two runs, rows combined" and "- two" not in anchor_tables.tables(doc)


def test_missing_anchors_are_recorded(tmp_path):
    module, why = load_anchor(tmp_path, "flashmla", "flash_mla")
    assert module is None and "does not exist" in why
    (tmp_path / "deepgemm").mkdir()
    module, why = load_anchor(tmp_path, "deepgemm", "deep_gemm_not_here")
    assert module is None and why.startswith("import failed")
    with pytest.raises(SystemExit):
        anchors.parse_args(["--parts", "prefill,attention"])


def test_the_patch_scanner_finds_what_std_regex_finds(tmp_path):
    """text_scan_check.cpp compares text_scan.hpp with the std::regex forms it replaces, on text
    that exercises every branch (the g++ run over DeepGEMM's and CUTLASS's own headers is in
    anchor_patches/README.md)."""
    compiler = shutil.which("g++")
    assert compiler, "g++ is needed to build the scanner's check"
    exe = tmp_path / "check"
    subprocess.run([compiler, "-std=c++17", "-O1", "-I", str(PATCHES), str(PATCHES / "text_scan_check.cpp"), "-o",
                    str(exe)], check=True)
    text = tmp_path / "sample.hpp"
    text.write_text('#include <deep_gemm/a.cuh>\n#  include\t"b.h"\n# include <>\n#include <c\n#includ <d>\n'
                    '#pragma once // #include <e/f.h> in a comment\n#include "g>h"\n#\ninclude <i>\n#include <j '
                    '"k">\n##include<l>\nnvcc: Cuda compilation tools, release 12.9, V12.9.86\nrelease 1.x release'
                    ' 13.0\nrelease .5 and release 7.\n#include <unterminated')
    done = subprocess.run([str(exe), str(text)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "files 1, directives 8, versions 2, mismatches 0"
