"""Per-layer calibration measurements for plans, and the cost model's choice from them.

For one indexer layer and its captured calls:

* m(r) for each candidate budget r: the runtime's certified top-K (``path="certified"``, every other
  setting at its default) runs on the captured inputs and m(r) = survivors / keys_screened from its
  ``TopkStats`` (1.0 when nothing was screened: no evidence that screening prunes);
* the seed gap b = τ* − τ ≥ 0 per certified query (true kk-th score minus the seed threshold) and the
  slack δ = U_num − s ≥ 0 per screened key, for the budget the cost model then chooses: a key is
  pruned iff Δ = τ* − s > δ + b (SPEC A.6). They are recomputed here from the runtime's public stages
  (seeds, certificate planning and evaluation, THE SCORER) for the queries the runtime certifies
  (not anchors, more than kk visible keys).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from compiler.cost_model import IndexerShape, KernelConstants, choose_layer
from compiler.plan_capture import CapturedCall
from compiler.plan_schema import CandidateMeasurement, Distribution, LayerPlan
from runtime.certificate import default_r, evaluate_bound, plan_certificate
from runtime.certified_topk import CertifiedTopkConfig, TopkStats, certified_topk
from runtime.dense_scorer import dense_topk, head_dots, weighted_relu_sum
from runtime.indexer_inputs import check_indexer_inputs
from runtime.rounding import key_norm_up
from runtime.seeds import anchor_rows, seed_mask

_ROW_ELEMENTS = 1 << 22  # bound on the [rows, H, T] intermediates of the diagnostics


@dataclass(frozen=True)
class LayerMeasurement:
    """One layer's geometry, its m(r) candidates and its captured calls (for the diagnostics)."""

    layer: str
    heads: int
    head_dim: int
    topk: int
    candidates: tuple[CandidateMeasurement, ...]
    calls: tuple[CapturedCall, ...]


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


def measure_survival(calls: Sequence[CapturedCall], r: int,
                     on_call: Callable[[], None] | None = None) -> CandidateMeasurement:
    """m(r) over every captured call, from the certified top-K's statistics."""
    config = CertifiedTopkConfig(r=r, path="certified")
    stats = TopkStats()
    for call in calls:
        certified_topk(call.q, call.k, call.weights, call.topk, call.mask, config=config, stats=stats)
        if on_call is not None:
            on_call()
    s = stats.summary()
    screened, survivors = int(s["keys_screened"]), int(s["survivors"])
    return CandidateMeasurement(r=r, survival=survivors / screened if screened else 1.0,
                                queries=int(s["queries"]), keys_screened=screened, survivors=survivors,
                                fallbacks={k: int(v) for k, v in s["fallbacks"].items()})


def measure_layer(layer: str, calls: Sequence[CapturedCall], candidates: Sequence[int],
                  on_call: Callable[[], None] | None = None) -> LayerMeasurement:
    """m(r) for every candidate budget on one layer's calls."""
    if not calls:
        raise ValueError(f"calls: layer {layer!r} has no captured call")
    _, _, heads, head_dim = calls[0].q.shape
    return LayerMeasurement(layer=layer, heads=heads, head_dim=head_dim, topk=calls[0].topk,
                            candidates=tuple(measure_survival(calls, r, on_call) for r in candidates),
                            calls=tuple(calls))


def certificate_diagnostics(call: CapturedCall, config: CertifiedTopkConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Seed gaps b [queries] and slacks δ [screened keys] (float64) of one call under ``config``."""
    inputs = check_indexer_inputs(call.q, call.k, call.weights, call.topk, call.mask)
    B, S, T, H, D = inputs.shape
    kk = inputs.kk
    anchors = anchor_rows(S, config.anchor_stride, inputs.q.device)
    device = inputs.q.device
    first = torch.arange(0, S, config.anchor_stride, device=device)
    _, witnesses = dense_topk(call.q[:, first], call.k, call.weights[:, first], call.topk,
                              None if call.mask is None else call.mask[:, first])
    finite = torch.isfinite(inputs.q).all(-1).all(-1) & torch.isfinite(inputs.weights).all(-1)
    certified = (anchors != torch.arange(S, device=device))[None, :] & (inputs.visible.sum(-1) > kk) & finite
    cb, cs = certified.nonzero(as_tuple=True)
    key_norm = key_norm_up(inputs.k)
    gaps, slacks = [], []
    step = max(1, _ROW_ELEMENTS // max(1, H * max(T, D)))
    for start in range(0, cb.numel(), step):
        b, s = cb[start:start + step], cs[start:start + step]
        visible = inputs.visible[b, s]
        seeds = seed_mask(visible, witnesses[b, anchors[s] // config.anchor_stride], kk, config.sink,
                          config.window)
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
    """The cost model's choice for the layer, with the diagnostics of the chosen budget."""
    shape = IndexerShape(heads=measurement.heads, head_dim=measurement.head_dim, topk=measurement.topk,
                         queries=queries)
    survival = {c.r: c.survival for c in measurement.candidates}
    choice = choose_layer(survival, shape, constants, design_length)
    best_measured = min(measurement.candidates, key=lambda c: (c.survival, c.r), default=None)
    r_diag = choice.r if choice.r is not None else (best_measured.r if best_measured else None)
    seed_gap, slack = seed_gap_and_slack(measurement.calls, r_diag, on_call)
    return LayerPlan(layer=measurement.layer, path=choice.path, r=choice.r, crossover=choice.crossover,
                     heads=measurement.heads, head_dim=measurement.head_dim, topk=measurement.topk,
                     predicted_pruned_frac=choice.predicted_pruned_frac,
                     predicted_speedup=choice.predicted_speedup, candidates=measurement.candidates,
                     seed_gap=seed_gap, slack=slack)
