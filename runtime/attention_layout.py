"""The active Pulsar attention layout: which keys each query of the running forward may see, and
which computation attends to them.

The driver (``runtime.pulsar``) enters one layout per forward with ``use_layout``; every attention
of the model (the ``pulsar_dosa`` attention op, or the transformers attention function of an
uncompiled model) calls ``active_layout().attend(q, k, v, scale)`` when a layout is active.
``PackedPhase`` (phase 1): the P packed tokens of a ``PackedLayout`` and its two-interval rule.
``QueryPhase`` (phase 2 and decode): ``kept`` cached keys then the new tokens; on the owner rank a
new token sees every kept key and the new tokens causally, elsewhere the kept keys only; partials
``(o, lse)`` are merged over ranks by ``merge``. ``attend`` is the one home of the choice: stock
``F.scaled_dot_product_attention`` where the layout is ordinary (causal) attention and no
log-sum-exp is needed and SDPA has a fused kernel for it, else the two-interval kernel registered
for the device (``register_attention_kernel``: the Triton kernel on CUDA, through the package's
``pulsar_dosa.attention_kernels`` entry point; ``runtime.attention_reference`` elsewhere)."""
from __future__ import annotations

import contextlib
import contextvars
import logging
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention
from torch.nn.attention.bias import causal_lower_right

from runtime.attention_reference import two_interval_attention

AttentionFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
MergeFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

KERNEL_ENTRY_POINTS = "pulsar_dosa.attention_kernels"
"""Entry-point group whose modules register attention kernels when imported."""

logger = logging.getLogger(__name__)
_KERNELS: dict[str, AttentionFn] = {}
_entry_points_loaded = False
_warned_devices: set[str] = set()


def register_attention_kernel(device_type: str, fn: AttentionFn) -> None:
    """Make ``fn`` the two-interval attention for tensors on ``device_type`` (e.g. ``"cuda"``)."""
    if not isinstance(device_type, str) or not device_type:
        raise TypeError(f"device_type must be a device type name such as 'cuda', got {device_type!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    _KERNELS[device_type] = fn


def _load_entry_points() -> None:
    """Import, once per process, every module of the ``KERNEL_ENTRY_POINTS`` group (each registers
    its kernels); a module that fails to import is logged and skipped (the reference remains)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for point in entry_points(group=KERNEL_ENTRY_POINTS):
        try:
            point.load()
        except Exception as error:  # a broken optional plugin must not break the reference path
            logger.warning("attention kernel entry point %r (%s) failed to load: %s", point.name, point.value, error)


def attention_kernel(device: torch.device) -> AttentionFn:
    """The two-interval attention registered for ``device.type``, else the plain-torch reference
    (a warning is logged once per device type other than CPU: the reference is slow there)."""
    if device.type not in _KERNELS:
        _load_entry_points()
    kernel = _KERNELS.get(device.type)
    if kernel is not None:
        return kernel
    if device.type != "cpu" and device.type not in _warned_devices:
        _warned_devices.add(device.type)
        logger.warning("no two-interval attention kernel is registered for %r tensors: using the plain-torch "
                       "reference (install the package or `import compiler` for the Triton kernel)", device.type)
    return two_interval_attention


def stock_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                    causal: bool) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` (GQA folded): query p sees keys ``[0, Sk - Sq + p]`` when
    ``causal`` (aligned to the last key, as new tokens after cached ones; ``[0, p]`` when Sq == Sk),
    else every key. q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D] with Sq <= Sk -> [B, Hq, Sq, D].

    Sq < Sk causally takes SDPA's lower-right ``CausalBias`` (no mask tensor in the fused kernels)."""
    sq, sk = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if causal and 1 < sq < sk:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(sq, sk), scale=float(scale),
                                              enable_gqa=gqa)
    # One query at the end sees every key: causal or not, no mask.
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal and sq > 1, scale=float(scale),
                                          enable_gqa=gqa)


def causal_sdpa_is_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``stock_attention(q, k, v, causal=True)`` runs without a score matrix in memory.

    On CUDA: flash attention (GQA included) or memory-efficient attention (no GQA) accepts the
    tensors — the kernels SDPA's lower-right causal bias uses; else SDPA would fall back to its
    math path, [B, Hq, Sq, Sk] scores. Elsewhere True: SDPA's own choice stands (there the
    alternative is usually the plain-torch reference)."""
    if q.device.type != "cuda":
        return True
    params = SDPAParams(q, k, v, None, 0.0, False, q.shape[1] != k.shape[1])
    return can_use_flash_attention(params) or can_use_efficient_attention(params)


@dataclass
class PackedPhase:
    """Phase-1 visibility over P packed tokens: ``prefix_end`` and ``segment_start`` int64 [P]
    (keep them on the model's device: they are read by every attention layer).

    ``causal`` (derived): every token sees exactly the tokens up to itself (one ordinary causal
    sequence, e.g. dense mode), which ``stock_attention`` computes.
    """

    prefix_end: torch.Tensor
    segment_start: torch.Tensor
    calls: int = field(default=0, init=False)
    causal: bool = field(init=False)

    def __post_init__(self) -> None:
        self.causal = not bool(self.prefix_end.any()) and not bool(self.segment_start.any())

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
               attention_fn: Optional[AttentionFn] = None) -> torch.Tensor:
        """q [B, Hq, P, D], k/v [B, Hkv, P, D] (the packed tokens, nothing cached) -> o [B, Hq, P, D].

        ``attention_fn``: a two-interval attention to use instead of the module's choice."""
        packed = self.prefix_end.numel()
        if q.shape[2] != packed or k.shape[2] != packed:
            raise ValueError(f"phase-1 attention expects {packed} packed queries and keys, got "
                             f"q length {q.shape[2]} and k length {k.shape[2]} (was the cache empty?)")
        self.calls += 1
        if attention_fn is None and self.causal:
            return stock_attention(q, k, v, scale=scale, causal=True)
        batch = q.shape[0]
        prefix_end = self.prefix_end.to(q.device).expand(batch, packed)
        segment_start = self.segment_start.to(q.device).expand(batch, packed)
        attention_fn = attention_kernel(q.device) if attention_fn is None else attention_fn
        out, _ = attention_fn(q, k, v, prefix_end, segment_start, scale=float(scale), q_start=0)
        return out


@dataclass
class QueryPhase:
    """Phase-2/decode visibility: ``kept`` cached keys first, new tokens after them.

    ``owner``: this rank holds the new tokens' KV (it sees them causally); ``merge``: combines
    this rank's partial ``(o, lse)`` with the other ranks' (None on one device). One instance
    serves one forward: the interval bounds it builds for the kernel are shared by its layers.
    """

    kept: int
    owner: bool = True
    merge: Optional[MergeFn] = None
    calls: int = field(default=0, init=False)
    _bounds: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, init=False,
                                                                    repr=False)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
               attention_fn: Optional[AttentionFn] = None) -> torch.Tensor:
        """q [B, Hq, Sq, D] new tokens, k/v [B, Hkv, kept + n, D] -> o [B, Hq, Sq, D] over all ranks.

        ``attention_fn``: a two-interval attention to use instead of the module's choice."""
        sq, sk = q.shape[2], k.shape[2]
        if sk < self.kept + sq:
            raise ValueError(f"query-phase attention expects at least kept + queries = {self.kept + sq} "
                             f"keys, got {sk}")
        self.calls += 1
        if (attention_fn is None and self.merge is None and self.owner
                and (sq == 1 or causal_sdpa_is_fused(q, k, v))):
            # Every kept key, then the new tokens causally: causal attention aligned to the last key.
            return stock_attention(q, k, v, scale=scale, causal=True)
        prefix_end, segment_start = self.bounds(q.shape[0], sq, sk, q.device)
        attention_fn = attention_kernel(q.device) if attention_fn is None else attention_fn
        out, lse = attention_fn(q, k, v, prefix_end, segment_start, scale=float(scale), q_start=sk - sq)
        if self.merge is None:
            return out
        merged, _ = self.merge(out, lse)
        return merged

    def bounds(self, batch: int, queries: int, keys: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(prefix_end, segment_start)`` int64 [batch, queries] on ``device`` for ``keys`` keys,
        built once per argument set: the kept keys ``[0, kept)``, then on the owner the keys from
        ``kept`` on causally (elsewhere an empty interval)."""
        key = (batch, queries, keys, device)
        if key not in self._bounds:
            prefix_end = torch.full((batch, queries), self.kept, dtype=torch.int64, device=device)
            segment_start = torch.full((batch, queries), self.kept if self.owner else keys, dtype=torch.int64,
                                       device=device)
            self._bounds[key] = prefix_end, segment_start
        return self._bounds[key]


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
