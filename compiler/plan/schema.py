"""The versioned JSON format of per-layer indexer plans: dataclasses, validation, load/save, hash.

A plan file is one JSON object: ``{"format": "pulsar-dosa-plan", "version": 3, "model", "inputs"
(free-form descriptions), "design_length", "queries" (null: causal prefill), "constants"
(KernelConstants fields), "layers": [...]}``; each layer: its module path, its ``TopkSettings``
(``"path"`` "auto" with ``"r"`` and ``"min_keys"`` in [1, MAX_KEYS], or "dense" with both null;
``"list_queries"``, the survivor lists' size, and ``"witnesses"``, whether anchors seed the
threshold, each written only when the plan chose one: absent is null, the runtime's default, so that
plans written before the keys existed load and hash as they did),
``heads``, ``head_dim``, ``topk``, the predictions and ``reason`` (``compiler.plan.choice``), the
calibration calls [B, S, T], the candidate measurements (each with its ``"list_queries"`` and
``"witnesses"`` under the same rule) and the seed-gap and slack distributions (``count``, ``mean``,
``min``, ``max``, ``p05``, ``p50``, ``p95``). ``plan_hash`` is the SHA-256 of the canonical JSON text (sorted keys,
no spaces): formatting does not change it, any content does.
Every problem raises ``PlanError`` (a ValueError) naming the offending field."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from compiler.cost_model import KernelConstants
from compiler.topk_settings import TopkSettings, check_witnesses
from runtime.certified_topk import check_list_queries

PLAN_FORMAT = "pulsar-dosa-plan"
PLAN_VERSION = 3
PLAN_PATHS = ("auto", "dense")
"""The paths a plan gives a layer: "auto" from its min_keys (certified where the guard agrees), or "dense"."""
MAX_KEYS = 2**31 - 1
"""Largest key length a plan may name (the kernels index keys with int32)."""
_DISTRIBUTION_KEYS = ("count", "mean", "min", "max", "p05", "p50", "p95")
_OPTIONAL = frozenset({"list_queries", "witnesses"})
"""Keys of a layer or a candidate that may be absent (read as null) and are not written when null."""


class PlanError(ValueError):
    """A plan file that is unreadable, malformed, of another version, or does not match the model."""


@dataclass(frozen=True)
class Distribution:
    """Summary of a sample of floats (seed gaps b or slacks δ); quantiles by linear interpolation."""

    count: int
    mean: float
    min: float
    max: float
    p05: float
    p50: float
    p95: float


@dataclass(frozen=True)
class CandidateMeasurement:
    """Budget r measured on real activations, with survivor lists of ``list_queries`` queries (None:
    the pipeline's default size) and anchor witnesses on or off (``witnesses``; None: the runtime's
    default): m(r) = survivors / keys_screened, the fraction of certified queries redone densely,
    the summed call time (ms, None when not timed) and counts."""

    r: int
    survival: float
    redo_frac: float
    ms: float | None
    queries: int
    certified_queries: int
    keys_screened: int
    survivors: int
    fallbacks: Mapping[str, int]
    list_queries: int | None = None
    witnesses: bool | None = None


@dataclass(frozen=True)
class LayerPlan:
    """The plan of one indexer layer, addressed by its module path: its ``settings`` and the evidence."""

    layer: str
    settings: TopkSettings
    heads: int
    head_dim: int
    topk: int
    predicted_pruned_frac: float | None
    predicted_speedup: float
    reason: str
    dense_ms: float | None
    calibration_calls: tuple[tuple[int, int, int], ...]
    candidates: tuple[CandidateMeasurement, ...]
    seed_gap: Distribution | None
    slack: Distribution | None


@dataclass(frozen=True)
class Plan:
    """A whole plan; ``layers`` in model order, one per indexer layer."""

    model: Any
    inputs: Any
    design_length: int
    queries: int | None
    constants: KernelConstants
    layers: tuple[LayerPlan, ...]
    version: int = PLAN_VERSION

    def layer(self, name: str) -> LayerPlan:
        """The plan of layer ``name`` (PlanError when the plan has no such layer)."""
        for entry in self.layers:
            if entry.layer == name:
                return entry
        raise PlanError(f"plan has no layer {name!r}; its layers are {[e.layer for e in self.layers]}")

    def layer_for(self, name: str, *, heads: int | None, head_dim: int | None, topk: int | None) -> LayerPlan:
        """The plan of layer ``name`` for a model layer of this geometry (None: a size not known yet);
        PlanError when the plan has no such layer or was made for another geometry."""
        entry = self.layer(name)
        for field, planned, seen in (("heads", entry.heads, heads), ("head_dim", entry.head_dim, head_dim),
                                     ("topk", entry.topk, topk)):
            if seen is not None and planned != seen:
                raise PlanError(f"plan layer {name!r}: {field}={planned} in the plan but {seen} in the model; "
                                "the plan was made for another model")
        return entry

    def to_dict(self) -> dict:
        return {
            "format": PLAN_FORMAT,
            "version": self.version,
            "model": self.model,
            "inputs": self.inputs,
            "design_length": self.design_length,
            "queries": self.queries,
            "constants": self.constants.to_dict(),
            "layers": [_layer_to_dict(e) for e in self.layers],
        }

    @property
    def hash(self) -> str:
        return plan_hash(self)


def _omit_null_optional(fields: dict) -> dict:
    """``fields`` without the optional keys (``_OPTIONAL``) that are None."""
    return {k: v for k, v in fields.items() if k not in _OPTIONAL or v is not None}


def _layer_to_dict(e: LayerPlan) -> dict:
    return {
        "layer": e.layer, **_omit_null_optional(e.settings.op_arguments()),
        "heads": e.heads, "head_dim": e.head_dim, "topk": e.topk,
        "predicted_pruned_frac": e.predicted_pruned_frac, "predicted_speedup": e.predicted_speedup,
        "reason": e.reason, "dense_ms": e.dense_ms, "calibration_calls": [list(c) for c in e.calibration_calls],
        "candidates": [{"r": c.r, "survival": c.survival, "redo_frac": c.redo_frac, "ms": c.ms,
                        "queries": c.queries, "certified_queries": c.certified_queries,
                        "keys_screened": c.keys_screened, "survivors": c.survivors,
                        "fallbacks": dict(sorted(c.fallbacks.items())),
                        **_omit_null_optional({"list_queries": c.list_queries, "witnesses": c.witnesses})}
                       for c in e.candidates],
        "seed_gap": None if e.seed_gap is None else _dist_to_dict(e.seed_gap),
        "slack": None if e.slack is None else _dist_to_dict(e.slack),
    }


def _dist_to_dict(d: Distribution) -> dict:
    return {k: getattr(d, k) for k in _DISTRIBUTION_KEYS}


def canonical_json(plan: Plan) -> str:
    """The plan as canonical JSON text (sorted keys, compact separators, no NaN/inf)."""
    return json.dumps(plan.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)


def plan_hash(plan: Plan) -> str:
    """SHA-256 hex digest of the canonical JSON text."""
    return hashlib.sha256(canonical_json(plan).encode("utf-8")).hexdigest()


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write the plan as indented JSON (validated by a round trip first)."""
    plan_from_dict(json.loads(canonical_json(plan)))
    Path(path).write_text(json.dumps(plan.to_dict(), indent=1, allow_nan=False) + "\n", encoding="utf-8")


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file (PlanError for unreadable, corrupt, other-version or bad fields)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"plan {str(path)!r}: cannot read it ({exc})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"plan {str(path)!r} is not valid JSON ({exc})") from exc
    return plan_from_dict(data)


def plan_from_dict(data: Any) -> Plan:
    """Validate a decoded plan document and build the Plan."""
    if not isinstance(data, dict):
        raise PlanError(f"plan: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != PLAN_FORMAT:
        raise PlanError(f"plan.format: expected {PLAN_FORMAT!r}, got {data.get('format')!r}")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise PlanError(f"plan.version: expected an int, got {version!r}")
    if version < PLAN_VERSION:
        raise PlanError(f"plan.version {version} is older than the supported version {PLAN_VERSION}: "
                        "regenerate it with python -m compiler.plan")
    if version > PLAN_VERSION:
        raise PlanError(f"plan.version {version} is newer than the supported version {PLAN_VERSION}")
    _keys("plan", data, {"format", "version", "model", "inputs", "design_length", "queries",
                         "constants", "layers"})
    try:
        constants = KernelConstants.from_dict(data["constants"])
    except (TypeError, ValueError) as exc:
        raise PlanError(f"plan.constants: {exc}") from exc
    layers = data["layers"]
    if not isinstance(layers, list) or not layers:
        raise PlanError("plan.layers: expected a non-empty list")
    parsed = tuple(_layer(f"plan.layers[{i}]", e) for i, e in enumerate(layers))
    names = [e.layer for e in parsed]
    if len(set(names)) != len(names):
        raise PlanError(f"plan.layers: duplicate layer names in {names}")
    return Plan(model=data["model"], inputs=data["inputs"],
                design_length=_int("plan.design_length", data["design_length"], 1),
                queries=_opt(_int, "plan.queries", data["queries"], 1),
                constants=constants, layers=parsed, version=version)


def _keys(where: str, obj: Any, expected: set[str]) -> None:
    if not isinstance(obj, dict):
        raise PlanError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing, unknown = sorted(expected - _OPTIONAL - set(obj)), sorted(set(obj) - expected)
    if missing or unknown:
        raise PlanError(f"{where}: missing keys {missing}, unknown keys {unknown}")


def _int(where: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        expected = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
        raise PlanError(f"{where}: expected {expected}, got {value!r}")
    return value


def _float(where: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise PlanError(f"{where}: expected a number in [{low}, {high}], got {value!r}")
    return float(value)


def _opt(check, where: str, value: Any, *bounds):
    return None if value is None else check(where, value, *bounds)


def _setting(where: str, obj: dict, name: str, check) -> Any:
    """The optional setting ``name`` of a layer or a candidate (absent: None), checked by ``check``
    (``check_list_queries``, ``check_witnesses``), whose error becomes a PlanError naming it."""
    value = obj.get(name)
    try:
        check(value, f"{where}.{name}")
    except (TypeError, ValueError) as exc:
        raise PlanError(str(exc)) from exc
    return value


def _layer(where: str, e: Any) -> LayerPlan:
    _keys(where, e, {"layer", "path", "r", "min_keys", "list_queries", "witnesses", "heads", "head_dim", "topk",
                     "predicted_pruned_frac", "predicted_speedup", "reason", "dense_ms", "calibration_calls",
                     "candidates", "seed_gap", "slack"})
    if not isinstance(e["layer"], str):
        raise PlanError(f"{where}.layer: expected a module path string ('' is the compiled module itself), "
                        f"got {e['layer']!r}")
    where = f"plan.layers[{e['layer']}]"
    if e["path"] not in PLAN_PATHS:
        raise PlanError(f"{where}.path: expected one of {PLAN_PATHS}, got {e['path']!r}")
    heads = _int(f"{where}.heads", e["heads"], 1)
    r = _opt(_int, f"{where}.r", e["r"], 1)
    min_keys = _opt(_int, f"{where}.min_keys", e["min_keys"], 1, MAX_KEYS)
    if e["path"] == "auto" and (r is None or min_keys is None):
        raise PlanError(f"{where}: an 'auto' layer needs r and min_keys, got r={r!r}, min_keys={min_keys!r}")
    list_queries = _setting(where, e, "list_queries", check_list_queries)
    witnesses = _setting(where, e, "witnesses", check_witnesses)
    if e["path"] == "dense" and (r, min_keys, list_queries, witnesses) != (None, None, None, None):
        raise PlanError(f"{where}: a dense layer has r, min_keys, list_queries and witnesses null, got r={r!r}, "
                        f"min_keys={min_keys!r}, list_queries={list_queries!r}, witnesses={witnesses!r}")
    if r is not None and r >= heads:
        raise PlanError(f"{where}.r: expected fewer than heads={heads}, got {r}")
    candidates = e["candidates"]
    if not isinstance(candidates, list):
        raise PlanError(f"{where}.candidates: expected a list")
    if not isinstance(e["reason"], str):
        raise PlanError(f"{where}.reason: expected a string, got {e['reason']!r}")
    calls = e["calibration_calls"]
    if not isinstance(calls, list) or not all(isinstance(c, list) and len(c) == 3 for c in calls):
        raise PlanError(f"{where}.calibration_calls: expected a list of [batch, queries, keys]")
    return LayerPlan(
        layer=e["layer"], settings=TopkSettings(e["path"], r, min_keys, list_queries, witnesses), heads=heads,
        head_dim=_int(f"{where}.head_dim", e["head_dim"], 1),
        topk=_int(f"{where}.topk", e["topk"], 1),
        predicted_pruned_frac=_opt(_float, f"{where}.predicted_pruned_frac", e["predicted_pruned_frac"], 0.0, 1.0),
        predicted_speedup=_float(f"{where}.predicted_speedup", e["predicted_speedup"], 0.0, math.inf),
        reason=e["reason"], dense_ms=_opt(_float, f"{where}.dense_ms", e["dense_ms"], 0.0, math.inf),
        calibration_calls=tuple(tuple(_int(f"{where}.calibration_calls[{i}]", n, 0) for n in c)
                                for i, c in enumerate(calls)),
        candidates=tuple(_candidate(f"{where}.candidates[{i}]", c) for i, c in enumerate(candidates)),
        seed_gap=_opt(_distribution, f"{where}.seed_gap", e["seed_gap"]),
        slack=_opt(_distribution, f"{where}.slack", e["slack"]),
    )


def _candidate(where: str, c: Any) -> CandidateMeasurement:
    _keys(where, c, {"r", "survival", "redo_frac", "ms", "queries", "certified_queries", "keys_screened",
                     "survivors", "fallbacks", "list_queries", "witnesses"})
    fallbacks = c["fallbacks"]
    if not isinstance(fallbacks, dict):
        raise PlanError(f"{where}.fallbacks: expected an object reason -> count")
    return CandidateMeasurement(
        r=_int(f"{where}.r", c["r"], 1),
        survival=_float(f"{where}.survival", c["survival"], 0.0, 1.0),
        redo_frac=_float(f"{where}.redo_frac", c["redo_frac"], 0.0, 1.0),
        ms=_opt(_float, f"{where}.ms", c["ms"], 0.0, math.inf),
        queries=_int(f"{where}.queries", c["queries"], 0),
        certified_queries=_int(f"{where}.certified_queries", c["certified_queries"], 0),
        keys_screened=_int(f"{where}.keys_screened", c["keys_screened"], 0),
        survivors=_int(f"{where}.survivors", c["survivors"], 0),
        fallbacks={str(k): _int(f"{where}.fallbacks[{k}]", v, 0) for k, v in fallbacks.items()},
        list_queries=_setting(where, c, "list_queries", check_list_queries),
        witnesses=_setting(where, c, "witnesses", check_witnesses),
    )


def _distribution(where: str, d: Any) -> Distribution:
    _keys(where, d, set(_DISTRIBUTION_KEYS))
    values = {k: _float(f"{where}.{k}", d[k], -math.inf, math.inf) for k in _DISTRIBUTION_KEYS if k != "count"}
    return Distribution(count=_int(f"{where}.count", d["count"], 1), **values)
