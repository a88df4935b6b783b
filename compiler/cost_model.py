"""Analytic cost of the DSA indexer's dense and certified paths (SPEC A.6), kept symbolic in length.

Work model, per query that sees ``n`` visible keys (``n > N0``), ``H`` heads of width ``D``:

    dense(n)     = n·H·D / dense_rate + n / select_rate
    certified(n) = plan + n·H·D / (anchor_stride·dense_rate)         anchor queries scored densely
                 + N0·H·D / refine_rate                               seeds scored exactly
                 + (n − N0)·ρ(r)·D / screen_rate                      screen, ρ(r) = r + d_a padded
                 + m·(n − N0)·H·D / refine_rate                       refine the survivors
                 + (N0 + m·(n − N0)) / select_rate                    select over seeds and survivors

``m = m(r)`` is the survival fraction of screened keys (measured per layer by the plan CLI), ``N0`` the
seed count (witness top-K ∪ sink ∪ window). A query with ``n ≤ N0`` is scored densely on both paths.
A call of ``S`` queries ending at key ``T`` (query ``i`` sees ``T − S + 1 + i`` keys; ``S = T`` is a causal
prefill) costs the fixed cost of its path plus the sum of the per-query costs over its queries and its
batch. Both are polynomials in the symbol ``T`` (degree 2 for a prefill, 1 for a fixed query chunk), so
the crossover length where certified overtakes dense is an exact root found once per layer with sympy.

Speeds are predictions from measured constants (``KernelConstants``), never a correctness input: the
certified path is exact whatever the model predicts.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import sympy

from runtime.certified_topk import CertifiedTopkConfig

_RUNTIME_DEFAULTS = CertifiedTopkConfig()

T = sympy.Symbol("T", positive=True, integer=True)
"""The key length of a call (the sequence length seen by the indexer)."""

AUX_ROWS = 1
"""d_a: rows of the screen's matrix product beyond the r retained heads: the aggregate row (a_A, or V on
the abs path). SPEC A.3 counts r + 2 logical dots; the norm term E·||k|| is a per-key scalar product, not
a row, in both the reference (``runtime.certificate.evaluate_bound``) and the Triton screen."""

_RATE_FIELDS = ("dense_macs_per_s", "screen_macs_per_s", "refine_macs_per_s", "select_keys_per_s")
_TIME_FIELDS = ("plan_s_per_query", "dense_fixed_s", "certified_fixed_s")


@dataclass(frozen=True)
class KernelConstants:
    """Measured throughputs and fixed costs of the indexer's stages on one device.

    Rates are positive (per second); times are non-negative seconds. The screen's r + d_a rows are
    padded to the next power of two when ``screen_pow2`` (the Triton screen's RP), then to a multiple of
    ``screen_tile``; the padded rows cost as much as real ones. ``source`` says where the numbers come from.
    """

    dense_macs_per_s: float
    screen_macs_per_s: float
    refine_macs_per_s: float
    select_keys_per_s: float
    plan_s_per_query: float
    dense_fixed_s: float
    certified_fixed_s: float
    screen_tile: int
    screen_pow2: bool
    source: str

    def __post_init__(self) -> None:
        for name in _RATE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                    or not math.isfinite(value):
                raise ValueError(f"KernelConstants.{name}: expected a finite positive rate, got {value!r}")
        for name in _TIME_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
                    or not math.isfinite(value):
                raise ValueError(f"KernelConstants.{name}: expected finite seconds >= 0, got {value!r}")
        if isinstance(self.screen_tile, bool) or not isinstance(self.screen_tile, int) or self.screen_tile < 1:
            raise ValueError(f"KernelConstants.screen_tile: expected an int >= 1, got {self.screen_tile!r}")
        if not isinstance(self.screen_pow2, bool):
            raise TypeError(f"KernelConstants.screen_pow2: expected a bool, got {self.screen_pow2!r}")
        if not isinstance(self.source, str):
            raise TypeError(f"KernelConstants.source: expected str, got {type(self.source).__name__}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "KernelConstants":
        """Build from a mapping with exactly the dataclass's fields (ValueError names the bad key)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"constants: expected a mapping, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        missing, unknown = sorted(names - set(data)), sorted(set(data) - names)
        if missing or unknown:
            raise ValueError(f"constants: missing keys {missing}, unknown keys {unknown}")
        return cls(**dict(data))

    @classmethod
    def from_json(cls, path: str | Path) -> "KernelConstants":
        """Load constants written by a benchmark (a JSON object with the dataclass's fields)."""
        with open(path, encoding="utf-8") as fh:
            return cls.from_dict(json.load(fh))


CPU_REFERENCE = KernelConstants(
    dense_macs_per_s=1.5e9,
    screen_macs_per_s=5.0e9,
    refine_macs_per_s=3.3e9,
    select_keys_per_s=2.8e7,
    plan_s_per_query=2.0e-5,
    dense_fixed_s=1.0e-3,
    certified_fixed_s=2.0e-2,
    screen_tile=1,
    screen_pow2=False,
    source="runtime/ plain-torch reference, compiler.plan_constants.measure_reference_constants on a "
           "2-core x86 CPU (best of 9 runs, S=32 T=2048 H=16 D=32, torch 2.13; other load present)",
)
"""The plain-torch reference on CPU (what the op runs there); ``--constants measure`` re-measures it."""

H200_FITTED = KernelConstants(
    dense_macs_per_s=1.17e14,
    screen_macs_per_s=2.6e13,
    refine_macs_per_s=1.19e14,
    select_keys_per_s=4.7e10,
    plan_s_per_query=1.5e-6,
    dense_fixed_s=1.9e-3,
    certified_fixed_s=2.3e-3,
    screen_tile=1,
    screen_pow2=True,
    source="relative least-squares fit of this model to benchmarks/results/indexer_h200.json (triton_dense "
           "and certified_forced rows, structured inputs, H=32/64, S=4096/16384, T=32K-512K, D=128, "
           "topk=2048, bf16; select rate from its kernel breakdown): every fitted time within 25% of the "
           "measured one. Effective rates: the screen rate includes the per-key passes around the screen "
           "kernel, the refine rate counts per-query survivors served by shared survivor lists.",
)
"""The Triton path on one H200, fitted to the indexer benchmark; ``KernelConstants.from_json`` loads others."""


@dataclass(frozen=True)
class IndexerShape:
    """One indexer layer's call geometry.

    ``queries=None`` models a causal prefill (S = T queries, query i sees i + 1 keys); an int models a
    chunk of that many queries at the end of T keys. ``seeds`` is N0 (defaults to topk + sink + window,
    an upper bound on the seed set of the runtime's default rule), ``anchor_stride`` the spacing of
    densely scored anchor queries; sink, window and anchor_stride default to the runtime's
    ``CertifiedTopkConfig`` defaults.
    """

    heads: int
    head_dim: int
    topk: int
    batch: int = 1
    queries: int | None = None
    sink: int = _RUNTIME_DEFAULTS.sink
    window: int = _RUNTIME_DEFAULTS.window
    anchor_stride: int = _RUNTIME_DEFAULTS.anchor_stride
    seeds: int | None = None

    def __post_init__(self) -> None:
        for name in ("heads", "head_dim", "topk", "batch", "anchor_stride"):
            _require_int(f"IndexerShape.{name}", getattr(self, name), 1)
        for name in ("sink", "window"):
            _require_int(f"IndexerShape.{name}", getattr(self, name), 0)
        if self.queries is not None:
            _require_int("IndexerShape.queries", self.queries, 1)
        if self.seeds is not None:
            _require_int("IndexerShape.seeds", self.seeds, self.topk)

    @property
    def n0(self) -> int:
        """N0: keys scored exactly as seeds for each certified query."""
        return self.seeds if self.seeds is not None else self.topk + self.sink + self.window


def _require_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {value}")


def _exact(x: float) -> sympy.Rational:
    """The float as an exact rational, so polynomial roots are solved without float round-off."""
    return sympy.Rational(float(x))


def screen_rows(r: int, c: KernelConstants) -> int:
    """ρ(r): screening rows per key, r + d_a padded as the constants' screen pads them."""
    _require_int("r", r, 1)
    rows = r + AUX_ROWS
    if c.screen_pow2:
        rows = 1 << (rows - 1).bit_length()
    return -(-rows // c.screen_tile) * c.screen_tile


def candidate_rs(heads: int, c: KernelConstants) -> list[int]:
    """Aligned retained-head budgets below ``heads``: each r that uses every row of its padded screen
    (ρ(r + 1) > ρ(r)), i.e. the largest budget for each padded row count."""
    _require_int("heads", heads, 1)
    return [r for r in range(1, heads) if screen_rows(r + 1, c) > screen_rows(r, c)]


def dense_query_cost(n, shape: IndexerShape, c: KernelConstants):
    """Seconds for one query over n visible keys on the dense path (sympy expression in n)."""
    return n * shape.heads * shape.head_dim / _exact(c.dense_macs_per_s) + n / _exact(c.select_keys_per_s)


def certified_query_cost(n, r: int, m, shape: IndexerShape, c: KernelConstants):
    """Seconds for one query over n > N0 visible keys on the certified path with budget r, survival m."""
    hd, n0 = shape.heads * shape.head_dim, shape.n0
    screened = n - n0
    return (_exact(c.plan_s_per_query)
            + n * hd / (shape.anchor_stride * _exact(c.dense_macs_per_s))
            + n0 * hd / _exact(c.refine_macs_per_s)
            + screened * screen_rows(r, c) * shape.head_dim / _exact(c.screen_macs_per_s)
            + m * screened * hd / _exact(c.refine_macs_per_s)
            + (n0 + m * screened) / _exact(c.select_keys_per_s))


def _validity_start(shape: IndexerShape) -> int:
    """Smallest T at which the certified-call polynomial is exact (every query's split is fixed)."""
    return shape.n0 + 1 if shape.queries is None else shape.n0 + shape.queries


def dense_call_time(shape: IndexerShape, c: KernelConstants) -> sympy.Expr:
    """Seconds for a whole dense call as a polynomial in ``T``."""
    n = sympy.Symbol("n", positive=True, integer=True)
    lo = 1 if shape.queries is None else T - shape.queries + 1
    total = sympy.summation(dense_query_cost(n, shape, c), (n, lo, T))
    return sympy.expand(_exact(c.dense_fixed_s) + shape.batch * total)


def certified_call_time(r: int, m: float, shape: IndexerShape, c: KernelConstants) -> sympy.Expr:
    """Seconds for a whole certified call as a polynomial in ``T``, exact for T >= the validity start.

    Queries with at most N0 visible keys are scored densely (they cannot be pruned).
    """
    _check_survival(m)
    n = sympy.Symbol("n", positive=True, integer=True)
    mq = _exact(m)
    if shape.queries is None:
        total = (sympy.summation(dense_query_cost(n, shape, c), (n, 1, shape.n0))
                 + sympy.summation(certified_query_cost(n, r, mq, shape, c), (n, shape.n0 + 1, T)))
    else:
        total = sympy.summation(certified_query_cost(n, r, mq, shape, c), (n, T - shape.queries + 1, T))
    return sympy.expand(_exact(c.certified_fixed_s) + shape.batch * total)


def _check_survival(m) -> None:
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0.0 <= m <= 1.0:
        raise ValueError(f"m: expected a survival fraction in [0, 1], got {m!r}")


def crossover_length(r: int, m: float, shape: IndexerShape, c: KernelConstants) -> int | None:
    """Smallest key length T from which the certified path is predicted faster at every longer length.

    Solves certified_call_time − dense_call_time = 0 exactly (sympy real roots of a polynomial with
    rational coefficients). None when dense stays cheaper at long lengths (the difference does not
    become negative for large T), e.g. when m >= 1 − ρ(r)/H at equal rates.
    """
    diff = sympy.Poly(certified_call_time(r, m, shape, c) - dense_call_time(shape, c), T)
    start = _validity_start(shape)
    if diff.is_zero or diff.LC() >= 0:
        return None
    roots = sympy.real_roots(diff)
    if not roots:
        return start
    largest = max(roots)
    return max(start, int(sympy.floor(largest)) + 1)


def predicted_speedup(length: int, r: int | None, m: float | None, crossover: int | None,
                      shape: IndexerShape, c: KernelConstants) -> float:
    """Indexer speedup over dense at one key length when dispatching by ``crossover`` (1.0 below it)."""
    _require_int("length", length, 1)
    if r is None or crossover is None or length < crossover:
        return 1.0
    dense = dense_call_time(shape, c).subs(T, length)
    cert = certified_call_time(r, m, shape, c).subs(T, length)
    return float(dense / cert)


def amdahl_speedup(fraction: float, speedup: float) -> float:
    """End-to-end speedup 1 / (1 − f + f/s) when a part taking ``fraction`` of the time gets ``speedup``."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction: expected a time fraction in [0, 1], got {fraction!r}")
    if isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or not speedup > 0:
        raise ValueError(f"speedup: expected a positive factor, got {speedup!r}")
    return 1.0 / (1.0 - fraction + fraction / speedup)


@dataclass(frozen=True)
class LayerChoice:
    """The cost model's decision for one indexer layer.

    ``path`` is "certified" (dispatch by length: dense below ``crossover``, certified from it) or
    "dense" (always dense; ``r`` and ``crossover`` are None). ``predicted_pruned_frac`` is 1 − m(r).
    """

    path: str
    r: int | None
    crossover: int | None
    predicted_pruned_frac: float | None
    predicted_speedup: float


def choose_layer(survival: Mapping[int, float], shape: IndexerShape, c: KernelConstants,
                 design_length: int) -> LayerChoice:
    """Pick r and the path for one layer from measured survival fractions m(r).

    r minimises the predicted call time at ``design_length`` among the measured tile-aligned budgets
    whose crossover exists and is at most ``design_length`` (ties: smaller r). No such r -> dense.
    """
    _require_int("design_length", design_length, 1)
    if not isinstance(survival, Mapping):
        raise TypeError(f"survival: expected a mapping r -> m, got {type(survival).__name__}")
    dense_time = dense_call_time(shape, c).subs(T, design_length)
    best = None
    for r in sorted(survival):
        _require_int("survival key r", r, 1)
        m = survival[r]
        _check_survival(m)
        if r >= shape.heads:
            continue
        crossover = crossover_length(r, m, shape, c)
        if crossover is None or crossover > design_length:
            continue
        time = certified_call_time(r, m, shape, c).subs(T, design_length)
        if best is None or time < best[0]:
            best = (time, r, m, crossover)
    if best is None:
        return LayerChoice("dense", None, None, None, 1.0)
    time, r, m, crossover = best
    return LayerChoice("certified", r, crossover, 1.0 - m, float(dense_time / time))


DEFAULT_SURVIVAL = 0.03
"""Survival fraction assumed without a plan: the DoSA paper's trained-indexer rate (SPEC A.7, 2.65%)."""


ASSUMED_R = 4
"""Budget assumed without a plan: the runtime's default rule (|H+| rounded up to a multiple of 4) for a
query with at most 4 positive heads, the regime of trained indexers (SPEC A.8)."""


def assumed_budget(heads: int, c: KernelConstants) -> int | None:
    """The smallest aligned budget >= ASSUMED_R below ``heads`` (None when there is none)."""
    rs = [r for r in candidate_rs(heads, c) if r >= ASSUMED_R]
    return rs[0] if rs else None


def default_choice(shape: IndexerShape, c: KernelConstants, design_length: int) -> LayerChoice:
    """The choice without a plan: r left to the runtime's per-query rule (None), crossover predicted
    for ``assumed_budget`` at ``DEFAULT_SURVIVAL``; dense when that cannot pay."""
    r = assumed_budget(shape.heads, c)
    crossover = None if r is None else crossover_length(r, DEFAULT_SURVIVAL, shape, c)
    if crossover is None:
        return LayerChoice("dense", None, None, None, 1.0)
    speedup = predicted_speedup(max(design_length, crossover), r, DEFAULT_SURVIVAL, crossover, shape, c)
    return LayerChoice("certified", None, crossover, None, speedup)


def speedup_curve(choice: LayerChoice, survival: float | None, shape: IndexerShape, c: KernelConstants,
                  lengths: Sequence[int]) -> list[float]:
    """Predicted indexer speedup of a choice at each length (for plots and reports); a choice without
    r or survival uses the no-plan assumptions."""
    if choice.path == "dense":
        return [1.0 for _ in lengths]
    m = survival if survival is not None else DEFAULT_SURVIVAL
    r = choice.r if choice.r is not None else assumed_budget(shape.heads, c)
    return [predicted_speedup(n, r, m, choice.crossover, shape, c) for n in lengths]
