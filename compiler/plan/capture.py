"""Capturing each indexer layer's inputs while the model runs, through the backend's own indexer pass.

``capture_indexer_inputs`` compiles the model with the option ``capture=True`` (the indexer pass then
emits ``pulsar_dosa::capture_topk``, ``compiler.ops.capture_topk``) and runs it: layers are found and
named by the same pattern matching and module paths as a normal compile, with no model-specific hooks.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from compiler.ops.capture_topk import CaptureRecorder, capturing
from compiler.report import collecting


def capture_indexer_inputs(model: torch.nn.Module, batches: Iterable[torch.Tensor],
                           on_batch: Callable[[int], None] | None = None) -> CaptureRecorder:
    """Run ``model(batch)`` for each batch, compiled by the pulsar_dosa backend in capture mode, and
    return the recorded calls. ``on_batch(i)`` is called after batch i (progress reporting).

    Raises ValueError when no indexer was rewritten, with the pass's near misses as the reason.
    """
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pulsar_dosa", options={"capture": True, "downstream": "eager"})
    with collecting() as report, capturing() as recorder, torch.no_grad():
        for i, batch in enumerate(batches):
            compiled(batch)
            if on_batch is not None:
                on_batch(i)
    torch._dynamo.reset()
    if not recorder.calls:
        misses = "; ".join(f"{m.module or m.node}: {m.reason}" for m in report.near_misses
                           if m.kind == "dsa_indexer") or "no candidate pattern"
        raise ValueError(f"model {type(model).__name__} has no DSA indexer that the pulsar_dosa pass "
                         f"rewrites ({misses}); a plan needs at least one indexer layer")
    return recorder
