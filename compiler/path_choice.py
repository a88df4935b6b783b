"""Which path every indexer top-K takes, and with which budget r: the one home of that decision.

Vocabulary: ``PATHS`` = ("dense", "certified") is what a call runs (defined by the runtime);
``CHOICES`` = ("auto", "dense", "certified") is what an option, an op argument or a plan asks for.
"dense" and "certified" are obeyed as given; "auto" is decided here, at three moments:

1. Plan time, ``choose_layer``: from one layer's calibration measurements (survival m(r), the
   fraction of queries redone densely, and the measured times of dense and of each candidate r on
   the calibration calls), the r with the lowest predicted time at the design length: the cost
   model's prediction (``compiler.cost_model``) scaled by the ratio measured on the calibration
   calls. A budget that lost to dense on those calls stays a candidate only when the design length
   is longer than every calibration call (the certified advantage grows with the key count, which
   the scaled model extrapolates), and is then certified only above the longest calibration call.
   The layer is certified only when the evidence suffices (``MIN_SCREENED_KEYS``,
   ``MIN_CERTIFIED_QUERIES``) and that time is below ``PAYS_BELOW`` of dense; otherwise dense,
   with the reason.
2. Compile time, ``layer_settings``: the op arguments of one rewritten layer (path, r, min_keys =
   the crossover length) from the plan, a forced option, or the cost model's default crossover.
3. Call time, ``call_path``: "dense" or "certified" for one call, from the op arguments, the static
   sizes (no tensor is read) and the layer's runtime guard.

The runtime guard (``Guard``). A certified call can lose on inputs no plan saw. Under "auto" each
(layer, device, power-of-two bucket of B*S, power-of-two bucket of T) keeps a small state machine
fed with measured call times, normalised per scored (query, key) pair: the first certified call of
a bucket is a warm-up (it compiles kernels and tunes the screen) and is not measured; then one dense
and one certified call are measured, and the faster path is kept; a kept certified path is compared
on every call (the better of its last two measurements against the best dense one), and a dense
path retries certified after ``RETRY_FIRST`` calls, doubling the wait after every lost retry up to
``RETRY_MAX``. Every certified call also reports its counters (refined fraction of the screened
pairs, redone fraction of the queries); one beyond ``SURE_LOSS_SURVIVAL`` / ``SURE_LOSS_REDO`` is a
loss whatever its time, so an input that does not prune goes dense after its warm-up call. Times
are taken with CUDA events and the counters copied without blocking to pinned host memory, both
read once ``Event.query()`` says the call has run, on a later call of the same bucket: the host
never waits for the device (on the CPU, where calls are synchronous, the host clock). While a CUDA
graph is being captured nothing is measured and the bucket's current path is used (certified while
undecided): a captured graph replays the path taken at capture.
Trade-offs: every decision is taken from measured time, so it holds on any device and needs no
calibrated constants, at the price of one measured dense call per bucket and of the warm-up call;
a layer called with few shapes settles within three calls of each shape.
"""
from __future__ import annotations

import contextlib
import functools
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

from compiler.autotune import length_bucket
from compiler.cost_model import (CPU_REFERENCE, H200_FITTED, IndexerShape, KernelConstants, T as LENGTH,
                                 candidate_rs, certified_call_time, crossover_length, dense_call_time)
from runtime.certified_topk import PATHS, TopkStats

__all__ = ["CHOICES", "PATHS", "CallTicket", "Guard", "GUARD", "LayerChoice", "LayerSettings", "call_path",
           "check_choice", "choose_layer", "default_crossover", "indexer_settings", "keeps_stock", "layer_settings",
           "short_candidates", "ALWAYS_STOCK", "STOCK_BELOW", "stock_threshold", "SPARSE_FORMS",
           "SPARSE_FORM_CHOICES", "sparse_attention_form"]

CHOICES = ("auto",) + PATHS
"""What a user, an op argument or a plan may ask for."""

DEFAULT_SURVIVAL = 0.03
"""Survival fraction assumed without a plan: the DoSA paper's trained-indexer rate (SPEC A.7, 2.65%)."""
ASSUMED_R = 4
"""Budget assumed without a plan: the runtime's default rule (|H+| rounded up to a multiple of 4) for a
query with at most 4 positive heads, the regime of trained indexers (SPEC A.8)."""
MIN_CERTIFIED_ROWS = 32
"""Calls with fewer queries per batch row (S) than this are scored densely: the certified path's
fixed work (anchors, plan, many small launches) cannot be amortised over so few neighbours."""
PAYS_BELOW = 0.9
"""A plan certifies a layer only when its predicted time is below this fraction of dense."""
MIN_SCREENED_KEYS = 1 << 22
MIN_CERTIFIED_QUERIES = 64
"""Evidence a plan needs before certifying a layer: survival measured over at least
MIN_SCREENED_KEYS screened (query, key) pairs of at least MIN_CERTIFIED_QUERIES certified queries.
Below that the layer is planned dense and the plan says why."""
SHORT_CANDIDATE_ROWS = 8
"""Default plan candidates: r with r + 1 a power of two and at most this many screen rows (1, 3, 7)."""
RETRY_FIRST = 8
RETRY_MAX = 512
"""Guard: dense calls before a losing certified path is retried; doubled after every lost retry."""
SURE_LOSS_SURVIVAL = 0.9
SURE_LOSS_REDO = 0.5
"""Guard: a certified call that refined more than SURE_LOSS_SURVIVAL of its screened (query, key)
pairs, or redid densely more than SURE_LOSS_REDO of its queries, did at least the dense scoring
work plus the screen: the bucket goes dense from its counters alone (the warm-up call's included)."""


def check_choice(name: str, value) -> str:
    """``value`` if it is one of CHOICES, else ValueError naming ``name``."""
    if value not in CHOICES:
        raise ValueError(f"{name}: expected one of {list(CHOICES)}, got {value!r}")
    return value


def constants_for(device_type: str) -> KernelConstants:
    """The cost model's default constants for a device type (H200 fit on CUDA, CPU reference else)."""
    return H200_FITTED if device_type == "cuda" else CPU_REFERENCE


# ---------------------------------------------------------------------------------------------
# Plan time


@dataclass(frozen=True)
class LayerChoice:
    """The decision for one layer: ``path`` "certified" (dense below ``crossover``, certified from it)
    or "dense" (``r`` and ``crossover`` None); the predicted pruned fraction 1 - m(r), the predicted
    speedup over dense at the design length, and ``reason``, one readable sentence."""

    path: str
    r: int | None
    crossover: int | None
    predicted_pruned_frac: float | None
    predicted_speedup: float
    reason: str


def short_candidates(heads: int) -> list[int]:
    """Default plan budgets: r = 2^j - 1 below ``heads`` with r + 1 <= SHORT_CANDIDATE_ROWS."""
    return [r for r in (1, 3, 7, 15, 31) if r < heads and r + 1 <= SHORT_CANDIDATE_ROWS]


def _call_shape(heads, head_dim, topk, batch, queries, keys):
    """(IndexerShape, length) of one calibration call: a prefill when queries == keys."""
    return IndexerShape(heads=heads, head_dim=head_dim, topk=topk, batch=batch,
                        queries=None if queries == keys else queries), keys


def choose_layer(candidates: Sequence, dense_ms: float | None, calls: Sequence[tuple[int, int, int]], *,
                 heads: int, head_dim: int, topk: int, constants: KernelConstants, design_length: int,
                 queries: int | None) -> LayerChoice:
    """The plan's decision for one layer (module docstring, plan time).

    ``candidates``: measurements with ``r``, ``survival``, ``redo_frac``, ``ms`` (None: not timed),
    ``keys_screened`` and ``certified_queries``; ``dense_ms`` the measured dense time of the same
    calls; ``calls`` their (batch, queries, keys) sizes. The design call has ``queries`` queries per
    call (None: a causal prefill) at ``design_length`` keys.
    """
    screened = max((c.keys_screened for c in candidates), default=0)
    certified = max((c.certified_queries for c in candidates), default=0)
    if screened < MIN_SCREENED_KEYS or certified < MIN_CERTIFIED_QUERIES:
        return LayerChoice("dense", None, None, None, 1.0,
                           f"not enough evidence: survival measured on {screened} screened keys of {certified} "
                           f"certified queries (needs >= {MIN_SCREENED_KEYS} and >= {MIN_CERTIFIED_QUERIES}); "
                           "calibrate on longer or more sequences")
    design = IndexerShape(heads=heads, head_dim=head_dim, topk=topk, queries=queries)
    shapes = [_call_shape(heads, head_dim, topk, *call) for call in calls]
    dense_cal = sum(float(dense_call_time(s, constants).subs(LENGTH, n)) for s, n in shapes)
    longest = max((n for _, n in shapes), default=0)
    best, lost = None, []
    for c in sorted(candidates, key=lambda c: c.r):
        if c.r >= heads:
            continue
        cert_cal = sum(float(certified_call_time(c.r, c.survival, s, constants, redo=c.redo_frac).subs(LENGTH, n))
                       for s, n in shapes)
        measured = None if c.ms is None or not dense_ms else c.ms / dense_ms
        if measured is not None and measured >= 1.0:
            lost.append(f"r={c.r} {measured:.2f}x")
            if design_length <= longest:  # it lost at the design length itself (or beyond it)
                continue
        scale = 1.0 if measured is None else measured / (cert_cal / dense_cal)
        ratio = scale * float(certified_call_time(c.r, c.survival, design, constants, redo=c.redo_frac)
                              .subs(LENGTH, design_length) / dense_call_time(design, constants).subs(LENGTH, design_length))
        if best is None or ratio < best[0]:
            best = (ratio, c, scale, measured)
    if best is None:
        if lost:
            return LayerChoice("dense", None, None, None, 1.0,
                               f"every budget measured slower than dense on the calibration calls ({', '.join(lost)} "
                               "the dense time)")
        return LayerChoice("dense", None, None, None, 1.0, f"no candidate budget below the {heads} heads")
    ratio, c, scale, measured = best
    seen = ("" if measured is None else f"; measured {1 / measured:.2f}x on the calibration calls" if measured < 1.0
            else f"; measured {measured:.2f}x the dense time on the calibration calls")
    if ratio >= PAYS_BELOW:
        return LayerChoice("dense", None, None, None, 1.0,
                           f"best budget r={c.r} predicted at {ratio:.2f}x the dense time at {design_length} keys "
                           f"(certified needs < {PAYS_BELOW}){seen}")
    crossover = crossover_length(c.r, c.survival, design, constants, redo=c.redo_frac, scale=scale)
    if crossover is not None and measured is not None and measured >= 1.0:
        crossover = max(crossover, longest + 1)  # never certified where it was measured to lose
    if crossover is None or crossover > design_length:
        return LayerChoice("dense", None, None, None, 1.0,
                           f"r={c.r} never overtakes dense up to {design_length} keys{seen}")
    return LayerChoice("certified", c.r, crossover, 1.0 - c.survival, 1.0 / ratio,
                       f"r={c.r} predicted {1 / ratio:.2f}x faster than dense at {design_length} keys, "
                       f"from {crossover} keys{seen}")


def assumed_budget(heads: int, c: KernelConstants) -> int | None:
    """The smallest aligned budget >= ASSUMED_R below ``heads`` (None when there is none)."""
    rs = [r for r in candidate_rs(heads, c) if r >= ASSUMED_R]
    return rs[0] if rs else None


@functools.lru_cache(maxsize=256)
def default_crossover(heads: int, head_dim: int, topk: int, queries: int | None, device_type: str) -> int | None:
    """The key length from which an unplanned layer is certified: the crossover of ``assumed_budget``
    at DEFAULT_SURVIVAL for calls of ``queries`` queries (None: causal prefill); None: never."""
    c = constants_for(device_type)
    r = assumed_budget(heads, c)
    if r is None:
        return None
    shape = IndexerShape(heads=heads, head_dim=head_dim, topk=topk, queries=queries)
    return crossover_length(r, DEFAULT_SURVIVAL, shape, c)


# ---------------------------------------------------------------------------------------------
# Compile time


@dataclass(frozen=True)
class LayerSettings:
    """One rewritten layer: its ``path`` (CHOICES: "certified" = from ``crossover`` keys on, guarded),
    r (None: the runtime's rule), crossover, predicted pruned fraction and where they came from
    ("plan <hash>", "cost model", "options", "runtime defaults")."""

    path: str
    r: int | None
    crossover: int | None
    predicted_pruned_frac: float | None
    source: str

    def report_fields(self) -> dict:
        """What a rewrite entry of the report records about the choice."""
        return {"path": self.path, "r": self.r, "min_keys": self.crossover,
                "predicted_pruned_frac": self.predicted_pruned_frac, "settings_from": self.source}

    def op_kwargs(self) -> dict:
        """``path``, ``r`` and ``min_keys`` for the op call: a planned or default certified layer runs
        the guarded "auto" path from its crossover; -1 = the runtime's default."""
        guarded = self.path == "certified" and self.source != "options"
        return {"path": "auto" if guarded else self.path, "r": -1 if self.r is None else self.r,
                "min_keys": -1 if self.crossover is None else self.crossover}


def _static_int(size) -> int | None:
    """A size known at compile time as a plain int, else None (symbolic)."""
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def indexer_settings(options, layer: str, q_shape, topk, device_type: str) -> LayerSettings:
    """``layer_settings`` for a rewrite: q_shape is the op's [B,S,H,D] q shape, topk its topk argument,
    ``options`` the backend's CompileOptions (its ``plan`` and ``certified`` fields)."""
    return layer_settings(layer, plan=options.plan, forced_path=options.certified,
                          heads=_static_int(q_shape[2]), head_dim=_static_int(q_shape[3]),
                          topk=_static_int(topk), device_type=device_type)


def layer_settings(layer: str, *, plan, forced_path: str, heads: int | None, head_dim: int | None,
                   topk: int | None, device_type: str) -> LayerSettings:
    """Settings of layer ``layer`` (module path). Sizes that are symbolic at compile time are None.

    With a plan (``compiler.plan.Plan``): its layer's path, r and crossover (PlanError when the plan
    has no such layer or its geometry differs); a forced path other than "auto" overrides the plan's
    path and keeps its r. Without one: the forced path, else ``default_crossover`` for a prefill on
    the device type (the runtime's defaults when a size is symbolic).
    """
    check_choice("forced_path", forced_path)
    if plan is not None:
        from compiler.plan.schema import PlanError

        entry = plan.layer(layer)
        for name, planned, seen in (("heads", entry.heads, heads), ("head_dim", entry.head_dim, head_dim),
                                    ("topk", entry.topk, topk)):
            if seen is not None and planned != seen:
                raise PlanError(f"plan layer {layer!r}: {name}={planned} in the plan but {seen} in the model; "
                                "the plan was made for another model")
        source = f"plan {plan.hash[:12]}"
        if forced_path != "auto":
            return LayerSettings(forced_path, entry.r, None, entry.predicted_pruned_frac, "options")
        return LayerSettings(entry.path, entry.r, entry.crossover, entry.predicted_pruned_frac, source)
    if forced_path != "auto":
        return LayerSettings(forced_path, None, None, None, "options")
    if heads is None or head_dim is None or topk is None:
        return LayerSettings("auto", None, None, None, "runtime defaults")
    crossover = default_crossover(heads, head_dim, topk, None, device_type)
    if crossover is None:
        return LayerSettings("dense", None, None, None, "cost model")
    return LayerSettings("certified", None, crossover, None, "cost model")


STOCK_BELOW = {"dsa_indexer": {"cuda": 1 << 25}, "sparse_attention": {"cuda": 1 << 21}}
"""Per pass family and device type: a call of fewer query-key-head products (B*S*T*H; H the query
heads) than this keeps its stock subgraph when the compiled code is not replayed from a CUDA graph
(``stock_threshold``). Below it the stock form's device time is shorter than the op's per-call
host cost (custom-op dispatch, checks, Triton launches), which sets the pace of such calls.
Device types not listed (the CPU, any device without the ops' Triton kernels) keep every stock
subgraph (``ALWAYS_STOCK``): there the ops run their plain-torch references, written to be exact,
not fast. On a 2-core x86 CPU (session 11; H=64, D=128, bf16, one compiled indexer, best of 3) the
op took 94.5 against 10.6 ms stock for one query over 32768 keys, 124.7 against 13.8 for 16 queries
over 4096 keys, 6843 against 280 for 256 and 8103 against 1773 for 1024; for one query over 4096
keys 13.3-18.4 against 1.3-2.1 in two reruns (a first run's 35.7 ms for stock was an outlier).

H200, session 11. The indexer op took 0.36-0.40 ms per host-paced call at one query (H=64,
8K-128K keys) against 0.11-0.27 ms for the stock indexer eager. End to end (2-layer DSV32 decode,
the session's first run, before the sparse-attention threshold) the indexer op on every call
added 2.8-3.2 ms per step at B=1 (2^19-2^23 products per call) and 0.8-1.6 ms at B=8 up to 32K
keys (2^22-2^24) to the step that kept the stock indexer; at B=8 over 128K keys (2^26) the step with the op took 10.9 ms against
stock's 11.9. The sparse-attention op takes 0.33-0.55 ms per host-paced decode call (0.11 ms
of GPU time; results/sparse_attention_h200.md), the stock masked SDPA reads K and V of every key,
about 0.25 ms per 2^20 products at 320 bytes of K and V per key and head (4.2 ms at 128 heads x
131072 keys): the op pays from about 2^21."""


ALWAYS_STOCK = math.inf
"""The threshold of a device type without the ops' own kernels: every call keeps its stock subgraph."""


def stock_threshold(options, kind: str, device_type: str, cuda_graphs: bool) -> float:
    """The product count below which pass family ``kind`` keeps the stock subgraph (``options``:
    the backend's CompileOptions): 0 for the indexer with an fp8 ``indexer_precision`` (the stock
    subgraph would score in the model's precision); else its ``stock_below`` when given; else 0 when
    the compile asks for the indexer op itself (a forced ``certified`` path, or ``capture``, which
    records every call); else ``STOCK_BELOW`` of the device type (``ALWAYS_STOCK`` where none is
    listed), 0 for a listed one under CUDA graphs (the host cost is then paid once, at capture)."""
    if kind == "dsa_indexer" and options.indexer_precision != "bf16":
        return 0
    if options.stock_below is not None:
        return options.stock_below
    if kind == "dsa_indexer" and (options.capture or options.certified != "auto"):
        return 0
    threshold = STOCK_BELOW.get(kind, {}).get(device_type, ALWAYS_STOCK)
    return 0 if cuda_graphs and threshold != ALWAYS_STOCK else threshold


def keeps_stock(threshold: float, products) -> str | None:
    """Why a call of ``products`` = B*S*T*H query-key-head products keeps the stock subgraph, or
    None. Sizes may be symbolic: deciding then adds a guard on them (Dynamo recompiles the graph
    when a later call falls on the other side, e.g. once when a decode loop's cache crosses it);
    a size that depends on data (unbacked) is not guarded on and the call is rewritten."""
    if threshold <= 0:
        return None
    if threshold == ALWAYS_STOCK:
        return ("kept stock: on this device the op runs its plain-torch reference, slower than the stock "
                "subgraph (option stock_below=0 rewrites every call)")
    if guard_or_false(products < threshold):  # a data-dependent size: rewrite, as without the rule
        return (f"kept stock: B*S*T*H = {products} query-key-head products, below the {threshold} at which "
                "the op's per-call host cost pays (option stock_below; 0 under CUDA graphs)")
    return None


# ---------------------------------------------------------------------------------------------
# DSA sparse attention of an MLA layer: absorbed or union form


SPARSE_FORMS = ("absorbed", "union")
"""The kernels a DSA sparse attention of an MLA layer can run: the absorbed form
(``pulsar_dosa.absorbed_sparse_attention``: latent rows shared by the heads, the heads on the
matrix products' rows) or the union form (``pulsar_dosa.sparse_attention`` on the expanded keys
and values: a tile of 64 queries walks the union of their selections)."""
SPARSE_FORM_CHOICES = ("auto",) + SPARSE_FORMS
"""What the ``sparse_form`` option may ask for."""
ABSORBED_MIN_HEADS = 16
"""Under "auto", prefill attentions with fewer heads than this take the union form: the absorbed
kernel's matrix products have one row per head and at least 16 rows (tl.dot), so fewer heads pad
them, while the union form's work per head is 320 against 1088 FLOPs per (query, key)."""
UNION_MIN_QUERIES = 16
"""Under "auto", calls with fewer queries per batch row than this (decode) take the absorbed form
whatever the heads: a tile of the union form has no neighbours to share keys with, and the
absorbed form reads the latent cache instead of expanding all of it through kv_b_proj."""


def sparse_attention_form(forced: str, heads: int, queries) -> tuple[str, str]:
    """``(form, reason)`` of one DSA sparse attention whose keys and values are the expansion of a
    latent (a form of SPARSE_FORMS). ``forced``: the ``sparse_form`` option ("auto" decides);
    ``heads``: the attention's query heads; ``queries``: its queries per batch row (an int, or a
    symbolic size: then not decode).

    The absorbed form costs 2·H·K·(Dc + Dr + Dc) FLOPs per query whatever the selections; the union
    form 2·H·(Dqk + Dv) per (query, key) of its tiles' unions, which is less only when neighbouring
    queries share most of their keys (benchmarks/sparse_attention.py times both per selection
    kind). How selections overlap is not known when compiling, so "auto" decides on the shapes:
    absorbed at decode (``UNION_MIN_QUERIES``) and from ``ABSORBED_MIN_HEADS`` heads, union below.
    """
    if forced not in SPARSE_FORM_CHOICES:
        raise ValueError(f"forced: expected one of {list(SPARSE_FORM_CHOICES)}, got {forced!r}")
    if forced != "auto":
        return forced, "option sparse_form"
    if isinstance(queries, int) and queries < UNION_MIN_QUERIES:
        return "absorbed", (f"{queries} queries per row (< {UNION_MIN_QUERIES}): no neighbours share keys, and the "
                            "latent cache is read instead of expanded")
    if heads >= ABSORBED_MIN_HEADS:
        return "absorbed", (f"{heads} heads (>= {ABSORBED_MIN_HEADS}) fill the absorbed products' rows; its time "
                            "does not depend on how the selections overlap")
    return "union", f"{heads} heads (< {ABSORBED_MIN_HEADS}) would pad the absorbed products' rows"


# ---------------------------------------------------------------------------------------------
# Call time


def call_path(*, layer: str, device: torch.device, choice: str, crossover: int | None, B: int, S: int,
              T: int, H: int, D: int, kk: int) -> "CallTicket":
    """The path of one call (module docstring, call time), as a ticket whose ``timed()`` block the
    caller runs the call in. ``choice``: the op's path argument; ``crossover``: its min_keys (None:
    ``default_crossover`` for this call's queries and device). "dense" and "certified" are obeyed;
    "auto" is dense when kk >= T, S < MIN_CERTIFIED_ROWS (decode: a batch row of few queries has no
    neighbours to share anchors with) or T < crossover, else the guard's path."""
    check_choice("path", choice)
    if choice != "auto":
        return CallTicket(choice)
    if crossover is None:
        queries = None if S >= T else 1 << (S.bit_length() - 1)  # a prefill, or S rounded down
        crossover = default_crossover(H, D, kk, queries, torch.device(device).type)
    if kk >= T or S < MIN_CERTIFIED_ROWS or crossover is None or T < crossover:
        return CallTicket("dense")
    return GUARD.ticket(layer, torch.device(device), B * S, T)


@dataclass
class GuardBucket:
    """The guard's decision for one (layer, device, rows bucket, keys bucket): a pure state machine
    fed with measured times per (query, key) pair and the certified calls' counters (module docstring)."""

    certified_calls: int = 0
    dense_calls: int = 0
    favoured: str | None = None
    dense_ms: float | None = None
    recent_certified: deque = field(default_factory=lambda: deque(maxlen=2))
    backoff: int = RETRY_FIRST
    since_trial: int = 0
    retries: int = 0
    sure_losses: int = 0
    pending: dict = field(default_factory=lambda: {"dense": 0, "certified": 0})

    @property
    def certified_ms(self) -> float | None:
        return min(self.recent_certified) if self.recent_certified else None

    def next_path(self) -> tuple[str, bool]:
        """(path of the next call, whether to time it)."""
        if self.certified_calls == 0:
            return "certified", False  # warm-up: compiles and tunes, its time means nothing
        if self.favoured is None:
            if self.dense_ms is None and not self.pending["dense"]:
                return "dense", True
            if self.certified_ms is None and not self.pending["certified"]:
                return "certified", True
            return "dense", True  # waiting for a verdict: the safe path
        if self.favoured == "certified":
            return "certified", True
        if self.since_trial >= self.backoff and not self.pending["certified"]:
            return "certified", True
        return "dense", True

    def capture_path(self) -> str:
        """The path a CUDA graph captures: the favoured one, certified while undecided."""
        return self.favoured or "certified"

    def issued(self, path: str, timed: bool) -> None:
        if path == "certified":
            self.certified_calls += 1
            if self.favoured == "dense":
                self.retries += 1
        else:
            self.dense_calls += 1
            self.since_trial += 1
        if timed:
            self.pending[path] += 1

    def record(self, path: str, ms_per_pair: float | None, rates: tuple[float, float] | None = None) -> None:
        """A guarded call of ``path`` finished: its time per (query, key) pair (None: not timed) and,
        for a certified call, (refined fraction of screened pairs, redone fraction of queries). A
        certified call beyond SURE_LOSS_SURVIVAL or SURE_LOSS_REDO lost whatever its time says."""
        if ms_per_pair is not None:
            self.pending[path] -= 1
        if path == "dense":
            if ms_per_pair is not None:
                self.dense_ms = ms_per_pair if self.dense_ms is None else min(self.dense_ms, ms_per_pair)
            if self.favoured is None:
                self._decide(trial=False)
            return
        if ms_per_pair is not None:
            self.recent_certified.append(ms_per_pair)
        if rates is not None and (rates[0] > SURE_LOSS_SURVIVAL or rates[1] > SURE_LOSS_REDO):
            self.sure_losses += 1
            self._lost(trial=True)
        elif ms_per_pair is not None:
            self._decide(trial=True)

    def _decide(self, trial: bool) -> None:
        if self.certified_ms is None or self.dense_ms is None:
            return
        if self.certified_ms < self.dense_ms:
            self.favoured, self.backoff = "certified", RETRY_FIRST
            return
        self._lost(trial)

    def _lost(self, trial: bool) -> None:
        if trial and self.favoured == "dense":
            self.backoff = min(2 * self.backoff, RETRY_MAX)
        self.favoured, self.since_trial = "dense", 0

    def summary(self) -> dict:
        """Readable state: favoured path, calls per path, retries, ms per 1e9 (query, key) pairs."""
        per_g = (lambda x: None if x is None else x * 1e9)
        return {"path": self.favoured or "undecided", "certified_calls": self.certified_calls,
                "dense_calls": self.dense_calls, "retries": self.retries, "sure_losses": self.sure_losses,
                "certified_ms_per_Gpair": per_g(self.certified_ms), "dense_ms_per_Gpair": per_g(self.dense_ms),
                "next_retry_after": self.backoff if self.favoured == "dense" else None}


COUNTERS = ("survivors", "keys_screened", "overflow", "threshold_miss", "queries")
"""The certified call's statistics the guard reads back (``runtime.certified_topk.TopkStats``)."""


class _Measurement:
    """One guarded call in flight: CUDA events around it on the current stream (the host clock off
    CUDA) and, for a certified call, its counters copied without blocking to pinned host memory."""

    def __init__(self, device: torch.device, path: str, timed: bool, pairs: int):
        self.cuda, self.path, self.timed, self.pairs = device.type == "cuda", path, timed, pairs
        self.counts = None
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self, stats: TopkStats | None) -> None:
        if stats is not None and self.path == "certified":
            counts = stats.stacked(COUNTERS)
            self.counts = counts.to("cpu", non_blocking=True) if self.cuda else counts
        if self.cuda:
            self.end.record()
        else:
            self.ms_value = (time.perf_counter() - self.t0) * 1e3

    def ready(self) -> bool:
        return not self.cuda or self.end.query()

    def ms(self) -> float:
        return self.start.elapsed_time(self.end) if self.cuda else self.ms_value

    def rates(self) -> tuple[float, float] | None:
        """(refined fraction of screened pairs, redone fraction of queries), or None."""
        if self.counts is None:
            return None
        # A host copy that the device has finished writing (the end event is recorded after it).
        survivors, screened, overflow, miss, queries = (int(x) for x in self.counts.numpy())
        return (survivors / screened if screened else 0.0), ((overflow + miss) / queries if queries else 0.0)


@dataclass
class CallTicket:
    """The path of one call. Run the call inside ``timed(stats)`` and give the kernel the statistics
    object it yields, so that the guard measures the call and reads its counters."""

    path: str
    _guard: "Guard | None" = None
    _key: tuple | None = None
    _pairs: int = 0
    _timed: bool = False

    @contextlib.contextmanager
    def timed(self, stats: TopkStats | None) -> Iterator[TopkStats | None]:
        """Yield the statistics the call should add to: ``stats`` when unguarded, else a fresh
        accumulator merged into ``stats`` afterwards."""
        if self._guard is None:
            yield stats
            return
        measurement = _Measurement(self._key[1], self.path, self._timed, self._pairs)
        own = TopkStats()
        yield own
        measurement.stop(own)
        if stats is not None:
            stats.merge(own)
        self._guard.finished(self._key, measurement)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class Guard:
    """The guard's buckets and their measurements in flight (module docstring)."""

    def __init__(self) -> None:
        self._buckets: dict[tuple, GuardBucket] = {}
        self._in_flight: dict[tuple, list[_Measurement]] = {}

    def ticket(self, layer: str, device: torch.device, rows: int, T: int) -> CallTicket:
        """The guarded path of a call of ``rows`` = B*S queries over T keys."""
        key = (layer, device, length_bucket(rows, 1), length_bucket(T, 1))
        bucket = self._buckets.setdefault(key, GuardBucket())
        if _capturing(device):
            return CallTicket(bucket.capture_path())
        self._collect(key)
        path, timed = bucket.next_path()
        bucket.issued(path, timed)
        return CallTicket(path, self, key, rows * T, timed)

    def finished(self, key: tuple, measurement: _Measurement) -> None:
        """A guarded call was enqueued: its time and counters are read once the device has run it."""
        self._in_flight.setdefault(key, []).append(measurement)
        self._collect(key)

    def _collect(self, key: tuple) -> None:
        waiting = []
        bucket = self._buckets[key]
        for m in self._in_flight.get(key, []):
            if not m.ready():
                waiting.append(m)
                continue
            bucket.record(m.path, m.ms() / m.pairs if m.timed else None, m.rates())
        self._in_flight[key] = waiting

    def summaries(self) -> dict[str, list[dict]]:
        """layer -> one readable state per bucket (device, queries and keys buckets)."""
        out: dict[str, list[dict]] = {}
        for (layer, device, rows, keys), bucket in sorted(self._buckets.items(), key=lambda kv: str(kv[0])):
            out.setdefault(layer, []).append({"device": str(device), "queries_bucket": rows, "keys_bucket": keys,
                                              **bucket.summary()})
        return out

    def reset(self) -> None:
        """Forget every bucket (a fresh start for every layer)."""
        self._buckets.clear()
        self._in_flight.clear()


GUARD = Guard()
"""The process-wide guard of the certified top-K op."""
