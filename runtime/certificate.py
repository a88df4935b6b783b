"""Per-query planning and evaluation of the certificate U_num(k) >= THE SCORER (SPEC A.3, A.4).

``plan_certificate(q, w, p, r, r_max=None)``: q [..., H, D] float32 or narrower, w [..., H], p
[..., H] the heads' activation frequencies (they steer choices, never soundness), r [...] int64
budgets; returns a float64 ``CertificatePlan``: the abs path when all positive heads fit in r, else
the joint path with the residual E (SPEC A.3), plus the rounding margin's coefficients
(``runtime.rounding``, SPEC C.8). ``evaluate_bound(plan, k, key_norm)`` gives U_num [..., T]
float64 with U_num >= the float32 score THE SCORER computes, for every key. ``default_r(w)``: the
runtime's budget rule, |H+| rounded up to a multiple of 4. Both forms cost r + 2 screening dots
per key (r rows, one aggregate row, the key norm)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.rounding import margin_coefficients, next_up

__all__ = ["CertificatePlan", "default_r", "plan_certificate", "evaluate_bound"]


@dataclass(frozen=True)
class CertificatePlan:
    """Per-query certificate, float64, leading dimensions ``...`` of the planned queries.

    rows [..., r, D] retained heads q_j (zero rows pad queries whose R is smaller);
    row_weights [..., r]: w~_j (joint path) or w_j / 2 (abs path); aux [..., D]: a_A or V;
    residual [...]: E (0 on the abs path); abs_path [...] bool; retained [..., H] bool;
    slope, offset [...]: the rounding margin = slope * ||k||_up + offset;
    mass [...]: sum_h |w_h| ||q_h|| (the scores' absolute mass, which GPU margins scale with).
    """

    rows: torch.Tensor
    row_weights: torch.Tensor
    aux: torch.Tensor
    residual: torch.Tensor
    abs_path: torch.Tensor
    retained: torch.Tensor
    slope: torch.Tensor
    offset: torch.Tensor
    mass: torch.Tensor


def default_r(weights: torch.Tensor) -> torch.Tensor:
    """Default retained budget per query: |H+| rounded up to a multiple of 4, clipped to [1, H].

    weights [..., H] -> int64 [...].
    """
    H = weights.shape[-1]
    positives = (weights > 0).sum(-1)
    return (((positives + 3) // 4) * 4).clamp(1, H)


def _norm(x: torch.Tensor) -> torch.Tensor:
    """Euclidean norm over the last dimension (one reduction, no squared copy of x)."""
    return torch.linalg.vector_norm(x, dim=-1)


def plan_certificate(
    q: torch.Tensor, w: torch.Tensor, p: torch.Tensor, r: torch.Tensor, r_max: int | None = None
) -> CertificatePlan:
    """Plan the certificate of each query.

    q [..., H, D] float32 or narrower (finite; converted to float64 exactly), w [..., H] float32 (finite), p [..., H] activation
    frequencies in [0, 1], r [...] int64 retained budgets (clipped to [1, H]). Returns a plan
    with r_max rows per query (rows past a query's r are zero). ``r_max``: None reads max(r)
    (one host synchronisation); an int must bound every r (the budgets are clipped to it) and
    keeps the call free of host synchronisation. A larger r_max only widens the margin.
    """
    H, D = q.shape[-2], q.shape[-1]
    q64, w64, p64 = q.to(torch.float64), w.to(torch.float64), p.to(torch.float64)
    if r_max is None:
        r = r.clamp(1, H)
        r_max = int(r.max()) if r.numel() else 1
    else:
        if isinstance(r_max, bool) or not isinstance(r_max, int) or not 1 <= r_max <= H:
            raise ValueError(f"r_max: expected None or an int in [1, H={H}], got {r_max!r}")
        r = r.clamp(1, r_max)
    positive, negative = w64 > 0, w64 < 0
    head_norm = _norm(q64)
    head_mass = w64.abs() * head_norm
    abs_path = positive.sum(-1) <= r

    neg_inf = torch.full((), float("-inf"), dtype=torch.float64, device=q.device)
    inf = torch.full((), float("inf"), dtype=torch.float64, device=q.device)
    abs_rank = torch.where(
        positive, inf, torch.where(negative, head_mass * torch.minimum(p64, 1.0 - p64), neg_inf)
    )
    joint_rank = torch.where(positive, head_mass, neg_inf)
    rank = torch.where(abs_path[..., None], abs_rank, joint_rank)
    top = torch.topk(rank, r_max, dim=-1)
    slot = torch.arange(r_max, device=q.device)
    slot_valid = (slot < r[..., None]) & (top.values > float("-inf"))
    retained = torch.zeros_like(positive).scatter(-1, top.indices, slot_valid)

    rows = torch.where(
        slot_valid[..., None], q64.gather(-2, top.indices[..., None].expand(*top.indices.shape, D)), 0.0
    )
    w_rows = torch.where(slot_valid, w64.gather(-1, top.indices), 0.0)
    row_norm = _norm(rows)

    omitted_negative = negative & ~retained
    active = omitted_negative & (p64 >= 0.5)
    a_support = (torch.where(active, -w64, 0.0)[..., None, :] @ q64).squeeze(-2)

    # Joint path: project each omitted positive head onto its best retained anchor.
    omitted_positive = positive & ~retained
    dots = q64 @ rows.transpose(-1, -2)  # [..., H, r_max]
    safe_norm = torch.where(row_norm > 0, row_norm, 1.0)
    ratio = torch.where(row_norm[..., None, :] > 0, torch.relu(dots) / safe_norm[..., None, :], 0.0)
    ratio = torch.where(slot_valid[..., None, :], ratio, -1.0)
    anchor = ratio.argmax(-1)  # [..., H]
    anchor_norm = row_norm.gather(-1, anchor)
    anchor_dot = dots.gather(-1, anchor[..., None]).squeeze(-1)
    beta = torch.where(
        omitted_positive & (anchor_norm > 0),
        torch.relu(anchor_dot) / torch.where(anchor_norm > 0, anchor_norm * anchor_norm, 1.0),
        0.0,
    )
    anchor_rows = rows.gather(-2, anchor[..., None].expand(*anchor.shape, D))
    residual_dirs = q64 - beta[..., None] * anchor_rows
    u = torch.where(omitted_positive[..., None], w64[..., None] * residual_dirs, 0.0)
    gram = (u @ u.transpose(-1, -2)).abs().sum((-1, -2))
    joint_residual = 0.5 * (_norm(u.sum(-2)) + torch.sqrt(gram))
    folded = torch.zeros_like(w_rows).scatter_add(-1, anchor, w64 * beta)
    projected_mass = (w64 * beta * anchor_norm).sum(-1)

    half_rows = 0.5 * w_rows
    v_aux = a_support - (half_rows[..., None] * rows).sum(-2)
    row_weights = torch.where(abs_path[..., None], half_rows, w_rows + folded)
    aux = torch.where(abs_path[..., None], v_aux, a_support)
    residual = torch.where(abs_path, 0.0, joint_residual)
    projected_mass = torch.where(abs_path, 0.0, projected_mass)

    mass_scores = head_mass.sum(-1)
    mass_bound = (row_weights.abs() * row_norm).sum(-1) + residual + _norm(aux)
    slope, offset = margin_coefficients(
        mass_scores,
        w64.abs().sum(-1),
        mass_bound,
        mass_scores + projected_mass + residual,
        D=D,
        H=H,
        r=r_max,
    )
    return CertificatePlan(
        rows=rows,
        row_weights=row_weights,
        aux=aux,
        residual=residual,
        abs_path=abs_path,
        retained=retained,
        slope=slope,
        offset=offset,
        mass=mass_scores,
    )


def evaluate_bound(
    plan: CertificatePlan, keys: torch.Tensor, key_norm: torch.Tensor
) -> torch.Tensor:
    """U_num for every (query, key): float64 [..., M], >= the float32 score of THE SCORER.

    keys [..., M, D] float32 and key_norm [..., M] float64 (``rounding.key_norm_up``) broadcast
    against the plan's leading dimensions.
    """
    k64 = keys.to(torch.float64)
    x = torch.cat((plan.rows, plan.aux[..., None, :]), dim=-2) @ k64.transpose(-1, -2)
    head_dots, aux_dot = x[..., :-1, :], x[..., -1, :]  # [..., r, M], [..., M]
    abs_path = plan.abs_path[..., None]
    head_part = torch.where(abs_path[..., None], head_dots.abs(), torch.relu(head_dots))
    head_sum = (plan.row_weights[..., None] * head_part).sum(-2)
    aux_part = torch.where(abs_path, aux_dot, torch.relu(aux_dot))
    bound = head_sum + plan.residual[..., None] * key_norm - aux_part
    margin = plan.slope[..., None] * key_norm + plan.offset[..., None]
    return next_up(bound + margin)
