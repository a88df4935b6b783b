"""Call time: the form of one ``absorbed_sparse_attention`` call whose compile-time form is "auto".

``choose_form(q, latent, rope_key, kv_b_weight, indices, mask, site)`` reads what the call's
kernels say about it (``compiler.lowering.attention.latent_attention``: which absorbed kernel would
run, the union form's bytes; ``union_attention``'s tile) and hands it to ``call_sparse_form``,
which returns "absorbed" or "union" (the latent expanded into keys and values, then the union
kernels): the one that ``cost_model`` predicts faster given the mean union of a tile's selections
over their width (``union_ratio``). That ratio lies in ``[1/topk, min(tile, T/topk)]``; only when
the range straddles the crossover is it asked for. ``RECORDS`` answers with the last measurement
of the call's site (the attention module) and size buckets: the first call of a key waits for its
own measurement (one host synchronisation), every later one enqueues a new measurement and reads
it on a later call, once the device has made it (the host never waits). A call that may not
measure (a CUDA graph is being captured) decides on its head count (``cost_model.shape_form``);
one whose union form does not fit in ``defaults.FREE_FRACTION`` of the device's free memory takes
absorbed. Either form gives the same result to rounding: the choice is speed only. ``picks()``:
how many calls of this process took each form.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Hashable, Optional

import torch

from compiler import defaults
from compiler.autotune import graph_capturing, length_bucket
from compiler.cost_model import shape_form, union_ratio_crossover
from compiler.lowering.attention.latent_attention import union_bytes, warp_specialised
from compiler.lowering.attention.selection_overlap import union_ratio
from compiler.lowering.attention.union_attention import tile_rows
from runtime.absorbed_attention import absorbed_dims

__all__ = ["OverlapRecords", "RECORDS", "call_sparse_form", "choose_form", "picks"]

_PICKS: Counter = Counter()


def picks() -> dict[str, int]:
    """Calls of this process per form returned by ``call_sparse_form``."""
    return dict(_PICKS)


def _picked(form: str, reason: str) -> tuple[str, str]:
    _PICKS[form] += 1
    return form, reason


@dataclass
class _Record:
    ratio: Optional[float] = None
    pending: Optional[tuple[torch.cuda.Event, torch.Tensor]] = None


class OverlapRecords:
    """The last measured union ratio per key (module docstring); ``ratio(key, measure)`` with
    ``measure()`` returning a 0-dim tensor on the call's device."""

    def __init__(self) -> None:
        self._records: dict[Hashable, _Record] = {}

    def ratio(self, key: Hashable, measure: Callable[[], torch.Tensor]) -> float:
        record = self._records.setdefault(key, _Record())
        if record.pending is not None and record.pending[0].query():
            record.ratio, record.pending = float(record.pending[1]), None
        if record.ratio is None:
            record.ratio = float(measure())
        elif record.pending is None:
            value = measure()
            if value.is_cuda:
                host = torch.empty((), dtype=value.dtype, pin_memory=True)
                host.copy_(value, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                record.pending = (event, host)
            else:
                record.ratio = float(value)
        return record.ratio

    def clear(self) -> None:
        self._records.clear()


RECORDS = OverlapRecords()
"""The process-wide records the absorbed op's "auto" calls read."""


def call_sparse_form(*, batch: int, queries: int, topk: int, heads: int, tile: int, warp_specialised: bool,
                     expand: tuple[int, int, int, int, int], union_fits: bool, may_measure: bool,
                     measure_ratio: Callable[[], float]) -> tuple[str, str]:
    """``(form, reason)`` of a call of ``batch·queries`` queries selecting ``topk`` keys for ``heads``
    heads; ``tile``: queries per union tile; ``warp_specialised``: the absorbed form would run the
    Gluon kernel; ``expand = (T, Dc, Dn, Dr, Dv)``; ``union_fits``: the expansion and the unions'
    workspace fit in free memory (else absorbed); ``measure_ratio()`` returns the ratio."""
    if not union_fits:
        return _picked("absorbed", "the expanded keys and values and the unions' workspace do not fit in free "
                                   "memory")
    crossover = union_ratio_crossover(batch, queries, topk, heads, warp_specialised, expand=expand)
    highest = min(tile, expand[0] / topk)
    if crossover <= 1 / topk:
        return _picked("absorbed", f"union predicted slower at any overlap (crossover ratio {crossover:.3g})")
    if crossover > highest:
        return _picked("union", f"union predicted faster at any overlap (crossover ratio {crossover:.3g} > "
                                f"{highest:.3g})")
    if not may_measure:
        return _picked(*shape_form(heads))
    ratio = measure_ratio()
    winner = "union" if ratio < crossover else "absorbed"
    return _picked(winner, f"mean tile union {ratio:.3g} x topk against the crossover {crossover:.3g}")


def _free_bytes(device: torch.device) -> Optional[int]:
    """Bytes free on a CUDA device outside the caching allocator's pool (the pool's unused blocks
    are not counted: reading them costs more host time than the choice is worth)."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def _union_fits(q, latent, rope_key, kv_b_weight, indices) -> bool:
    """Whether the union form's expanded keys and values and its workspace fit in
    ``defaults.FREE_FRACTION`` of the free memory."""
    free = _free_bytes(q.device)
    if free is None:
        return True
    return union_bytes(q, latent, rope_key, kv_b_weight, indices) <= defaults.FREE_FRACTION * free


def choose_form(q, latent, rope_key, kv_b_weight, indices, mask, site: str = "") -> tuple[str, str]:
    """``(form, reason)`` of an "auto" call on checked inputs with a query, a key and a selection
    (``call_sparse_form``), its union ratio from ``RECORDS`` under (``site``, device, B, H, K, the
    buckets of S and T)."""
    b, heads, s, _ = q.shape
    dims = absorbed_dims(q, rope_key, kv_b_weight)
    t_len, width = latent.shape[1], indices.shape[2]
    tile = tile_rows(s)
    capturing = graph_capturing(q.device)
    return call_sparse_form(
        batch=b, queries=s, topk=max(width, 1), heads=heads, tile=tile,
        warp_specialised=warp_specialised(q, latent, rope_key),
        expand=(t_len, latent.shape[2], dims[0], dims[1], dims[2]),
        union_fits=_union_fits(q, latent, rope_key, kv_b_weight, indices), may_measure=not capturing,
        measure_ratio=lambda: RECORDS.ratio((site, q.device, b, heads, width, length_bucket(s), length_bucket(t_len)),
                                            lambda: union_ratio(indices, mask, t_len, tile)))
