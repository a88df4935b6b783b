"""``torch.ops.pulsar_dosa.capture_topk``: the recording twin of ``certified_topk`` (same schema).

With the option ``capture=True`` the DSA indexer pass emits it where it would emit ``certified_topk``.
It records its inputs (``CapturedCall``) into the recorder of the enclosing ``capturing()`` block,
under the op's ``layer`` argument, and answers with ``runtime.dense_scorer.dense_topk`` of the scored
operands (``certified_topk.scored_operands``: the FP8 scorer's inputs for an fp8 ``precision``), so
that the model computes what it computes uncompiled (compiled, for an fp8 precision). Outside such a
block it raises ``RuntimeError``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

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
        raise RuntimeError("pulsar_dosa.capture_topk ran outside compiler.ops.capture_topk.capturing(): "
                           "compile with capture=True only to calibrate plans")
    _ACTIVE[-1].record(a["layer"], a["q"], a["k"], a["weights"], a["topk"], a["mask"])
    q, k, w, k_scale = scored_operands(a)
    return dense_topk(q, k, w, a["topk"], a["mask"], k_scale)


capture_topk = torch.library.custom_op("pulsar_dosa::capture_topk", _capture_topk, mutates_args=(),
                                       schema=SCHEMA)
capture_topk.register_fake(fake_certified_topk)
