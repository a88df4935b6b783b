"""Call time: the path of one certified top-K call, and the runtime guard behind "auto" (SPEC C.7).

``call_path(settings, layer=, device=, B, S, T, H, D, kk)`` obeys "dense" and "certified"; "auto"
is dense when kk >= T, when a batch row has fewer than ``defaults.MIN_CERTIFIED_ROWS`` queries or
below ``min_keys`` (None: ``cost_model.default_min_keys`` for the call), and otherwise the path of
``GUARD``, the process-wide ``Guard``. It reads no tensor. The returned ``CallTicket`` carries
the settings the call runs and min_keys to the kernel; its ``timed`` block measures a guarded call
with CUDA events (the host clock off CUDA) and reads its counters once the device has run it, on a
later call: the host never waits. A layer that leaves r, the list size and the witnesses to the
defaults climbs ``guard_ladder``'s rungs while its certified calls lose. ``GuardBucket`` is the
state machine of one (layer, device, bucket of B*S, bucket of T); ``Guard.summaries()`` is readable
state."""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import torch

from compiler import defaults
from compiler.autotune import graph_capturing, length_bucket
from compiler.cost_model import default_min_keys
from compiler.topk_settings import TopkSettings
from runtime.certified_topk import TopkStats

__all__ = ["CallTicket", "GUARD", "Guard", "GuardBucket", "call_path", "guard_ladder"]


def call_path(settings: TopkSettings, *, layer: str, device: torch.device, B: int, S: int, T: int, H: int,
              D: int, kk: int) -> "CallTicket":
    """The path of one call of q [B,S,H,D] over T keys selecting kk (module docstring), as a ticket
    whose ``timed()`` block the caller runs the call in."""
    if settings.path != "auto":
        return CallTicket(settings.path, settings)
    min_keys = settings.min_keys
    if min_keys is None:
        queries = None if S >= T else 1 << (S.bit_length() - 1)  # a prefill, or S rounded down
        min_keys = default_min_keys(H, D, kk, queries, torch.device(device).type)
    if kk >= T or S < defaults.MIN_CERTIFIED_ROWS or min_keys is None or T < min_keys:
        return CallTicket("dense", settings)
    return GUARD.ticket(layer, torch.device(device), B * S, T, settings, min_keys)


def guard_ladder(settings: TopkSettings) -> tuple[TopkSettings, ...]:
    """The settings a guarded layer tries in order while its certified calls lose: its own, then,
    when they leave r, the list size and the witnesses to the defaults, each of
    ``defaults.GUARD_LADDER``'s (r, list_queries, witnesses) in their place."""
    if (settings.r, settings.list_queries, settings.witnesses) != (None, None, None):
        return (settings,)
    return (settings,) + tuple(dataclasses.replace(settings, r=r, list_queries=g, witnesses=wit)
                               for r, g, wit in defaults.GUARD_LADDER)


@dataclass
class GuardBucket:
    """The guard's decision for one (layer, device, rows bucket, keys bucket): a pure state machine
    fed with measured times per (query, key) pair and the certified calls' counters (SPEC C.7).
    ``ladder``: the settings it may certify with (``guard_ladder``), ``rung`` the current one's
    index: while the certified path loses and a rung not yet tried remains, the next one is warmed
    up and timed instead of going dense; once every rung has lost, retries run the fastest one
    measured."""

    ladder: tuple[TopkSettings, ...] = (TopkSettings(),)
    rung: int = 0
    reached: int = 0
    rung_calls: int = 0
    rung_ms: dict = field(default_factory=dict)
    certified_calls: int = 0
    dense_calls: int = 0
    favoured: str | None = None
    dense_ms: float | None = None
    recent_certified: deque = field(default_factory=lambda: deque(maxlen=2))
    backoff: int = field(default_factory=lambda: defaults.RETRY_FIRST)
    since_trial: int = 0
    retries: int = 0
    sure_losses: int = 0
    pending: dict = field(default_factory=lambda: {"dense": 0, "certified": 0})

    @property
    def rungs(self) -> int:
        return len(self.ladder)

    @property
    def settings(self) -> TopkSettings:
        """The settings the bucket's certified calls run now (its rung's)."""
        return self.ladder[self.rung]

    @property
    def certified_ms(self) -> float | None:
        return min(self.recent_certified) if self.recent_certified else None

    def next_path(self) -> tuple[str, bool]:
        """(path of the next call, whether to time it)."""
        if self.rung_calls == 0:
            return "certified", False  # warm-up of the rung: compiles and tunes, its time means nothing
        if self.dense_calls == 0:
            return "dense", False  # the dense path's own warm-up: its kernels compile at a new length too
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
            self.rung_calls += 1
            if self.favoured == "dense":
                self.retries += 1
        else:
            self.dense_calls += 1
            self.since_trial += 1
        if timed:
            self.pending[path] += 1

    def record(self, path: str, ms_per_pair: float | None, rates: tuple[float, float] | None = None,
               rung: int | None = None) -> None:
        """A guarded call of ``path`` finished: its time per (query, key) pair (None: not timed) and,
        for a certified call, (refined fraction of screened pairs, redone fraction of queries) and
        the rung it ran (None: the current one; another rung's call only clears its place). A
        certified call beyond ``defaults.SURE_LOSS_SURVIVAL`` or ``defaults.SURE_LOSS_REDO`` lost
        whatever its time says."""
        if ms_per_pair is not None:
            self.pending[path] -= 1
        if path == "certified" and rung is not None and rung != self.rung:
            return
        if path == "dense":
            if ms_per_pair is not None:
                self.dense_ms = ms_per_pair if self.dense_ms is None else min(self.dense_ms, ms_per_pair)
            if self.favoured is None:
                self._decide(trial=False)
            return
        if ms_per_pair is not None:
            self.recent_certified.append(ms_per_pair)
            self.rung_ms[self.rung] = min(ms_per_pair, self.rung_ms.get(self.rung, ms_per_pair))
        if rates is not None and (rates[0] > defaults.SURE_LOSS_SURVIVAL or rates[1] > defaults.SURE_LOSS_REDO):
            self.sure_losses += 1
            self._lost(trial=True)
        elif ms_per_pair is not None:
            self._decide(trial=True)

    def _decide(self, trial: bool) -> None:
        if self.certified_ms is None or self.dense_ms is None:
            return
        if self.certified_ms < self.dense_ms:
            self.favoured, self.backoff = "certified", defaults.RETRY_FIRST
            return
        self._lost(trial)

    def _lost(self, trial: bool) -> None:
        if self.reached + 1 < self.rungs:  # climb: the next rung's warm-up
            self.reached += 1
            self.rung, self.rung_calls, self.favoured = self.reached, 0, None
            self.recent_certified.clear()
            return
        if trial and self.favoured == "dense":
            self.backoff = min(2 * self.backoff, defaults.RETRY_MAX)
        self.favoured, self.since_trial = "dense", 0
        best = min(self.rung_ms, key=self.rung_ms.get, default=self.rung)
        if best != self.rung:  # retries run the fastest rung measured
            self.rung = best
            self.recent_certified.clear()

    def summary(self) -> dict:
        """Readable state: favoured path, the rung and its r, list size and witnesses, calls per
        path, retries, ms per 1e9 (query, key) pairs."""
        per_g = (lambda x: None if x is None else x * 1e9)
        return {"path": self.favoured or "undecided", "rung": self.rung, "r": self.settings.r,
                "list_queries": self.settings.list_queries, "witnesses": self.settings.witnesses,
                "certified_calls": self.certified_calls,
                "dense_calls": self.dense_calls, "retries": self.retries, "sure_losses": self.sure_losses,
                "certified_ms_per_Gpair": per_g(self.certified_ms), "dense_ms_per_Gpair": per_g(self.dense_ms),
                "next_retry_after": self.backoff if self.favoured == "dense" else None}


COUNTERS = ("survivors", "keys_screened", "overflow", "threshold_miss", "queries")
"""The certified call's statistics the guard reads back (``runtime.certified_topk.TopkStats``)."""


class _Measurement:
    """One guarded call in flight: CUDA events around it on the current stream (the host clock off
    CUDA) and, for a certified call, its counters copied without blocking to pinned host memory."""

    def __init__(self, device: torch.device, path: str, timed: bool, pairs: int, rung: int):
        self.cuda, self.path, self.timed, self.pairs, self.rung = device.type == "cuda", path, timed, pairs, rung
        self.counts = None
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self, stats: TopkStats | None) -> None:
        if stats is not None and self.path == "certified":
            counts = stats.totals()
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
        counts = dict(zip(TopkStats.NAMES, (int(x) for x in self.counts.numpy())))
        survivors, screened, overflow, miss, queries = (counts[name] for name in COUNTERS)
        return (survivors / screened if screened else 0.0), ((overflow + miss) / queries if queries else 0.0)


@dataclass
class CallTicket:
    """The path of one call and the settings it runs (the layer's, or a guard rung's). Run the call
    inside ``timed(stats)`` and give the kernel the statistics object it yields, so that the guard
    measures the call and reads its counters. ``min_keys``: the crossover an "auto" call was checked
    against, for the kernel's rows (a certified call's rounds whose rows see fewer keys run dense);
    None when the call's path was not chosen by length."""

    path: str
    settings: TopkSettings
    _guard: "Guard | None" = None
    _key: tuple | None = None
    _pairs: int = 0
    _timed: bool = False
    min_keys: int | None = None
    _rung: int = 0

    @contextlib.contextmanager
    def timed(self, stats: TopkStats | None) -> Iterator[TopkStats | None]:
        """Yield the statistics the call should add to: ``stats`` when unguarded, else a fresh
        accumulator merged into ``stats`` afterwards."""
        if self._guard is None:
            yield stats
            return
        measurement = _Measurement(self._key[1], self.path, self._timed, self._pairs, self._rung)
        own = TopkStats()
        yield own
        measurement.stop(own)
        if stats is not None:
            stats.merge(own)
        self._guard.finished(self._key, measurement)


class Guard:
    """The guard's buckets and their measurements in flight (SPEC C.7)."""

    def __init__(self) -> None:
        self._buckets: dict[tuple, GuardBucket] = {}
        self._in_flight: dict[tuple, list[_Measurement]] = {}

    def ticket(self, layer: str, device: torch.device, rows: int, T: int, settings: TopkSettings,
               min_keys: int | None = None) -> CallTicket:
        """The guarded path of a call of ``rows`` = B*S queries over T keys under the layer's
        ``settings``, checked against ``min_keys``; the ticket's settings are the bucket's rung."""
        key = (layer, device, length_bucket(rows, 1), length_bucket(T, 1))
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = GuardBucket(ladder=guard_ladder(settings))
        if graph_capturing(device):
            return CallTicket(bucket.capture_path(), bucket.settings, min_keys=min_keys)
        self._collect(key)
        path, timed = bucket.next_path()
        bucket.issued(path, timed)
        return CallTicket(path, bucket.settings, self, key, rows * T, timed, min_keys, bucket.rung)

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
            bucket.record(m.path, m.ms() / m.pairs if m.timed else None, m.rates(), m.rung)
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
