"""Offline per-layer indexer plans: ``python -m compiler.plan`` (``compiler.plan.cli``).

``schema`` (the versioned JSON format), ``capture`` (recording each indexer layer's inputs through the
backend's own pass), ``inputs`` (loading the model and calibration tokens), ``measure`` (per-layer
measurements), ``choice`` (the layer's path from them), ``constants`` (timing the runtime
reference), ``plot`` and ``progress``. Importing the package loads only the schema.
"""
from compiler.plan.schema import LayerPlan, Plan, PlanError, load_plan, save_plan

__all__ = ["LayerPlan", "Plan", "PlanError", "load_plan", "save_plan"]
