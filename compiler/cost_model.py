"""Analytic cost of the DSA indexer's dense and certified paths (SPEC A.6), symbolic in the length.

``dense_call_time(shape, c)`` and ``certified_call_time(r, m, shape, c, redo=, scale=)`` are
polynomials in the key length ``T`` (sympy): the per-query work model of SPEC A.6 summed over the
queries of one call (``IndexerShape``: a causal prefill, or a chunk of queries at the end of T
keys) and its batch, plus the path's fixed cost, with rates and fixed costs from
``KernelConstants`` (``H200_FITTED``, ``CPU_REFERENCE``, or loaded from JSON). ``crossover_length``
is the exact length from which certified is predicted faster (None: never); ``predicted_ratio``
compares the two at one length; ``default_min_keys`` is the crossover of an unplanned layer. The
predictions steer decisions (``compiler.plan.choice``, ``compiler.policy``, ``compiler.ops.guard``)
and never correctness: the certified path is exact whatever they say.

The DSA sparse attention of an MLA layer has two forms with the same result (``AttentionConstants``):
``absorbed_attention_time`` (its work fixed by the selection width) and ``union_attention_time``
(its work following the mean union of a tile's selections, ``union_ratio``): ``compiler.ops.sparse_form``
compares them at call time (``union_ratio_crossover``); where a call cannot measure its selections,
``shape_form`` decides on the head count alone (compile time under CUDA graphs, and a call made while
one is captured)."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import sympy

from compiler import defaults
from compiler.lowering import defaults as kernel_defaults
from runtime import defaults as runtime_defaults
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
    source="runtime/ plain-torch reference, compiler.plan.constants.measure_reference_constants on a "
           "2-core x86 CPU (best of 9 runs, S=32 T=2048 H=16 D=32)",
)
"""The plain-torch reference on the CPU (what the op runs there); ``--constants measure`` re-measures it."""

H200_FITTED = KernelConstants(
    dense_macs_per_s=2.89e14,
    screen_macs_per_s=8.53e13,
    refine_macs_per_s=1.57e14,
    select_keys_per_s=1.71e11,
    plan_s_per_query=5.64e-7,
    dense_fixed_s=0.0,
    certified_fixed_s=3.46e-3,
    screen_tile=1,
    screen_pow2=True,
    source="benchmarks/fit_cost_model.py, benchmarks/results/fit_cost_model_h200.json: dense and selection "
           "rates from dense_roofline_h200.json, the rest a relative least-squares fit to the 60 certified calls "
           "of indexer_zoo_h200.json (max relative error 0.36, rms 0.14)",
)
"""The Triton path on one H200, fitted to the indexer benchmark; ``KernelConstants.from_json`` loads others."""


@dataclass(frozen=True)
class IndexerShape:
    """One indexer layer's call geometry.

    ``queries=None`` models a causal prefill (S = T queries, query i sees i + 1 keys); an int models a
    chunk of that many queries at the end of T keys. ``seeds`` is N0 (defaults to topk + sink + window,
    an upper bound on the seed set of the runtime's default rule), ``anchor_stride`` the spacing of
    densely scored anchor queries; sink, window and anchor_stride default to the runtime's
    ``CertifiedTopkConfig`` defaults. ``sample``: every query also scores T / ``SAMPLE_PER_KEYS`` keys for
    its own threshold (``runtime.seeds``; the default above T = 8192 keys). ``witnesses`` (the runtime's
    default): anchors are scored densely and every query scores its anchor's N0 top keys; without
    them (and with a sample) a query scores its sample alone, and N0 only marks the queries too short
    to certify.
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
    sample: bool = True
    witnesses: bool = _RUNTIME_DEFAULTS.witnesses

    def __post_init__(self) -> None:
        for name in ("heads", "head_dim", "topk", "batch", "anchor_stride"):
            _require_int(f"IndexerShape.{name}", getattr(self, name), 1)
        for name in ("sink", "window"):
            _require_int(f"IndexerShape.{name}", getattr(self, name), 0)
        if self.queries is not None:
            _require_int("IndexerShape.queries", self.queries, 1)
        if self.seeds is not None:
            _require_int("IndexerShape.seeds", self.seeds, self.topk)
        for name in ("sample", "witnesses"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"IndexerShape.{name}: expected a bool, got {getattr(self, name)!r}")

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


def certified_query_cost(n, r: int, m, shape: IndexerShape, c: KernelConstants, *, anchors, redo=0):
    """Seconds for one query over n > N0 visible keys of a call over ``T`` keys on the certified path
    with budget r, survival m, ``anchors`` anchor queries per query and a ``redo`` fraction. m is
    the refined share of the screened (query, key) pairs as the pipeline counts it (a survivor
    list's keys once for each of its queries, ``TopkStats.survivors``): the union of a list's
    queries enters through m measured at that list size, the model has no list size of its own."""
    hd, n0 = shape.heads * shape.head_dim, shape.n0
    screened = n - n0
    sample = T / runtime_defaults.SAMPLE_PER_KEYS if shape.sample else 0
    witnessed = shape.witnesses or not shape.sample  # runtime.seeds.takes_witnesses
    seeds = n0 if witnessed else 0
    return (_exact(c.plan_s_per_query)
            + (anchors if witnessed else 0) * n * hd / _exact(c.dense_macs_per_s)
            + (seeds + sample) * hd / _exact(c.refine_macs_per_s)
            + screened * screen_rows(r, c) * shape.head_dim / _exact(c.screen_macs_per_s)
            + m * screened * hd / _exact(c.refine_macs_per_s)
            + (seeds + m * screened) / _exact(c.select_keys_per_s)
            + redo * dense_query_cost(n, shape, c))


def _validity_start(shape: IndexerShape) -> int:
    """Smallest T at which the certified-call polynomial is exact (every query's split is fixed)."""
    return shape.n0 + 1 if shape.queries is None else shape.n0 + shape.queries


def dense_call_time(shape: IndexerShape, c: KernelConstants) -> sympy.Expr:
    """Seconds for a whole dense call as a polynomial in ``T``."""
    n = sympy.Symbol("n", positive=True, integer=True)
    lo = 1 if shape.queries is None else T - shape.queries + 1
    total = sympy.summation(dense_query_cost(n, shape, c), (n, lo, T))
    return sympy.expand(_exact(c.dense_fixed_s) + shape.batch * total)


def certified_call_time(r: int, m: float, shape: IndexerShape, c: KernelConstants, *, redo: float = 0.0,
                        scale: float = 1.0) -> sympy.Expr:
    """Seconds for a whole certified call as a polynomial in ``T``, exact for T >= the validity start.

    Queries with at most N0 visible keys are scored densely (they cannot be pruned). ``redo``: the
    fraction of certified queries redone densely; ``scale``: a measured correction of the whole call.
    """
    _check_survival(m)
    _check_fraction("redo", redo)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        raise ValueError(f"scale: expected a finite positive factor, got {scale!r}")
    n = sympy.Symbol("n", positive=True, integer=True)
    mq, rq = _exact(m), _exact(redo)
    if shape.queries is None:
        cost = certified_query_cost(n, r, mq, shape, c, anchors=sympy.Rational(1, shape.anchor_stride), redo=rq)
        total = (sympy.summation(dense_query_cost(n, shape, c), (n, 1, shape.n0))
                 + sympy.summation(cost, (n, shape.n0 + 1, T)))
    else:
        anchors = sympy.Rational(-(-shape.queries // shape.anchor_stride), shape.queries)
        cost = certified_query_cost(n, r, mq, shape, c, anchors=anchors, redo=rq)
        total = sympy.summation(cost, (n, T - shape.queries + 1, T))
    return sympy.expand(_exact(scale) * (_exact(c.certified_fixed_s) + shape.batch * total))


def _check_survival(m) -> None:
    _check_fraction("m", m)


def _check_fraction(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        kind = "a survival fraction" if name == "m" else "a fraction"
        raise ValueError(f"{name}: expected {kind} in [0, 1], got {value!r}")


def crossover_length(r: int, m: float, shape: IndexerShape, c: KernelConstants, *, redo: float = 0.0,
                     scale: float = 1.0) -> int | None:
    """Smallest key length T from which the certified path is predicted faster at every longer length.

    Solves certified_call_time − dense_call_time = 0 exactly (sympy real roots of a polynomial with
    rational coefficients). None when dense stays cheaper at long lengths (the difference does not
    become negative for large T), e.g. when m >= 1 − ρ(r)/H at equal rates.
    """
    diff = sympy.Poly(certified_call_time(r, m, shape, c, redo=redo, scale=scale) - dense_call_time(shape, c), T)
    start = _validity_start(shape)
    if diff.is_zero or diff.LC() >= 0:
        return None
    roots = sympy.real_roots(diff)
    if not roots:
        return start
    largest = max(roots)
    return max(start, int(sympy.floor(largest)) + 1)


def predicted_ratio(length: int, r: int, m: float, shape: IndexerShape, c: KernelConstants, *,
                    redo: float = 0.0, scale: float = 1.0) -> float:
    """Certified over dense call time at one key length (below 1: certified is predicted faster)."""
    _require_int("length", length, 1)
    cert = certified_call_time(r, m, shape, c, redo=redo, scale=scale).subs(T, length)
    return float(cert / dense_call_time(shape, c).subs(T, length))


def constants_for(device_type: str) -> KernelConstants:
    """The default constants of a device type: ``H200_FITTED`` on CUDA, ``CPU_REFERENCE`` elsewhere."""
    return H200_FITTED if device_type == "cuda" else CPU_REFERENCE


def assumed_budget(heads: int, c: KernelConstants) -> int | None:
    """The smallest aligned budget >= ``defaults.ASSUMED_R`` below ``heads`` (None when there is none)."""
    rs = [r for r in candidate_rs(heads, c) if r >= defaults.ASSUMED_R]
    return rs[0] if rs else None


@functools.lru_cache(maxsize=256)
def default_min_keys(heads: int, head_dim: int, topk: int, queries: int | None, device_type: str) -> int | None:
    """The key length from which an unplanned layer is certified: the crossover of ``assumed_budget``
    at ``defaults.DEFAULT_SURVIVAL`` for calls of ``queries`` queries (None: a causal prefill) on
    the device type; None: never."""
    c = constants_for(device_type)
    r = assumed_budget(heads, c)
    if r is None:
        return None
    shape = IndexerShape(heads=heads, head_dim=head_dim, topk=topk, queries=queries)
    return crossover_length(r, defaults.DEFAULT_SURVIVAL, shape, c)


@dataclass(frozen=True)
class AttentionConstants:
    """Seconds per unit of work of the two forms of an MLA layer's DSA sparse attention on one device.

    Absorbed: ``absorbed_s`` per (query, selected key, block of ``ABSORBED_BLOCK_HEADS`` heads: the
    rows of one absorbed program's products, ``compiler.lowering.defaults``) for the
    warp-specialised kernel, ``absorbed_chain_s`` per (query, selected key, such block) for the Triton
    chain. Union: per (query, union key) ``union_s`` per head plus ``union_key_s``, and
    ``union_fixed_s`` per (query, selected key) (building the unions); when the union form is run
    from the latent, its expansion into keys and values costs ``2·Dc·(Dn+Dv)`` FLOPs at
    ``matmul_flops_per_s`` and moves ``3·Dn+Dr+Dv`` values (the product written, its nope part read
    and written with the rope key) at ``copy_bytes_per_s`` per (key, head). All positive and finite.
    """

    absorbed_s: float
    absorbed_chain_s: float
    union_s: float
    union_key_s: float
    union_fixed_s: float
    matmul_flops_per_s: float
    copy_bytes_per_s: float
    source: str

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "source":
                if not isinstance(value, str):
                    raise TypeError(f"AttentionConstants.source: expected str, got {type(value).__name__}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                    or not math.isfinite(value):
                raise ValueError(f"AttentionConstants.{field.name}: expected a finite positive number, got {value!r}")


H200_ATTENTION = AttentionConstants(
    absorbed_s=3.55e-10,
    absorbed_chain_s=3.83e-10,
    union_s=3.01e-12,
    union_key_s=1.42e-11,
    union_fixed_s=2.6e-11,
    matmul_flops_per_s=7.7e14,
    copy_bytes_per_s=1.53e12,
    source="benchmarks/fit_attention_cost.py on benchmarks/results/sparse_attention_auto_h200.json (43 union "
           "calls at 8, 16 and 128 heads, 16K-64K, max relative error 0.09): fit_attention_cost_h200.json",
)
"""The Triton and Gluon kernels on one H200."""


def _require_sizes(**sizes) -> None:
    for name, value in sizes.items():
        _require_int(name, value, 0)


def absorbed_attention_time(batch: int, queries: int, topk: int, heads: int, warp_specialised: bool,
                            c: AttentionConstants = H200_ATTENTION) -> float:
    """Seconds of the absorbed form over ``batch·queries`` queries of ``topk`` selected keys each."""
    _require_sizes(batch=batch, queries=queries, topk=topk, heads=heads)
    blocks = -(-heads // kernel_defaults.ABSORBED_BLOCK_HEADS)
    return batch * queries * topk * blocks * (c.absorbed_s if warp_specialised else c.absorbed_chain_s)


def union_attention_time(batch: int, queries: int, topk: int, heads: int, ratio: float,
                         c: AttentionConstants = H200_ATTENTION, *, expand: tuple[int, int, int, int, int] | None = None,
                         element_bytes: int = 2) -> float:
    """Seconds of the union form whose tiles' unions hold ``ratio``·topk keys on average
    (``union_ratio``); with ``expand = (keys, Dc, Dn, Dr, Dv)`` plus expanding the latent of
    ``keys`` rows into every head's keys and values of ``element_bytes`` bytes."""
    _require_sizes(batch=batch, queries=queries, topk=topk, heads=heads)
    if not ratio >= 0:
        raise ValueError(f"ratio: expected a number >= 0, got {ratio!r}")
    selected = batch * queries * topk
    seconds = selected * (ratio * (heads * c.union_s + c.union_key_s) + c.union_fixed_s)
    if expand is not None:
        keys, lat, nope, rope, v = expand
        per_key_head = 2 * lat * (nope + v) / c.matmul_flops_per_s + \
            (3 * nope + rope + v) * element_bytes / c.copy_bytes_per_s
        seconds += batch * keys * heads * per_key_head
    return seconds


def union_ratio_crossover(batch: int, queries: int, topk: int, heads: int, warp_specialised: bool,
                          c: AttentionConstants = H200_ATTENTION, *,
                          expand: tuple[int, int, int, int, int] | None = None, element_bytes: int = 2) -> float:
    """The ``union_ratio`` below which the union form is predicted faster than the absorbed one
    (<= 0: never; the union time grows linearly in the ratio)."""
    absorbed = absorbed_attention_time(batch, queries, topk, heads, warp_specialised, c)
    at_zero = union_attention_time(batch, queries, topk, heads, 0.0, c, expand=expand, element_bytes=element_bytes)
    slope = batch * queries * topk * (heads * c.union_s + c.union_key_s)
    return (absorbed - at_zero) / slope if slope else -math.inf


def shape_form(heads: int) -> tuple[str, str]:
    """``(form, reason)`` of an MLA layer's DSA sparse attention on the head count alone, where a
    call cannot measure its selections: absorbed from ``ABSORBED_BLOCK_HEADS`` heads (a program's
    product rows full, ``compiler.lowering.defaults``), union below."""
    block = kernel_defaults.ABSORBED_BLOCK_HEADS
    if heads >= block:
        return "absorbed", (f"{heads} heads (>= {block}) fill the absorbed products' rows; "
                            "its time does not depend on how the selections overlap")
    return "union", f"{heads} heads (< {block}) would pad the absorbed products' rows"
