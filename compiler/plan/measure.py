"""Per-layer calibration measurements for plans, and the layer's plan from them.

``measure_layer(layer, calls, candidates, timed)``: on the device the calls were captured on, per
candidate budget r the certified top-K on every call (path "certified"): m(r) = survivors /
keys screened (1.0 when nothing was screened), the fraction of certified queries redone densely,
and, when ``timed``, the summed time of one run per call after a warm-up on CUDA; and the dense
time of the same calls. Every budget runs with the pipeline's default survivor lists; the
``LIST_BUDGETS`` best of them (fastest, or lowest m untimed) run again with lists of each size of
``list_sizes`` (``LIST_SIZES`` but the default's own size, on CUDA only); the best of all these
(its r and list size) runs again with anchor witnesses off and on (``WITNESSES``, on every device:
the plain-torch reference honours them too): at most ``len(candidates) + LIST_BUDGETS *
len(LIST_SIZES) + len(WITNESSES)`` measurements (``measurement_count``; 11 for the short list's 5
budgets), not one per (budget, size, witnesses). ``choose_from_measurement`` decides the layer
(``compiler.plan.choice``) and adds the chosen budget's diagnostics (SPEC A.6): the seed gap b = τ* − τ per certified query
and the slack δ = U_num − s per screened key, recomputed from the runtime's public stages for at
most ``DIAGNOSTIC_QUERIES`` queries per call."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from compiler.cost_model import KernelConstants
from compiler.ops.capture_topk import CapturedCall
from compiler.plan.choice import choose_layer
from compiler.plan.constants import best_seconds
from compiler.plan.schema import CandidateMeasurement, Distribution, LayerPlan
from compiler.topk_settings import TopkSettings
from runtime.certificate import default_r, evaluate_bound, plan_certificate
from runtime.certified_topk import ROUTED_REASONS, CertifiedTopkConfig, TopkStats, certified_topk
from runtime.dense_scorer import dense_topk, head_dots, weighted_relu_sum
from runtime.indexer_inputs import check_indexer_inputs
from runtime.rounding import key_norm_up
from runtime.seeds import anchor_rows, seed_mask

_ROW_ELEMENTS = 1 << 22  # bound on the [rows, H, T] intermediates of the diagnostics
LIST_SIZES = (1, 2)
"""Survivor-list sizes measured besides the default (the scorer tile's queries, 4 at H = 64): on the
trained indexers each of 1, 2 and 4 was the fastest on some layer (certified_trained_h100.md)."""
LIST_BUDGETS = 2
"""Best budgets re-measured with each of ``list_sizes``."""
WITNESSES = (False, True)
"""Witnesses settings the best candidate is measured with besides the runtime's default: the default
(``runtime.defaults.WITNESSES``) suits the indexer zoo's families, while on the trained indexers the
sample alone sets as tight a threshold for less seed time."""
DIAGNOSTIC_QUERIES = 64
"""Certified queries per call whose seed gap and slacks are computed (the distributions are summaries)."""


@dataclass(frozen=True)
class LayerMeasurement:
    """One layer's geometry, its candidates, the dense time (ms, None when not timed) and its calls."""

    layer: str
    heads: int
    head_dim: int
    topk: int
    candidates: tuple[CandidateMeasurement, ...]
    dense_ms: float | None
    calls: tuple[CapturedCall, ...]

    @property
    def call_sizes(self) -> list[tuple[int, int, int]]:
        """(batch, queries, keys) of every call."""
        return [(c.q.shape[0], c.q.shape[1], c.k.shape[1]) for c in self.calls]


def distribution(values: torch.Tensor) -> Distribution | None:
    """Count, mean, min, max and 5/50/95 % quantiles (linear interpolation between order statistics,
    as ``torch.quantile``, without its size limit) of a float sample (None when empty)."""
    v = values.detach().double().flatten().sort().values
    n = v.numel()
    if n == 0:
        return None

    def quantile(p: float) -> float:
        pos = p * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return float(v[lo] + (v[hi] - v[lo]) * (pos - lo))

    return Distribution(count=n, mean=float(v.mean()), min=float(v[0]), max=float(v[-1]),
                        p05=quantile(0.05), p50=quantile(0.5), p95=quantile(0.95))


def _certified_run(call: CapturedCall, config: CertifiedTopkConfig, stats: TopkStats) -> None:
    if call.q.device.type == "cuda":
        from compiler.lowering.topk_pipeline import certified_topk_cuda

        certified_topk_cuda(call.q, call.k, call.weights, call.topk, call.mask, config=config, stats=stats)
    else:
        certified_topk(call.q, call.k, call.weights, call.topk, call.mask, config=config, stats=stats)


def _dense_run(call: CapturedCall) -> None:
    if call.q.device.type == "cuda":
        from compiler.lowering.topk_pipeline import dense_topk_cuda

        dense_topk_cuda(call.q, call.k, call.weights, call.topk, call.mask)
    else:
        dense_topk(call.q, call.k, call.weights, call.topk, call.mask)


def _seconds(fn: Callable[[], object], device: torch.device) -> float:
    """One timed run (after a warm-up run on CUDA, which compiles kernels and tunes the screen)."""
    return best_seconds(fn, device, repeats=1, warmup=device.type == "cuda")


def measure_candidate(calls: Sequence[CapturedCall], r: int, timed: bool = True,
                      on_call: Callable[[], None] | None = None, list_queries: int | None = None,
                      witnesses: bool | None = None) -> CandidateMeasurement:
    """m(r), the redo fraction, counts and (``timed``) the summed call time of budget r over the
    calls, with survivor lists of ``list_queries`` queries (None: the pipeline's default) and anchor
    ``witnesses`` (None: the runtime's default)."""
    config = TopkSettings("certified", r, list_queries=list_queries, witnesses=witnesses).runtime_config("certified")
    total, ms = TopkStats(), 0.0
    for call in calls:
        last = []  # the statistics of the last run (the timed one, after the warm-up)

        def run(call=call):
            last[:] = [TopkStats()]
            _certified_run(call, config, last[0])

        if timed:
            ms += 1e3 * _seconds(run, call.q.device)
        else:
            run()
        total.merge(last[0])
        if on_call is not None:
            on_call()
    s = total.summary()
    screened, survivors = int(s["keys_screened"]), int(s["survivors"])
    certified = s["queries"] - s["anchors"] - sum(s["fallbacks"][name] for name in ROUTED_REASONS)
    redone = s["fallbacks"]["overflow"] + s["fallbacks"]["threshold_miss"]
    return CandidateMeasurement(r=r, survival=survivors / screened if screened else 1.0,
                                redo_frac=redone / certified if certified > 0 else 0.0,
                                ms=ms if timed else None, queries=int(s["queries"]),
                                certified_queries=max(0, int(certified)), keys_screened=screened,
                                survivors=survivors, fallbacks={k: int(v) for k, v in s["fallbacks"].items()},
                                list_queries=list_queries, witnesses=witnesses)


def measure_dense(calls: Sequence[CapturedCall]) -> float:
    """Summed dense call time (ms) over the calls."""
    return sum(1e3 * _seconds(lambda call=call: _dense_run(call), call.q.device) for call in calls)


def list_sizes(calls: Sequence[CapturedCall]) -> tuple[int, ...]:
    """The survivor-list sizes measured besides the default: ``LIST_SIZES`` but the size the default
    takes for these calls, on CUDA; none elsewhere (the plain-torch reference screens each query
    alone, so a size would measure the default again)."""
    if not calls or calls[0].q.device.type != "cuda":
        return ()
    from compiler.lowering.topk_pipeline import refine_queries

    default = refine_queries(calls[0].q.shape[2], CertifiedTopkConfig())
    return tuple(size for size in LIST_SIZES if size != default)


def measurement_count(budgets: int, calls: Sequence[CapturedCall]) -> int:
    """Candidate measurements ``measure_layer`` makes for ``budgets`` budgets on ``calls``."""
    return budgets + min(budgets, LIST_BUDGETS) * len(list_sizes(calls)) + min(budgets, 1) * len(WITNESSES)


def _fastest(measured: Sequence[CandidateMeasurement]) -> list[CandidateMeasurement]:
    """The measurements fastest first (lowest m first when untimed), the smaller r on a tie."""
    return sorted(measured, key=lambda c: (c.survival if c.ms is None else c.ms, c.r))


def measure_layer(layer: str, calls: Sequence[CapturedCall], candidates: Sequence[int], timed: bool = True,
                  on_call: Callable[[], None] | None = None) -> LayerMeasurement:
    """Every candidate budget with the default survivor lists, the ``LIST_BUDGETS`` best again with
    each of ``list_sizes``, the best of those with each of ``WITNESSES`` (module docstring), and
    (``timed``) the dense time on one layer's calls."""
    if not calls:
        raise ValueError(f"calls: layer {layer!r} has no captured call")
    _, _, heads, head_dim = calls[0].q.shape
    measured = [measure_candidate(calls, r, timed, on_call) for r in candidates]
    measured += [measure_candidate(calls, c.r, timed, on_call, size)
                 for c in _fastest(measured)[:LIST_BUDGETS] for size in list_sizes(calls)]
    measured += [measure_candidate(calls, c.r, timed, on_call, c.list_queries, witnesses)
                 for c in _fastest(measured)[:1] for witnesses in WITNESSES]
    return LayerMeasurement(layer=layer, heads=heads, head_dim=head_dim, topk=calls[0].topk,
                            candidates=tuple(measured), dense_ms=measure_dense(calls) if timed else None,
                            calls=tuple(calls))


def certificate_diagnostics(call: CapturedCall, config: CertifiedTopkConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Seed gaps b [queries] and slacks δ [screened keys] (float64) of one call under ``config``, over
    at most DIAGNOSTIC_QUERIES certified queries spread evenly over the call (the witness seeds'
    gap: the own-threshold sample is not included)."""
    inputs = check_indexer_inputs(call.q, call.k, call.weights, call.topk, call.mask)
    B, S, T, H, D = inputs.shape
    kk = inputs.kk
    anchors = anchor_rows(S, config.anchor_stride, inputs.q.device)
    device = inputs.q.device
    finite = torch.isfinite(inputs.q).all(-1).all(-1) & torch.isfinite(inputs.weights).all(-1)
    certified = (anchors != torch.arange(S, device=device))[None, :] & (inputs.visible.sum(-1) > kk) & finite
    cb, cs = certified.nonzero(as_tuple=True)
    if cb.numel() > DIAGNOSTIC_QUERIES:  # evenly spread over the call
        pick = torch.linspace(0, cb.numel() - 1, DIAGNOSTIC_QUERIES, device=device).long()
        cb, cs = cb[pick], cs[pick]
    first = torch.unique(anchors[cs])
    _, anchor_top = dense_topk(call.q[:, first], call.k, call.weights[:, first], call.topk,
                               None if call.mask is None else call.mask[:, first])
    witnesses = torch.zeros((B, S, anchor_top.shape[-1]), dtype=torch.int64, device=device)
    witnesses[:, first] = anchor_top
    key_norm = key_norm_up(inputs.k)
    gaps, slacks = [], []
    step = max(1, _ROW_ELEMENTS // max(1, H * max(T, D)))
    for start in range(0, cb.numel(), step):
        b, s = cb[start:start + step], cs[start:start + step]
        visible = inputs.visible[b, s]
        seeds = seed_mask(visible, witnesses[b, anchors[s]], kk, config.sink, config.window)
        q, w, keys = inputs.q[b, s], inputs.weights[b, s], inputs.k[b]
        dots = head_dots(q, keys)
        scores = weighted_relu_sum(w, dots)
        biased = scores if inputs.bias is None else scores + inputs.bias[b, s]
        tau_star = torch.where(visible, biased, float("-inf")).topk(kk, dim=-1).values[:, -1].double()
        tau = torch.where(seeds, biased, float("-inf")).topk(kk, dim=-1).values[:, -1].double()
        keep = torch.isfinite(tau_star)
        gaps.append((tau_star - tau)[keep])
        p = ((dots > 0) & seeds[:, None, :]).sum(-1).double() / seeds.sum(-1, keepdim=True)
        r = default_r(w) if config.r is None else torch.full_like(b, min(config.r, H))
        bound = evaluate_bound(plan_certificate(q, w, p, r), keys, key_norm[b])
        slacks.append((bound - scores.double())[visible & ~seeds & keep[:, None]])
    empty = torch.zeros(0, dtype=torch.float64, device=device)
    return (torch.cat(gaps) if gaps else empty), (torch.cat(slacks) if slacks else empty)


def seed_gap_and_slack(calls: Sequence[CapturedCall], r: int | None,
                       on_call: Callable[[], None] | None = None) -> tuple[Distribution | None, Distribution | None]:
    """Distributions of the seed gap b and the slack δ over the calls, with budget r (None: default rule)."""
    config = CertifiedTopkConfig(r=r, path="certified")
    gaps, slacks = [], []
    for call in calls:
        gap, slack = certificate_diagnostics(call, config)
        gaps.append(gap)
        slacks.append(slack)
        if on_call is not None:
            on_call()
    return distribution(torch.cat(gaps)), distribution(torch.cat(slacks))


def choose_from_measurement(measurement: LayerMeasurement, constants: KernelConstants, design_length: int,
                            queries: int | None, on_call: Callable[[], None] | None = None) -> LayerPlan:
    """The layer's decision (``compiler.plan.choice.choose_layer``), with the diagnostics of the
    chosen budget (or of the best-surviving one when the layer is dense)."""
    choice = choose_layer(measurement.candidates, measurement.dense_ms, measurement.call_sizes,
                          heads=measurement.heads, head_dim=measurement.head_dim, topk=measurement.topk,
                          constants=constants, design_length=design_length, queries=queries)
    best_measured = min(measurement.candidates, key=lambda c: (c.survival, c.r), default=None)
    r_diag = choice.settings.r if choice.settings.r is not None else (best_measured.r if best_measured else None)
    seed_gap, slack = seed_gap_and_slack(measurement.calls, r_diag, on_call)
    return LayerPlan(layer=measurement.layer, settings=choice.settings,
                     heads=measurement.heads, head_dim=measurement.head_dim, topk=measurement.topk,
                     predicted_pruned_frac=choice.predicted_pruned_frac,
                     predicted_speedup=choice.predicted_speedup, reason=choice.reason,
                     dense_ms=measurement.dense_ms, calibration_calls=tuple(measurement.call_sizes),
                     candidates=measurement.candidates, seed_gap=seed_gap, slack=slack)
