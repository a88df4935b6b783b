"""The active Pulsar attention layout: which keys each query of the running forward may see.

The Pulsar driver (``runtime.pulsar``) enters one layout per model forward with ``use_layout``;
every attention of the model (the ``pulsar_dosa`` attention op of a compiled model, or the
transformers attention function of an uncompiled one) asks ``active_layout()`` and, when a layout
is active, calls its ``attend``. With no active layout attention is ordinary attention.

* ``PackedPhase`` (phase 1): the forward runs over the P packed tokens of a
  ``runtime.assembly.PackedLayout`` with an empty cache; keys are the same P tokens and the
  two-interval rule of the layout decides visibility (true position ids come with the input).
* ``QueryPhase`` (phase 2 and decode): the cache starts with ``kept`` local keys (the kept KV of
  this rank's blocks), followed by the new tokens. On the owner rank a new token sees every kept
  key and the new tokens causally; elsewhere it sees the kept keys only. The partial
  ``(o, lse)`` is merged over ranks by ``merge`` (one device: no merge, the partial is exact).

An attention function has the signature of ``runtime.attention_reference.two_interval_attention``.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import torch

from runtime.attention_reference import two_interval_attention

AttentionFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
MergeFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class PackedPhase:
    """Phase-1 visibility over P packed tokens: ``prefix_end`` and ``segment_start`` int64 [P]."""

    prefix_end: torch.Tensor
    segment_start: torch.Tensor
    calls: int = field(default=0, init=False)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
               attention_fn: AttentionFn = two_interval_attention) -> torch.Tensor:
        """q [B, Hq, P, D], k/v [B, Hkv, P, D] (the packed tokens, nothing cached) -> o [B, Hq, P, D]."""
        packed = self.prefix_end.numel()
        if q.shape[2] != packed or k.shape[2] != packed:
            raise ValueError(f"phase-1 attention expects {packed} packed queries and keys, got "
                             f"q length {q.shape[2]} and k length {k.shape[2]} (was the cache empty?)")
        batch = q.shape[0]
        prefix_end = self.prefix_end.to(q.device).expand(batch, packed)
        segment_start = self.segment_start.to(q.device).expand(batch, packed)
        self.calls += 1
        out, _ = attention_fn(q, k, v, prefix_end, segment_start, scale=float(scale), q_start=0)
        return out


@dataclass
class QueryPhase:
    """Phase-2/decode visibility: ``kept`` cached keys first, new tokens after them.

    ``owner``: this rank holds the new tokens' KV (it sees them causally); ``merge``: combines
    this rank's partial ``(o, lse)`` with the other ranks' (None on one device).
    """

    kept: int
    owner: bool = True
    merge: Optional[MergeFn] = None
    calls: int = field(default=0, init=False)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
               attention_fn: AttentionFn = two_interval_attention) -> torch.Tensor:
        """q [B, Hq, Sq, D] new tokens, k/v [B, Hkv, kept + n, D] -> o [B, Hq, Sq, D] over all ranks."""
        batch, _, sq, _ = q.shape
        sk = k.shape[2]
        if sk < self.kept + sq:
            raise ValueError(f"query-phase attention expects at least kept + queries = {self.kept + sq} "
                             f"keys, got {sk}")
        prefix_end = torch.full((batch, sq), self.kept, dtype=torch.int64, device=q.device)
        # Owner: the new tokens are keys [kept, sk) seen causally; elsewhere an empty interval.
        segment_start = torch.full((batch, sq), self.kept if self.owner else sk, dtype=torch.int64,
                                   device=q.device)
        self.calls += 1
        out, lse = attention_fn(q, k, v, prefix_end, segment_start, scale=float(scale), q_start=sk - sq)
        if self.merge is None:
            return out
        merged, _ = self.merge(out, lse)
        return merged


Layout = PackedPhase | QueryPhase

_ACTIVE: contextvars.ContextVar[Optional[Layout]] = contextvars.ContextVar("pulsar_layout", default=None)


def active_layout() -> Optional[Layout]:
    """The layout entered by the innermost ``use_layout``, or None (ordinary attention)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def use_layout(layout: Layout) -> Iterator[Layout]:
    """Make ``layout`` the active layout for the duration of the block."""
    if not isinstance(layout, (PackedPhase, QueryPhase)):
        raise TypeError(f"layout must be a PackedPhase or QueryPhase, got {type(layout).__name__}")
    token = _ACTIVE.set(layout)
    try:
        yield layout
    finally:
        _ACTIVE.reset(token)
