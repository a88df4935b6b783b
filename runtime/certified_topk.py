"""Certified exact top-K of a DSA lightning indexer (SPEC A.2-A.4, A.8), batched in plain torch.

``certified_topk(q, k, weights, topk, mask=None, key_scale=None, config=..., stats=None)`` returns
exactly what ``dense_topk`` returns (identical indices, bitwise values) for every input, FP8 inputs
included (SPEC A.10). Per query: anchors are scored densely; the others take seeds and the threshold
tau = max(the seeds' kk-th score, the own sample estimate), bound every other visible key with the
certificate (``runtime.certificate``, rounded up: ``runtime.rounding``), refine the keys with a
bound >= tau by THE SCORER and keep those scoring >= tau, and take THE ORDER over seeds and
candidates when at least kk of them reach tau. Every other query is answered by dense scoring over
all its visible keys, counted per reason (``FALLBACK_REASONS``): "nonfinite", "numeric_range",
"topk_ge_visible", "dense_cheaper" (``config.path == "dense"``), "overflow" (more survivors than
the workspace, ``floor(workspace_frac * T) + kk``: no key is dropped), "threshold_miss".
``TopkStats`` accumulates the counters as device tensors (no host synchronisation). ``shared_bound``
(keys sharded over ranks, ``runtime.certified_topk_cp``) maps the seed thresholds to a bound b that
at least kk keys of the whole key set reach; tau = max(b, own estimate), and a row with fewer than
kk keys reaching tau = b is short: its keys in THE ORDER, then padding (-inf, -1) (SPEC A.9)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from runtime.certificate import default_r, evaluate_bound, plan_certificate
from runtime.dense_scorer import (
    exact_scores,
    head_dots,
    masked_scores,
    scaled_scores,
    select_topk,
    weighted_relu_sum,
)
from runtime.indexer_inputs import IndexerInputs, check_indexer_inputs
from runtime.rounding import key_norm_up, next_up, range_is_safe, round_up_to_float32, scaled_bound_up
from runtime import defaults
from runtime.seeds import (SOFT_HIDDEN_BIAS, anchor_rows, sample_keys, sample_rank,
                           sample_size, seed_mask, takes_witnesses)

__all__ = ["FALLBACK_REASONS", "PATHS", "CertifiedTopkConfig", "TopkStats", "certified_topk", "check_list_queries"]

ROUTED_REASONS = ("nonfinite", "numeric_range", "topk_ge_visible", "dense_cheaper")
"""Fallbacks decided before a query is certified (``_route``), in the order they are checked."""
FALLBACK_REASONS = ROUTED_REASONS + ("overflow", "threshold_miss")
PATHS = ("dense", "certified")
"""What a call runs: dense scoring of every query, or the certified path (fallbacks per query)."""

SharedBound = Callable[[torch.Tensor], torch.Tensor]
"""The ``shared_bound`` hook: seed thresholds [B,S] float32 (finite or -inf) -> b [B,S] float32
(module docstring, "Shared bound")."""


def _require_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")


def check_list_queries(value: object, name: str = "list_queries") -> None:
    """ValueError naming ``name`` unless ``value`` is None or a power-of-two int >= 1 (a survivor
    list's queries are one query tile of the GPU screen and refine kernels, whose tiles are powers
    of two)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ValueError(f"{name}: expected None or a power-of-two int >= 1 (queries sharing a survivor "
                         f"list), got {value!r}")


@dataclass(frozen=True)
class CertifiedTopkConfig:
    """Options of ``certified_topk``.

    r: retained heads per query (None: |H+| rounded up to a multiple of 4, per query; an int is
    one r for the whole call, clipped to H). witnesses: every anchor_stride-th query is an anchor,
    scored densely, whose top keys seed its group (False: no anchors; the groups of anchor_stride
    queries share only their strided sample, and the sample's estimate is the threshold; a call
    without a sample, or whose keys are sharded, takes witnesses anyway). sink / window: first /
    last visible keys added to the seeds.
    workspace_frac: survivor workspace per query, floor(workspace_frac * T) + kk keys.
    sample_keys: keys of the strided sample behind each query's own threshold (None: the default
    of ``seeds.sample_size``; 0: none). sample_sigmas: safety of its rank (``seeds.sample_rank``).
    path: "certified" (failed preconditions still fall back per query) or "dense".
    list_queries: consecutive queries sharing one survivor list (the union of their survivors) and
    one refine program on the GPU pipeline (``compiler/lowering/topk_pipeline.py``), a power of two
    (None: the scorer tile's query count, 4 at H = 64 on CUDA). 1 refines no pair a query pruned but
    reads each listed key once per query; which size is fastest depends on the layer
    (benchmarks/results/certified_trained_h100.md), so plans choose it per layer. This reference
    screens and refines each query alone whatever the value; no size changes an output.
    """

    r: int | None = None
    witnesses: bool = defaults.WITNESSES
    anchor_stride: int = defaults.ANCHOR_STRIDE
    sink: int = defaults.SINK
    window: int = defaults.WINDOW
    workspace_frac: float = defaults.WORKSPACE_FRAC
    sample_keys: int | None = None
    sample_sigmas: float = defaults.SAMPLE_SIGMAS
    path: str = "certified"
    list_queries: int | None = None

    def __post_init__(self) -> None:
        if self.r is not None:
            _require_int("r", self.r, 1)
        if not isinstance(self.witnesses, bool):
            raise TypeError(f"witnesses: expected a bool, got {self.witnesses!r}")
        _require_int("anchor_stride", self.anchor_stride, 1)
        _require_int("sink", self.sink, 0)
        _require_int("window", self.window, 0)
        if self.sample_keys is not None:
            _require_int("sample_keys", self.sample_keys, 0)
        sig = self.sample_sigmas
        if isinstance(sig, bool) or not isinstance(sig, (int, float)) or not -1e6 < sig < 1e6:
            raise ValueError(f"sample_sigmas: expected a finite number, got {sig!r}")
        frac = self.workspace_frac
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac < 1e6:
            raise ValueError(f"workspace_frac: expected a finite number >= 0, got {frac!r}")
        if self.path not in PATHS:
            raise ValueError(f"path: expected one of {PATHS}, got {self.path!r}")
        check_list_queries(self.list_queries)


class TopkStats:
    """Counters of ``certified_topk`` calls: device counts (no host sync when adding) and host ints.

    Counters: queries, anchors, keys_visible, keys_seeded (seed keys of certified queries),
    keys_screened (keys bounded by the certificate), survivors (screened keys with bound >= tau; the
    GPU pipeline counts each key of a survivor list once per query of the list: ``list_queries``),
    written (survivors with score >= tau), and one count of queries per fallback reason. The device
    counts are one int64 vector in the order of NAMES. ``summary()`` and ``pruned_frac`` synchronise.
    """

    COUNTERS = ("queries", "anchors", "keys_visible", "keys_seeded", "keys_screened",
                "survivors", "written")
    NAMES = COUNTERS + FALLBACK_REASONS
    """Every counter, in the order of a counts vector (``add_counts``, ``totals``)."""

    def __init__(self) -> None:
        self._device: torch.Tensor | None = None
        self._host: dict[str, int] = {}

    def add(self, name: str, count: torch.Tensor | int) -> None:
        """Add an integer count to counter ``name``: a 0-d tensor, kept on its device, or a Python
        int the caller knows on the host (no launch: a dense call's counts; a CUDA graph replay does
        not add it again)."""
        if name not in self.NAMES:
            raise ValueError(f"name: expected a counter of {self.NAMES}, got {name!r}")
        if isinstance(count, int) and not isinstance(count, bool):
            self._host[name] = self._host.get(name, 0) + count
            return
        counts = torch.zeros(len(self.NAMES), dtype=torch.int64, device=count.device)
        counts[self.NAMES.index(name)] = count.to(torch.int64)
        self.add_counts(counts)

    def add_counts(self, counts: torch.Tensor) -> None:
        """Add int64 ``counts`` [len(NAMES)], one per counter of NAMES in order, kept on their device
        (moved to this accumulator's): no launch for the first device counts, one after."""
        if counts.dtype != torch.int64 or tuple(counts.shape) != (len(self.NAMES),):
            raise ValueError(f"counts: expected int64 [{len(self.NAMES)}], got {counts.dtype} {tuple(counts.shape)}")
        self._device = counts if self._device is None else self._device + counts.to(self._device.device)

    def merge(self, other: "TopkStats") -> None:
        """Add every counter of ``other`` (moved to this accumulator's device if it has one)."""
        if other._device is not None:
            self.add_counts(other._device)
        for name, count in other._host.items():
            self.add(name, count)

    def totals(self) -> torch.Tensor:
        """Every counter of NAMES as one int64 tensor, without a host synchronisation: on the device
        counts' device (the accumulator itself when there are no host counts: no launch), else CPU."""
        host = [self._host.get(name, 0) for name in self.NAMES]
        if self._device is None:
            return torch.tensor(host, dtype=torch.int64)
        if not any(host):
            return self._device
        return self._device + torch.tensor(host, dtype=torch.int64).to(self._device.device)

    def _values(self) -> dict[str, int]:
        return dict(zip(self.NAMES, self.totals().tolist()))

    @staticmethod
    def _pruned(values: dict[str, int]) -> float:
        screened = values["keys_screened"]
        return 0.0 if screened == 0 else 1.0 - values["survivors"] / screened

    @property
    def pruned_frac(self) -> float:
        """Fraction of screened keys the certificate pruned (0.0 before any screening)."""
        return self._pruned(self._values())

    def summary(self) -> dict:
        """All counters as ints, {"fallbacks": {reason: queries}} and "pruned_frac" (one host sync)."""
        values = self._values()
        out: dict = {name: values[name] for name in self.COUNTERS}
        out["fallbacks"] = {reason: values[reason] for reason in FALLBACK_REASONS}
        out["pruned_frac"] = self._pruned(values)
        return out


def _compact(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the True entries of each row, ascending, padded with T: ([N,L], valid [N,L])."""
    N, T = mask.shape
    width = int(mask.sum(-1).max()) if N else 0
    slot = torch.where(mask, mask.cumsum(-1) - 1, width)
    keys = torch.arange(T, device=mask.device).expand(N, T)
    idx = torch.full((N, width + 1), T, dtype=torch.int64, device=mask.device)
    idx = idx.scatter(1, slot, keys)[:, :width]
    return idx, idx < T


def _route(inputs: IndexerInputs, config: CertifiedTopkConfig, key_norm: torch.Tensor,
           witnesses: bool) -> dict[str, torch.Tensor]:
    """Exclusive [B,S] bool masks: one per ``ROUTED_REASONS`` entry, "anchor", "certified".

    key_norm [B,T] float64: ``_key_norms``. ``witnesses``: the call has anchors
    (``seeds.takes_witnesses``). Requires B*S > 0 and T > 0.
    """
    B, S = inputs.q.shape[:2]
    q, w, k, visible = inputs.q, inputs.weights, inputs.k, inputs.visible
    key_finite = torch.isfinite(k).all(-1)
    if inputs.key_scale is not None:  # the scale step is monotone only for finite positive scales
        key_finite &= torch.isfinite(inputs.key_scale) & (inputs.key_scale > 0)
    nonfinite = ~(torch.isfinite(q).all(-1).all(-1) & torch.isfinite(w).all(-1))
    nonfinite |= (visible & ~key_finite[:, None, :]).any(-1)
    if inputs.bias is not None:
        nonfinite |= (visible & ~torch.isfinite(inputs.bias)).any(-1)

    q64 = torch.where(torch.isfinite(q), q, 0.0).to(torch.float64)
    w64 = torch.where(torch.isfinite(w), w, 0.0).to(torch.float64)
    head_norm = torch.sqrt((q64 * q64).sum(-1))
    zero = torch.zeros((), dtype=torch.float64, device=q.device)
    max_key = torch.where(visible, key_norm[:, None, :], zero).amax(-1)
    safe = range_is_safe((w64.abs() * head_norm).sum(-1), head_norm.amax(-1), max_key)
    n_visible = visible.sum(-1)
    dense_cheaper = torch.full_like(safe, config.path == "dense")

    routes: dict[str, torch.Tensor] = {}
    taken = torch.zeros_like(safe)
    for name, failed in (
        ("nonfinite", nonfinite),
        ("numeric_range", ~safe),
        ("topk_ge_visible", n_visible <= inputs.kk),
        ("dense_cheaper", dense_cheaper),
    ):
        routes[name] = failed & ~taken
        taken |= failed
    is_anchor = (torch.arange(S, device=q.device) % config.anchor_stride == 0).expand(B, S) & witnesses
    routes["anchor"] = is_anchor & ~taken
    routes["certified"] = ~is_anchor & ~taken
    return routes


def _key_norms(k: torch.Tensor) -> torch.Tensor:
    """Upper bounds of the key norms [B,T] float64 (``rounding.key_norm_up``); a non-finite key
    counts as zero here: it is either hidden (never screened) or sends its queries to "nonfinite"."""
    return key_norm_up(torch.where(torch.isfinite(k).all(-1, keepdim=True), k, 0.0))


def _dense_rows(inputs, rows, values, indices) -> None:
    """Answer the [B,S] bool ``rows`` by dense scoring, in place."""
    b_idx, s_idx = rows.nonzero(as_tuple=True)
    if b_idx.numel():
        v, i = select_topk(masked_scores(inputs, b_idx, s_idx), inputs.visible[b_idx, s_idx], inputs.kk)
        values[b_idx, s_idx] = v
        indices[b_idx, s_idx] = i


def _with_bias(inputs, scores, b_idx, s_idx, key_idx):
    """scores [N,L] + bias at (row, key) when an additive mask is given (float32 add)."""
    if inputs.bias is None:
        return scores
    return scores + inputs.bias[b_idx[:, None], s_idx[:, None], key_idx]


def certified_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    topk: int,
    mask: torch.Tensor | None = None,
    *,
    key_scale: torch.Tensor | None = None,
    config: CertifiedTopkConfig | None = None,
    stats: TopkStats | None = None,
    shared_bound: SharedBound | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-K of the DSA indexer scores, identical to ``dense_topk`` (module docstring).

    Inputs as in ``check_indexer_inputs`` (``key_scale``: FP8 inputs, SPEC A.10). Returns (values
    [B,S,kk] float32, indices [B,S,kk] int64), kk = min(topk, T). ``stats`` (optional) accumulates
    counters without host sync. ``shared_bound`` (optional) is called at most once (not when no
    query is certified); with it, rows may be short (module docstring, "Shared bound").
    """
    inputs = check_indexer_inputs(q, k, weights, topk, mask, key_scale)
    if config is None:
        config = CertifiedTopkConfig()
    if not isinstance(config, CertifiedTopkConfig):
        raise TypeError(f"config: expected a CertifiedTopkConfig or None, got {type(config).__name__}")
    if stats is not None and not isinstance(stats, TopkStats):
        raise TypeError(f"stats: expected a TopkStats or None, got {type(stats).__name__}")
    B, S, T, H, D = inputs.shape
    kk = inputs.kk
    if B * S == 0 or kk == 0:
        return select_topk(masked_scores(inputs), inputs.visible, kk)

    key_norm = _key_norms(inputs.k)
    witnesses = takes_witnesses(config.witnesses, sample_size(T, config.sample_keys), shared_bound is not None)
    routes = _route(inputs, config, key_norm, witnesses)
    values = torch.empty((B, S, kk), dtype=torch.float32, device=inputs.q.device)
    indices = torch.empty((B, S, kk), dtype=torch.int64, device=inputs.q.device)
    _dense_rows(inputs, ~routes["certified"], values, indices)
    counts = {name: routes[name].sum() for name in ROUTED_REASONS}
    counts["anchors"] = routes["anchor"].sum()
    counts["queries"] = torch.tensor(B * S, device=inputs.q.device)
    counts["keys_visible"] = inputs.visible.sum()
    if bool(routes["certified"].any()):
        counts.update(_certified_rows(inputs, config, routes["certified"], key_norm, values, indices,
                                      shared_bound, witnesses))
    if stats is not None:
        for name, count in counts.items():
            stats.add(name, count)
    return values, indices


def _certified_rows(inputs, config, certified, key_norm, values, indices, shared_bound,
                    with_witnesses) -> dict[str, torch.Tensor]:
    """Answer the certified rows in place (steps 3-7); returns their counters. ``with_witnesses``:
    the anchors' top keys (answered densely before) seed their groups."""
    B, S, T, H, D = inputs.shape
    kk = inputs.kk
    cb, cs = certified.nonzero(as_tuple=True)
    visible = inputs.visible[cb, cs]
    witnesses = (indices[cb, anchor_rows(S, config.anchor_stride, cb.device)[cs]] if with_witnesses
                 else torch.zeros((cb.numel(), 0), dtype=torch.int64, device=cb.device))
    preferred = None if inputs.bias is None else inputs.bias[cb, cs] >= SOFT_HIDDEN_BIAS
    seeds = seed_mask(visible, witnesses, kk, config.sink, config.window, preferred)
    q, w = inputs.q[cb, cs], inputs.weights[cb, cs]

    # Seeds: exact scores, tau, activation frequencies.
    seed_idx, seed_valid = _compact(seeds)
    seed_keys = seed_idx.clamp_max(T - 1)
    seed_dots = head_dots(q, inputs.k[cb[:, None], seed_keys])
    seed_scores = scaled_scores(inputs, weighted_relu_sum(w, seed_dots), cb, seed_keys)
    seed_scores = _with_bias(inputs, seed_scores, cb, cs, seed_keys)
    seed_scores = torch.where(seed_valid, seed_scores, float("-inf"))
    proven = seed_scores.topk(kk, dim=-1).values[:, -1]  # <= tau_K: b of the module docstring
    if shared_bound is not None:
        per_query = torch.full((B, S), float("-inf"), device=q.device)
        per_query[cb, cs] = proven
        proven = shared_bound(per_query)[cb, cs]
    tau = torch.maximum(proven, _own_threshold(inputs, config, cb, cs, visible, q, w))
    active = ((seed_dots > 0) & seed_valid[:, None, :]).sum(-1).to(torch.float64)
    p = active / seed_valid.sum(-1, keepdim=True)

    # Certificate and screen.
    r = default_r(w) if config.r is None else torch.full_like(cb, min(config.r, H))
    plan = plan_certificate(q, w, p, r)
    chunk = max(1, defaults.SCREEN_ELEMENTS // max(1, cb.numel() * (D + plan.rows.shape[-2] + 1)))
    passes = []
    for start in range(0, T, chunk):
        keys = slice(start, start + chunk)
        bound = evaluate_bound(plan, inputs.k[cb, keys], key_norm[cb, keys])
        if inputs.key_scale is not None:
            bound = scaled_bound_up(bound, inputs.key_scale[cb, keys])
        if inputs.bias is not None:
            bound = next_up(bound + inputs.bias[cb, cs, keys].to(torch.float64))
        passes.append(~(round_up_to_float32(bound) < tau[:, None]))  # prune only on strict <
    screened = visible & ~seeds
    survive = screened & torch.cat(passes, dim=-1)

    # Workspace: overflowing queries are answered densely over all visible keys.
    overflow = survive.sum(-1) > int(config.workspace_frac * T) + kk
    overflow_rows = torch.zeros_like(certified)
    overflow_rows[cb[overflow], cs[overflow]] = True
    _dense_rows(inputs, overflow_rows, values, indices)

    counts = {
        "overflow": overflow.sum(),
        "keys_seeded": seeds.sum(),
        "keys_screened": screened.sum(),
        "survivors": survive.sum(),
    }
    ok = ~overflow
    if not bool(ok.any()):
        return counts

    # Refine, second sieve; a query with fewer than kk keys >= tau is answered densely unless
    # tau is the shared bound (a short row).
    ob, os_, tau_ok = cb[ok], cs[ok], tau[ok]
    surv_idx, surv_valid = _compact(survive[ok])
    surv_keys = surv_idx.clamp_max(T - 1)
    surv_scores = exact_scores(q[ok], w[ok], inputs.k[ob[:, None], surv_keys])
    surv_scores = _with_bias(inputs, scaled_scores(inputs, surv_scores, ob, surv_keys), ob, os_, surv_keys)
    written = surv_valid & (surv_scores >= tau_ok[:, None])
    reached = written.sum(-1) + (seed_scores[ok] >= tau_ok[:, None]).sum(-1)
    missed = (reached < kk) & (tau_ok > proven[ok])
    miss_rows = torch.zeros_like(certified)
    miss_rows[ob[missed], os_[missed]] = True
    _dense_rows(inputs, miss_rows, values, indices)
    counts["threshold_miss"] = missed.sum()
    if not bool((~missed).any()):
        return counts

    # Final selection over seeds U C.
    hit = ~missed
    ob, os_, reached, ok = ob[hit], os_[hit], reached[hit], ok.nonzero().flatten()[hit]
    surv_idx, surv_keys, surv_scores, written = surv_idx[hit], surv_keys[hit], surv_scores[hit], written[hit]
    n_ok = ob.numel()
    cand_scores = torch.full((n_ok, T + 1), float("-inf"), device=q.device)
    cand_scores.scatter_(1, seed_idx[ok], seed_scores[ok])  # padding lands in column T
    cand_scores.scatter_(1, torch.where(written, surv_idx, T), surv_scores)
    cand = torch.zeros((n_ok, T + 1), dtype=torch.bool, device=q.device)
    cand = cand.scatter(1, surv_idx, written)[:, :T] | seeds[ok]
    cand_idx, cand_valid = _compact(cand)
    cand_values = torch.where(cand_valid, cand_scores.gather(1, cand_idx), float("-inf"))
    top_values, top_pos = select_topk(cand_values, cand_valid, kk)
    padding = torch.arange(kk, device=q.device) >= reached[:, None]  # short rows only
    values[ob, os_] = torch.where(padding, float("-inf"), top_values)
    indices[ob, os_] = torch.where(padding, -1, cand_idx.gather(1, top_pos))
    counts["written"] = written.sum()
    return counts


def _own_threshold(inputs, config, cb, cs, visible, q, w) -> torch.Tensor:
    """theta [N] float32 of the certified rows (``seeds.sample_rank``-th best score over their
    anchor group's strided key sample; -inf when the sample is off or too few sampled keys are
    visible). Scores by THE SCORER (+ bias), in row chunks."""
    B, S, T, H, D = inputs.shape
    M = sample_size(T, config.sample_keys)
    theta = torch.full(cb.shape, float("-inf"), device=cb.device)
    if M == 0:
        return theta
    keys = sample_keys(-(-S // config.anchor_stride), M, T, cb.device)[cs // config.anchor_stride]
    rank = sample_rank(inputs.kk, M, T, config.sample_sigmas)
    step = max(1, defaults.SCREEN_ELEMENTS // max(1, M * (H + D)))
    for start in range(0, cb.numel(), step):
        rows = slice(start, start + step)
        b, s, kr = cb[rows], cs[rows], keys[rows]
        scores = scaled_scores(inputs, exact_scores(q[rows], w[rows], inputs.k[b[:, None], kr]), b, kr)
        scores = _with_bias(inputs, scores, b, s, kr)
        scores = torch.where(visible[rows].gather(1, kr), scores, float("-inf"))
        kth = scores.topk(rank, dim=-1).values[:, -1]
        theta[rows] = torch.where(torch.isfinite(kth), kth, float("-inf"))
    return theta
