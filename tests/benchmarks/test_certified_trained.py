"""benchmarks/certified_trained.py: a tiny run on one layer of the trained measuring model (CPU sizes)."""
import json

import pytest

from benchmarks import certified_trained as ct
from compiler.plan.schema import load_plan


def test_a_tiny_run_writes_exact_rows_the_time_split_and_a_plan(tmp_path):
    out = tmp_path / "ct.json"
    doc = ct.main(["--smoke", "--layers", "2", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert rows == json.loads(json.dumps(doc["rows"]))
    variants = [r["variant"] for r in rows]
    assert variants == ["dense", "r=7", "r=7 +witnesses", "r=7 lists of 2", "r=7 +witnesses lists of 2", "plan"]
    certified = [r for r in rows if r["variant"].startswith("r=")]
    assert all(r["identical"] for r in certified + rows[-1:])
    for r in certified:
        assert 0 <= r["pruned"] <= 1 and r["m"] >= 0 and r["queries"] == ct.SMOKE["S"]
    assert rows[1]["b"] is not None and rows[1]["b"] >= 0  # the threshold never passes the kk-th score here
    # the plan's op is also compared with the dense op timed again beside it
    again = rows[-1]["dense_again_ms"]
    assert again > 0 and rows[-1]["x_dense_again"] == pytest.approx(rows[-1]["ms"] / again, rel=1e-2, abs=1e-3)  # ratio rounded to 3 places
    assert "dense again" in out.with_suffix(".md").read_text()
    plan = load_plan(tmp_path / "ct_plan_128.json")
    assert [p.layer for p in plan.layers] == ["model.layers.2.self_attn.indexer"]
    assert plan.layers[0].settings.path == rows[-1]["path"]
    assert (plan.layers[0].settings.list_queries, plan.layers[0].settings.witnesses) == \
        (rows[-1]["list_queries"], rows[-1]["witnesses"])
    # every certified row, with the list size and the witnesses it ran
    assert [(c.r, c.list_queries, c.witnesses) for c in plan.layers[0].candidates] == \
        [(7, None, False), (7, None, True), (7, 2, False), (7, 2, True)]
    assert [r["witnesses"] for r in certified] == [False, True, False, True]


def test_a_prefill_needs_every_layer_in_its_plan(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        ct.main(["--smoke", "--layers", "2", "--prefill", "128", "--out", str(tmp_path / "ct.json")])
    assert exit_info.value.code == 2 and "--prefill" in capsys.readouterr().err


def test_the_table_renders_prefill_rows_beside_layer_rows():
    """Prefill rows (no layer) render with the layer rows (a prefill run once ended in a KeyError)."""
    from benchmarks.certified_trained import render

    doc = {"rows": [{"T": 128, "layer": 0, "variant": "dense", "ms": 1.0},
                    {"T": 128, "variant": "prefill plan", "ms": 2.5, "argmax_as_dense": True},
                    {"T": 128, "variant": "prefill dense", "ms": 2.0, "peak_gib": 28.81, "x_dense": 1.0},
                    {"T": 128, "variant": "prefill stock", "error": "CUDA out of memory"},
                    {"T": 128, "variant": "prefill default", "ms": 1.5, "peak_gib": 20.0,
                     "guard": {"model.layers.0.self_attn.indexer": ["dense"],
                               "model.layers.1.self_attn.indexer": ["certified (r=15 lists of 2)"],
                               "model.layers.2.self_attn.indexer": ["certified"]}}]}
    table = render(doc)
    assert "guard certified layers 1 (r=15 lists of 2), 2 |" in table
    assert "prefill plan" in table and "2.5" in table
    assert "prefill dense (peak 28.8 GiB)" in table and "prefill stock (CUDA out of memory)" in table


def test_a_prefill_row_names_the_rung_each_guarded_layer_kept():
    from benchmarks.certified_trained import _guard_state
    from compiler.ops.guard import GuardBucket, guard_ladder
    from compiler.topk_settings import TopkSettings

    climbed = GuardBucket(ladder=guard_ladder(TopkSettings()), rung=2, favoured="certified").summary()
    own = GuardBucket(ladder=guard_ladder(TopkSettings()), favoured="dense").summary()
    assert _guard_state(climbed) == "certified (r=31 lists of 2)" and _guard_state(own) == "dense"


def test_the_shortfall_table_splits_the_fastest_certified_row_against_its_dot_products():
    """Per (T, layer): the fastest certified row, its screen and refine rates against the dense op's
    per dot product, its fixed stages, and its seeds' gap b (taken from the row that measured it)."""
    from benchmarks.certified_trained import render, shortfall

    split = {"seeds": 1.0, "plan": 1.0, "screen": 2.0, "refine": 1.0, "select": 0.5, "redo": 0.5}
    doc = {"rows": [
        {"T": 65536, "layer": 1, "variant": "dense", "ms": 8.0, "heads": 64},
        {"T": 65536, "layer": 1, "variant": "r=15", "r": 15, "witnesses": False, "ms": 9.0, "m": 0.5, "b": 0.25,
         "split_ms": split},
        {"T": 65536, "layer": 1, "variant": "r=15 lists of 2", "r": 15, "witnesses": False, "ms": 6.4, "m": 0.25,
         "split_ms": split},
        {"T": 65536, "layer": 1, "variant": "plan", "path": "certified", "r": 15, "ms": 1.0},  # not a certified row
    ]}
    (row,) = shortfall(doc)
    assert row["variant"] == "r=15 lists of 2" and row["speed"] == 1.25 and row["b"] == 0.25
    assert row["screen rate"] == 1.0  # 16 of 64 rows: 2 ms of the dense op's 8, in 2 ms
    assert row["refine rate"] == 2.0  # a quarter of the keys: 2 ms of dense, in 1 ms
    assert row["fixed ms"] == 3.0 and row["fixed / dense"] == 0.375
    assert row["dots allow"] == round(1 / (16 / 64 + 0.25 + 1024 / 65536), 3)
    assert "Where the time goes" in render(doc)
