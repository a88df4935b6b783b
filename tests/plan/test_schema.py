"""The plan file format: round trip, hash, version check and errors that name the field."""
import copy
import dataclasses
import json

import pytest

from compiler.cost_model import CPU_REFERENCE
from compiler.plan.schema import (PLAN_VERSION, CandidateMeasurement, Distribution, LayerPlan, Plan,
                                  PlanError, load_plan, plan_from_dict, plan_hash, save_plan)
from compiler.topk_settings import TopkSettings


def example_plan() -> Plan:
    gap = Distribution(count=12, mean=0.5, min=0.0, max=2.0, p05=0.0, p50=0.25, p95=1.5)
    cand = CandidateMeasurement(r=6, survival=0.25, redo_frac=0.05, ms=12.5, queries=40, certified_queries=36,
                                keys_screened=800, survivors=200, fallbacks={"overflow": 1, "nonfinite": 0})
    certified = LayerPlan(layer="model.layers.0.self_attn.indexer", settings=TopkSettings("auto", 6, 4096),
                          heads=32, head_dim=16, topk=8, predicted_pruned_frac=0.75, predicted_speedup=1.5,
                          reason="r=6 predicted 1.50x faster", dense_ms=20.0, calibration_calls=((1, 20, 20),),
                          candidates=(cand,), seed_gap=gap, slack=gap)
    dense = LayerPlan(layer="model.layers.1.self_attn.indexer", settings=TopkSettings("dense"),
                      heads=32, head_dim=16, topk=8, predicted_pruned_frac=None, predicted_speedup=1.0,
                      reason="not enough evidence", dense_ms=None, calibration_calls=(),
                      candidates=(), seed_gap=None, slack=None)
    return Plan(model={"source": "config.json"}, inputs={"sequences": 2, "lengths": [20, 20]},
                design_length=131072, queries=None, constants=CPU_REFERENCE, layers=(certified, dense))


def test_plan_round_trips_through_a_file_unchanged(tmp_path):
    plan = example_plan()
    save_plan(plan, tmp_path / "plan.json")
    loaded = load_plan(tmp_path / "plan.json")
    assert loaded == plan
    assert loaded.hash == plan.hash


def with_lists(plan: Plan, size: int, witnesses: bool | None = None) -> Plan:
    """``plan`` with its certified layer (and its candidate) run on survivor lists of ``size`` queries
    and with ``witnesses``."""
    first = plan.layers[0]
    settings = TopkSettings("auto", first.settings.r, first.settings.min_keys, size, witnesses)
    candidates = tuple(dataclasses.replace(c, list_queries=size, witnesses=witnesses) for c in first.candidates)
    return dataclasses.replace(plan, layers=(dataclasses.replace(first, settings=settings, candidates=candidates),
                                             *plan.layers[1:]))


def test_the_list_size_round_trips_and_changes_the_hash(tmp_path):
    plan = with_lists(example_plan(), 2)
    save_plan(plan, tmp_path / "plan.json")
    loaded = load_plan(tmp_path / "plan.json")
    assert loaded == plan and loaded.layers[0].settings.list_queries == 2
    assert loaded.layers[0].candidates[0].list_queries == 2
    assert loaded.hash == plan.hash != example_plan().hash


@pytest.mark.parametrize("witnesses", [False, True])
def test_the_witnesses_round_trip_and_change_the_hash(tmp_path, witnesses):
    plan = with_lists(example_plan(), 2, witnesses)
    save_plan(plan, tmp_path / "plan.json")
    assert json.loads((tmp_path / "plan.json").read_text())["layers"][0]["witnesses"] is witnesses
    loaded = load_plan(tmp_path / "plan.json")
    assert loaded == plan and loaded.layers[0].settings.witnesses is witnesses
    assert loaded.layers[0].candidates[0].witnesses is witnesses
    assert loaded.hash == plan.hash != with_lists(example_plan(), 2).hash


def test_a_plan_written_before_list_sizes_and_witnesses_loads_with_the_defaults_and_keeps_its_hash():
    data = example_plan().to_dict()
    layer = data["layers"][0]
    for key in ("list_queries", "witnesses"):  # the old format
        assert key not in layer and key not in layer["candidates"][0]
    old = json.loads(json.dumps(data))
    plan = plan_from_dict(old)
    assert plan.layers[0].settings.list_queries is None and plan.layers[0].candidates[0].list_queries is None
    assert plan.layers[0].settings.witnesses is None and plan.layers[0].candidates[0].witnesses is None
    assert plan.to_dict() == old and plan.hash == example_plan().hash


def test_hash_ignores_formatting_and_changes_with_any_content(tmp_path):
    plan = example_plan()
    data = plan.to_dict()
    (tmp_path / "compact.json").write_text(json.dumps(data, separators=(",", ":")))
    assert load_plan(tmp_path / "compact.json").hash == plan_hash(plan)
    data["layers"][0]["min_keys"] = 4097
    assert plan_from_dict(data).hash != plan.hash


def test_layer_lookup():
    plan = example_plan()
    assert plan.layer("model.layers.1.self_attn.indexer").settings.path == "dense"
    with pytest.raises(PlanError, match="no layer 'other'"):
        plan.layer("other")


def test_corrupt_file_is_rejected(tmp_path):
    path = tmp_path / "plan.json"
    save_plan(example_plan(), path)
    path.write_text(path.read_text()[:-40])
    with pytest.raises(PlanError, match="not valid JSON"):
        load_plan(path)
    with pytest.raises(PlanError, match="cannot read"):
        load_plan(tmp_path / "absent.json")


@pytest.mark.parametrize("version, word", [(PLAN_VERSION - 1, "older"), (PLAN_VERSION + 1, "newer")])
def test_other_versions_are_rejected(version, word):
    data = example_plan().to_dict()
    data["version"] = version
    with pytest.raises(PlanError, match=word):
        plan_from_dict(data)


def mutated(path, value):
    data = copy.deepcopy(example_plan().to_dict())
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


@pytest.mark.parametrize("path, value, message", [
    (("format",), "other", r"plan\.format"),
    (("design_length",), 0, r"plan\.design_length"),
    (("constants", "screen_tile"), 0, r"plan\.constants.*screen_tile"),
    (("layers",), [], r"plan\.layers"),
    (("layers", 0, "path"), "sparse", r"layers\[model\.layers\.0\.self_attn\.indexer\]\.path"),
    (("layers", 0, "r"), None, "'auto' layer needs r"),
    (("layers", 1, "r"), 4, "dense layer has r, min_keys, list_queries and witnesses null"),
    (("layers", 1, "list_queries"), 2, "dense layer has r, min_keys, list_queries and witnesses null"),
    (("layers", 1, "witnesses"), False, "dense layer has r, min_keys, list_queries and witnesses null"),
    (("layers", 0, "witnesses"), 1, r"indexer\]\.witnesses: expected None or a bool"),
    (("layers", 0, "candidates", 0, "witnesses"), "no", r"candidates\[0\]\.witnesses: expected None or a bool"),
    (("layers", 0, "list_queries"), 3, r"indexer\]\.list_queries: expected None or a power-of-two int"),
    (("layers", 0, "candidates", 0, "list_queries"), 0, r"candidates\[0\]\.list_queries: expected None or a power"),
    (("layers", 0, "r"), 32, r"\.r: expected fewer than heads"),
    (("layers", 0, "r"), True, r"\.r: expected an int"),
    (("layers", 0, "candidates", 0, "survival"), 1.5, r"candidates\[0\]\.survival"),
    (("layers", 0, "candidates", 0, "redo_frac"), -0.1, r"candidates\[0\]\.redo_frac"),
    (("layers", 0, "min_keys"), 2**63, r"\.min_keys: expected an int in \[1, 2147483647\]"),
    (("layers", 0, "reason"), 3, r"\.reason: expected a string"),
    (("layers", 0, "calibration_calls"), [[1, 2]], r"\.calibration_calls: expected a list of"),
    (("layers", 0, "seed_gap", "p50"), "x", r"seed_gap\.p50"),
    (("layers", 0, "slack"), KeyError, r"missing keys \['slack'\]"),
    (("layers", 1, "layer"), "model.layers.0.self_attn.indexer", "duplicate layer names"),
])
def test_malformed_fields_are_rejected_naming_the_field(path, value, message):
    with pytest.raises(PlanError, match=message):
        plan_from_dict(mutated(path, value))


def test_plan_error_is_a_value_error():
    assert issubclass(PlanError, ValueError)
