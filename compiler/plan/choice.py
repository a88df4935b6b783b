"""Plan time: one layer's path from its calibration measurements (``choose_layer``).

From the survival m(r), the fraction of queries redone densely and the measured times of dense and
of each candidate (a budget r with survivor lists of ``list_queries`` queries and anchor
``witnesses`` on or off, None the runtime's default for either) on the calibration calls, the
candidate with the lowest predicted time at the design length (on a tie the earlier of (r, default
lists first, then smaller lists, default witnesses first, then off, then on)); its r, list size and
witnesses become the layer's settings: the cost model's prediction (``compiler.cost_model``) scaled
by the ratio measured on the calibration calls. A budget that lost to dense there stays a candidate only when
the design length is longer than every calibration call (the certified advantage grows with the
key count), and is then certified only above the longest one. The layer is certified (path "auto"
from ``min_keys`` keys, the crossover) only with enough evidence (``defaults.MIN_SCREENED_KEYS``,
``defaults.MIN_CERTIFIED_QUERIES``) and a predicted time below ``defaults.PAYS_BELOW`` of dense;
otherwise it is dense. ``reason`` says which, in one sentence.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from compiler import defaults
from compiler.cost_model import (IndexerShape, KernelConstants, T as LENGTH, certified_call_time, crossover_length,
                                 dense_call_time)
from compiler.topk_settings import TopkSettings

__all__ = ["LayerChoice", "choose_layer", "short_candidates"]

DENSE = TopkSettings("dense")


@dataclass(frozen=True)
class LayerChoice:
    """The decision for one layer: its ``settings`` (path "auto" with r, min_keys, the list size and
    the witnesses, or "dense"), the predicted pruned fraction 1 - m(r), the predicted speedup over
    dense at the design length, and ``reason``, one readable sentence."""

    settings: TopkSettings
    predicted_pruned_frac: float | None
    predicted_speedup: float
    reason: str


def short_candidates(heads: int) -> list[int]:
    """Default plan budgets: r = 2^j - 1 with r + 1 at most ``defaults.SHORT_CANDIDATE_ROWS`` and at most
    half the ``heads`` (more screen rows cost as much as half the dense products)."""
    limit = min(defaults.SHORT_CANDIDATE_ROWS, heads // 2)
    return [(1 << j) - 1 for j in range(1, limit.bit_length()) if (1 << j) <= limit]


def _label(c) -> str:
    """A candidate in a reason: "r=15", "r=15 lists of 2" with a list size of its own, and " with
    witnesses" or " without witnesses" with a witnesses setting of its own."""
    lists = "" if c.list_queries is None else f" lists of {c.list_queries}"
    witnesses = "" if c.witnesses is None else " with witnesses" if c.witnesses else " without witnesses"
    return f"r={c.r}{lists}{witnesses}"


def _order(c) -> tuple[int, int, int]:
    """Candidates in (r, list size, witnesses) order, each budget's default lists first, then the
    default witnesses, then witnesses off, then on."""
    return c.r, 0 if c.list_queries is None else c.list_queries, 0 if c.witnesses is None else 1 + c.witnesses


def _call_shape(heads, head_dim, topk, batch, queries, keys):
    """(IndexerShape, length) of one calibration call: a prefill when queries == keys."""
    return IndexerShape(heads=heads, head_dim=head_dim, topk=topk, batch=batch,
                        queries=None if queries == keys else queries), keys


def choose_layer(candidates: Sequence, dense_ms: float | None, calls: Sequence[tuple[int, int, int]], *,
                 heads: int, head_dim: int, topk: int, constants: KernelConstants, design_length: int,
                 queries: int | None) -> LayerChoice:
    """The plan's decision for one layer (module docstring).

    ``candidates``: measurements with ``r``, ``list_queries``, ``witnesses``, ``survival``,
    ``redo_frac``, ``ms`` (None: not timed), ``keys_screened`` and ``certified_queries``
    (``CandidateMeasurement``); ``dense_ms`` the measured dense time of the same
    calls; ``calls`` their (batch, queries, keys) sizes. The design call has ``queries`` queries per
    call (None: a causal prefill) at ``design_length`` keys.
    """
    screened = max((c.keys_screened for c in candidates), default=0)
    certified = max((c.certified_queries for c in candidates), default=0)
    need_keys, need_queries = defaults.MIN_SCREENED_KEYS, defaults.MIN_CERTIFIED_QUERIES
    if screened < need_keys or certified < need_queries:
        return LayerChoice(DENSE, None, 1.0,
                           f"not enough evidence: survival measured on {screened} screened keys of {certified} "
                           f"certified queries (needs >= {need_keys} and >= {need_queries}); "
                           "calibrate on longer or more sequences")
    design = IndexerShape(heads=heads, head_dim=head_dim, topk=topk, queries=queries)
    shapes = [_call_shape(heads, head_dim, topk, *call) for call in calls]
    dense_cal = sum(float(dense_call_time(s, constants).subs(LENGTH, n)) for s, n in shapes)
    longest = max((n for _, n in shapes), default=0)
    best, lost = None, []
    for c in sorted(candidates, key=_order):
        if c.r >= heads:
            continue
        cert_cal = sum(float(certified_call_time(c.r, c.survival, s, constants, redo=c.redo_frac).subs(LENGTH, n))
                       for s, n in shapes)
        measured = None if c.ms is None or not dense_ms else c.ms / dense_ms
        if measured is not None and measured >= 1.0:
            lost.append(f"{_label(c)} {measured:.2f}x")
            if design_length <= longest:  # it lost at the design length itself (or beyond it)
                continue
        scale = 1.0 if measured is None else measured / (cert_cal / dense_cal)
        ratio = scale * float(certified_call_time(c.r, c.survival, design, constants, redo=c.redo_frac)
                              .subs(LENGTH, design_length) / dense_call_time(design, constants).subs(LENGTH, design_length))
        if best is None or ratio < best[0]:
            best = (ratio, c, scale, measured)
    if best is None:
        if lost:
            return LayerChoice(DENSE, None, 1.0,
                               f"every budget measured slower than dense on the calibration calls ({', '.join(lost)} "
                               "the dense time)")
        return LayerChoice(DENSE, None, 1.0, f"no candidate budget below the {heads} heads")
    ratio, c, scale, measured = best
    seen = ("" if measured is None else f"; measured {1 / measured:.2f}x on the calibration calls" if measured < 1.0
            else f"; measured {measured:.2f}x the dense time on the calibration calls")
    if ratio >= defaults.PAYS_BELOW:
        return LayerChoice(DENSE, None, 1.0,
                           f"best budget {_label(c)} predicted at {ratio:.2f}x the dense time at {design_length} keys "
                           f"(certified needs < {defaults.PAYS_BELOW}){seen}")
    crossover = crossover_length(c.r, c.survival, design, constants, redo=c.redo_frac, scale=scale)
    if crossover is not None and measured is not None and measured >= 1.0:
        crossover = max(crossover, longest + 1)  # never certified where it was measured to lose
    if crossover is None or crossover > design_length:
        return LayerChoice(DENSE, None, 1.0,
                           f"{_label(c)} never overtakes dense up to {design_length} keys{seen}")
    return LayerChoice(TopkSettings("auto", c.r, crossover, c.list_queries, c.witnesses), 1.0 - c.survival,
                       1.0 / ratio,
                       f"{_label(c)} predicted {1 / ratio:.2f}x faster than dense at {design_length} keys, "
                       f"from {crossover} keys{seen}")
