"""benchmarks/fit_attention_cost.py: the fit recovers the constants that generated a run's times, and
the replay picks the faster form."""
import dataclasses
import json

import pytest

from benchmarks import fit_attention_cost
from benchmarks.fit_attention_cost import DIMS
from compiler.cost_model import H200_ATTENTION, absorbed_attention_time, union_attention_time


def synthetic_rows(constants):
    rows = []
    for heads in (128, 16, 8):
        for s in (16384, 32768):
            for kind, ratio in (("windowed", 1.03), ("shared16", 2.1), ("uniform", s / 4096)):
                base = {"B": 1, "S": s, "T": s, "heads": heads, "kind": kind, "topk": 2048,
                        "union_ratio": ratio, "union_ratio_sampled": ratio}
                union = union_attention_time(1, s, 2048, heads, ratio, constants)
                latent = union_attention_time(1, s, 2048, heads, ratio, constants, expand=(s, *DIMS))
                rows += [{**base, "method": "union", "ms": 1e3 * union},
                         {**base, "method": "union:latent", "ms": 1e3 * latent}]
                for method, ws in (("absorbed:ws", heads >= 16), ("absorbed:h64_n64_w8_s2", False)):
                    rows.append({**base, "method": method,
                                 "ms": 1e3 * absorbed_attention_time(1, s, 2048, heads, ws, constants)})
    rows.append({"B": 1, "S": 1, "T": 131072, "heads": 128, "kind": "uniform", "method": "union", "ms": 0.4,
                 "topk": 2048, "union_ratio": 1.0})  # decode rows are not fitted
    return rows


def test_the_fit_recovers_the_generating_constants_and_the_replay_has_no_regret(tmp_path):
    truth = dataclasses.replace(H200_ATTENTION, union_s=4e-12, union_key_s=2e-11, union_fixed_s=5e-11,
                                absorbed_s=3e-10, absorbed_chain_s=5e-10, copy_bytes_per_s=2e12)
    (tmp_path / "run.json").write_text(json.dumps({"rows": synthetic_rows(truth)}))
    out = tmp_path / "constants.json"
    assert fit_attention_cost.main(["--results", str(tmp_path / "run.json"), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    for name in ("union_s", "union_key_s", "union_fixed_s", "absorbed_s", "absorbed_chain_s", "copy_bytes_per_s"):
        assert doc["constants"][name] == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert doc["report"]["max_rel_error"] < 1e-6 and len(doc["picks"]) == 18
    assert all(p["regret"] == 1.0 for p in doc["picks"])  # the fitted model is the truth: every pick is right
    assert {p["pick"] for p in doc["picks"]} == {"union", "absorbed"}
    assert "| pick (fitted) |" in out.with_suffix(".md").read_text()


def test_too_few_union_rows_are_refused():
    with pytest.raises(ValueError, match="at least 2 timed union rows"):
        fit_attention_cost.fit(synthetic_rows(H200_ATTENTION)[:3])


def test_the_committed_constants_pick_the_faster_form_on_the_committed_grid():
    """The per-call choice replayed on the H200 grid (every kind, 8/16/128 heads, 16K-64K and the trained
    selections) with the constants the op runs: at most a 5% regret where the two forms nearly tie."""
    results = fit_attention_cost.__file__.rsplit("/", 1)[0] + "/results/sparse_attention_auto_h200.json"
    rows = json.loads(open(results).read())["rows"]
    picks = fit_attention_cost.replay(rows, H200_ATTENTION)
    assert len(picks) == 43 and {p["pick"] for p in picks} == {"union", "absorbed"}
    assert max(p["regret"] for p in picks) <= 1.05
