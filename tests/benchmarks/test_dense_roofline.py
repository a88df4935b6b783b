"""benchmarks/dense_roofline.py runs end to end on the CPU (interpreter sizes): the sweep's checks
hold (bitwise row lists), and the grid's and decode rows check out."""
import json
import time

import pytest

from benchmarks import dense_roofline


@pytest.fixture(autouse=True)
def one_timed_call(monkeypatch):
    """Time one call instead of a median (the interpreter is slow; the checks are what is tested);
    the module state ``main(--smoke)`` changes is restored afterwards."""
    for name in ("H", "D", "TOPK", "DEVICE"):
        monkeypatch.setattr(dense_roofline, name, getattr(dense_roofline, name))
    monkeypatch.setattr(dense_roofline.scorer, "SEQUENTIAL", dense_roofline.scorer.SEQUENTIAL)
    def once(fn, reps=1, warmup=0):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    monkeypatch.setattr(dense_roofline, "timed", once)


def test_the_sweep_runs_and_its_checks_hold(tmp_path, monkeypatch):
    monkeypatch.setattr(dense_roofline, "FORMS", dense_roofline.FORMS[:1])
    monkeypatch.setattr(dense_roofline, "FP32_CONFIGS", dense_roofline.FP32_CONFIGS[:1])
    out = tmp_path / "sweep.json"
    assert dense_roofline.main(["--smoke", "--sweep", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["kind"] for r in rows} == {"scorer_form", "fp32_tf32"}
    assert not [r for r in rows if "error" in r]
    assert all(r["row_list_bitwise"] for r in rows if "row_list_bitwise" in r)
    assert "op_ratio" in [r for r in rows if r["kind"] == "fp32_tf32"][0]


def test_the_grid_times_dense_the_torch_baseline_and_decode(tmp_path):
    """The grid's rows, then the decode rows (one query, and 3), scored densely and identical, and
    the transformers indexer's own decode beside them."""
    out = tmp_path / "grid.json"
    assert dense_roofline.main(["--smoke", "--no-structured", "--S", "8", "--T", "512", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    by_method = {r["method"]: r for r in rows if r["method"] != "decode"}
    assert by_method["dense"]["identical"] and "error" not in by_method["torch_gemm_topk"]
    assert 0.5 <= by_method["torch_gemm_topk"]["same_index_fraction"] <= 1.0
    decode = [r for r in rows if r["method"] == "decode"]
    assert [r["B"] for r in decode] == [1, 3] and all(r["identical"] for r in decode)
    assert all(0.5 <= r["stock_same_index_fraction"] <= 1.0 and r["stock_ms"] > 0 for r in decode)
    assert all(r[f"{form}_loop_ms"] > 0 for r in decode for form in ("op", "dense", "stock"))


def test_the_fp8_rows_check_out(tmp_path, monkeypatch):
    """--fp8: the tensor-core model check, the FP8 scorer's forms (dense and key-list scorer agree),
    the FP8 dense path identical to the op's, the certified FP8 path identical and pruning, and the
    overlap with bf16 per family (the trained one recorded as unavailable without its checkpoint)."""
    monkeypatch.setattr(dense_roofline, "FP8_FORMS", [*dense_roofline.FP8_FORMS[:2], dense_roofline.FP8_FORMS[-1]])
    out = tmp_path / "fp8.json"
    assert dense_roofline.main(["--smoke", "--fp8", "--S", "8", "--T", "512", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    check = [r for r in rows if r.get("kind") == "fp8_dot_check"]
    assert len(check) == 1 and check[0]["holds"] and set(check[0]["max_ratio"]) >= {"unpromoted_tail", "random"}
    forms = [r for r in rows if r.get("kind") == "fp8_scorer_form"]
    assert len(forms) == 3 and all(r["row_list_bitwise"] and r["codes_as_default"] and "error" not in r for r in forms)
    assert forms[-1]["form"].endswith("cols128")
    by_method = {r["method"]: r for r in rows if "method" in r and r["method"] != "fp8_overlap"}
    assert by_method["fp8_dense"]["identical"] and by_method["fp8_dense"]["op_ms"] > 0
    assert by_method["fp8_certified_plan"]["identical"] and by_method["fp8_certified_plan"]["pruned_frac"] > 0.5
    overlap = {r["family"]: r for r in rows if r.get("method") == "fp8_overlap"}
    assert set(overlap) == set(dense_roofline.FP8_FAMILIES)
    for family in ("structured", "gaussian", "random_indexer"):
        assert 0.5 <= overlap[family]["min"] <= overlap[family]["mean"] <= 1.0
    assert "error" in overlap["trained"] or 0.0 <= overlap["trained"]["min"] <= 1.0
