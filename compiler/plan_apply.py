"""Compile-time settings of one rewritten indexer op: from the plan when one is given, else the cost
model's defaults.

``layer_settings`` returns the op's ``path``, ``r`` and ``min_keys`` arguments. ``min_keys`` carries
the crossover length: inside the op, a query with fewer visible keys is scored densely
(``CertifiedTopkConfig.min_keys`` under path "auto"), so the length dispatch happens at run time
without a graph break or a recompilation per length. A plan's dense layer becomes path "dense"; a
forced ``certified`` option other than "auto" overrides the plan's path but keeps its r.
"""
from __future__ import annotations

from dataclasses import dataclass

from compiler.cost_model import CPU_REFERENCE, H200_FITTED, IndexerShape, default_choice
from compiler.plan_schema import Plan, PlanError

DEFAULT_DESIGN_LENGTH = 131072
"""Key length the cost model's defaults are predicted for when no plan is given."""


@dataclass(frozen=True)
class LayerSettings:
    """The op arguments of one layer and where they came from ("plan <hash>", "cost model", "options")."""

    path: str
    r: int | None
    min_keys: int | None
    predicted_pruned_frac: float | None
    source: str

    def report_fields(self) -> dict:
        """What a rewrite entry of the report records about the choice."""
        return {"path": self.path, "r": self.r, "min_keys": self.min_keys,
                "predicted_pruned_frac": self.predicted_pruned_frac, "settings_from": self.source}

    def op_kwargs(self) -> dict:
        """``path``, ``r`` and ``min_keys`` for the op call (-1 = the runtime's default)."""
        return {"path": self.path, "r": -1 if self.r is None else self.r,
                "min_keys": -1 if self.min_keys is None else self.min_keys}


def _static_int(size) -> int | None:
    """A size known at compile time as a plain int, else None (symbolic)."""
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def indexer_settings(options, layer: str, q_shape, topk, device_type: str) -> LayerSettings:
    """``layer_settings`` for a rewrite: q_shape is the op's [B,S,H,D] q shape, topk its topk argument,
    ``options`` the backend's CompileOptions (its ``plan`` and ``certified`` fields)."""
    return layer_settings(layer, plan=options.plan, forced_path=options.certified,
                          heads=_static_int(q_shape[2]), head_dim=_static_int(q_shape[3]),
                          topk=_static_int(topk), device_type=device_type)


def layer_settings(layer: str, *, plan: Plan | None, forced_path: str, heads: int | None,
                   head_dim: int | None, topk: int | None, device_type: str) -> LayerSettings:
    """Settings of layer ``layer`` (module path). Sizes that are symbolic at compile time are None.

    With a plan: PlanError when the plan has no such layer or its geometry (heads, head_dim, topk)
    differs from the op's. Without one: the cost model's ``default_choice`` with the CPU reference
    constants on CPU and the H200 set on CUDA; the runtime's defaults when a size is symbolic.
    """
    if plan is not None:
        entry = plan.layer(layer)
        for name, planned, seen in (("heads", entry.heads, heads), ("head_dim", entry.head_dim, head_dim),
                                    ("topk", entry.topk, topk)):
            if seen is not None and planned != seen:
                raise PlanError(f"plan layer {layer!r}: {name}={planned} in the plan but {seen} in the model; "
                                "the plan was made for another model")
        path = forced_path if forced_path != "auto" else ("auto" if entry.path == "certified" else "dense")
        return LayerSettings(path, entry.r, entry.crossover, entry.predicted_pruned_frac,
                             f"plan {plan.hash[:12]}")
    if forced_path != "auto":
        return LayerSettings(forced_path, None, None, None, "options")
    if heads is None or head_dim is None or topk is None:
        return LayerSettings("auto", None, None, None, "runtime defaults")
    shape = IndexerShape(heads=heads, head_dim=head_dim, topk=topk)
    constants = H200_FITTED if device_type == "cuda" else CPU_REFERENCE
    choice = default_choice(shape, constants, DEFAULT_DESIGN_LENGTH)
    if choice.path == "dense":
        return LayerSettings("dense", None, None, None, "cost model")
    return LayerSettings("auto", None, choice.crossover, None, "cost model")
