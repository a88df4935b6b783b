"""Capturing each indexer layer's inputs while the model runs, through the backend's own indexer pass.

With the option ``capture=True`` the DSA indexer pass puts ``torch.ops.pulsar_dosa.capture_topk``
where it would put ``certified_topk`` (same schema). That op records its inputs into the recorder of
the enclosing ``capturing()`` block and answers with ``runtime.dense_scorer.dense_topk`` (of the call's
precision: the FP8 scorer's inputs for an fp8 one), so the model computes exactly what it computes
uncompiled (compiled, for an fp8 precision). Layers are therefore found and named by the same
pattern matching and module paths as a normal compile: no model-specific hooks.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch

from compiler.ops.certified_topk import SCHEMA, fake_certified_topk, op_arguments, scored_operands
from runtime.dense_scorer import dense_topk


@dataclass(frozen=True)
class CapturedCall:
    """One indexer call's inputs as copies on the op's device, in their own dtypes."""

    q: torch.Tensor
    k: torch.Tensor
    weights: torch.Tensor
    topk: int
    mask: torch.Tensor | None


@dataclass
class CaptureRecorder:
    """layer (module path) -> captured calls, layers in the order they first ran."""

    calls: dict[str, list[CapturedCall]] = field(default_factory=dict)

    def record(self, layer: str, q, k, weights, topk: int, mask) -> None:
        entry = CapturedCall(q.detach().clone(), k.detach().clone(), weights.detach().clone(), int(topk),
                             None if mask is None else mask.detach().clone())
        self.calls.setdefault(layer, []).append(entry)


_ACTIVE: list[CaptureRecorder] = []


@contextlib.contextmanager
def capturing() -> Iterator[CaptureRecorder]:
    """Make a fresh recorder current: every ``capture_topk`` run inside the block records into it."""
    recorder = CaptureRecorder()
    _ACTIVE.append(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.pop()


def _capture_topk(*args, **kwargs):
    """Record the inputs under ``layer`` and return ``dense_topk`` of the scored operands (values
    float32, indices int64)."""
    a = op_arguments(args, kwargs)
    if not _ACTIVE:
        raise RuntimeError("pulsar_dosa.capture_topk ran outside compiler.plan.capture.capturing(): "
                           "compile with capture=True only to calibrate plans")
    _ACTIVE[-1].record(a["layer"], a["q"], a["k"], a["weights"], a["topk"], a["mask"])
    q, k, w, k_scale = scored_operands(a)
    return dense_topk(q, k, w, a["topk"], a["mask"], k_scale)


capture_topk = torch.library.custom_op("pulsar_dosa::capture_topk", _capture_topk, mutates_args=(),
                                       schema=SCHEMA)
capture_topk.register_fake(fake_certified_topk)


def capture_indexer_inputs(model: torch.nn.Module, batches: Iterable[torch.Tensor],
                           on_batch: Callable[[int], None] | None = None) -> CaptureRecorder:
    """Run ``model(batch)`` for each batch, compiled by the pulsar_dosa backend in capture mode, and
    return the recorded calls. ``on_batch(i)`` is called after batch i (progress reporting).

    Raises ValueError when no indexer was rewritten, with the pass's near misses as the reason.
    """
    from compiler.report import collecting

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
