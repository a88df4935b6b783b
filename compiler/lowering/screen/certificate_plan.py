"""The certificate's plan in one Triton program per query: the GPU form of
``runtime.certificate.plan_certificate`` (SPEC A.3, C.2).

``plan_certificate_triton(q, w, p, r, r_max)`` takes what ``plan_certificate`` takes with an int
``r_max`` (q [..., H, D] float32 or narrower, finite; w [..., H]; p [..., H] in [0, 1]; r [...]
int64) and returns a ``KernelPlan``: the plan's rows, weights, aux row, paths and retained heads
as in ``CertificatePlan`` and, instead of its residual and margin, the per-query scalars they
follow from (``screen_operands`` evaluates them in its kernel). Float64, by the same formulas
summed in other orders; the margin of ``runtime.rounding.margin_coefficients`` covers any order
(SPEC C.8 item 3). Ties among heads of equal rank go to the lower index; a rank NaN (|w| = inf on
a zero head, a query the screen never prunes) counts as -inf. The retained heads come from one
comparison of every pair of heads (no loop over R_MAX: compiling does not grow with it)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from compiler.lowering import defaults
from compiler.autotune import interpreter_active
from compiler.lowering.host_ints import next_power_of_2

__all__ = ["KernelPlan", "plan_certificate_triton"]

_INF = tl.constexpr(float("inf"))


@triton.jit
def _q_chunk(q_ptr, base, heads, d, sqh, D, ok, HW: tl.constexpr):
    """q[heads, d] as float64 [len(heads), len(d)], zero where not ``ok`` [len(heads)] or d >= D, by
    way of float32 (exact for every q dtype). HW (compiled for the GPU): the float32 values pass an
    opaque move, so that the compiler does not carry the float64 matrix products' operand layout
    back into a 16-bit load (which Triton's sm_90 lowering rejects)."""
    x = tl.load(q_ptr + base + heads[:, None] * sqh + d[None, :], mask=ok[:, None] & (d < D)[None, :], other=0.0)
    x = x.to(tl.float32)
    if HW:
        x = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=False, pack=1)
    return x.to(tl.float64)


@triton.jit
def _plan_kernel(q_ptr, w_ptr, p_ptr, r_ptr, rows_ptr, rw_ptr, aux_ptr, scalars_ptr, gram_ptr, flags_ptr,
                 ret_ptr, H, D, sqn, sqh, R_MAX: tl.constexpr, RP: tl.constexpr,
                 HP: tl.constexpr, CD: tl.constexpr, STAGES: tl.constexpr, HW: tl.constexpr):
    """Query n: rows [n, R_MAX, D], row_weights [n, R_MAX], aux [n, D], scalars [n, 5] =
    (||sum_h u_h||^2, mass_scores, weight_sum, sum_j |w~_j| ||q_j|| + ||aux||, projected mass),
    gram [n] = sum_{h,l} |u_h . u_l|, flags [n] = abs path, retained [n, H] (runtime.certificate for
    the formulas). Three passes over q's columns, CD at a time (their loads pipelined over STAGES),
    so that no [H, D] float64 tile is ever held: norms; retained rows, aux and the dots [H, R_MAX]
    (float64 matrix products); u and its Gram matrix (the same)."""
    n = tl.program_id(0).to(tl.int64)
    base = n * sqn
    h = tl.arange(0, HP)
    c = tl.arange(0, CD)
    slot = tl.arange(0, RP)
    hok = h < H
    w = tl.load(w_ptr + n * H + h, mask=hok, other=0.0).to(tl.float64)
    p = tl.load(p_ptr + n * H + h, mask=hok, other=0.0).to(tl.float64)
    r = tl.minimum(tl.maximum(tl.load(r_ptr + n), 1), R_MAX)
    positive = w > 0
    negative = w < 0
    zero = tl.sum(tl.zeros([1], dtype=tl.float64), axis=0)

    square = tl.zeros([HP], dtype=tl.float64)
    for d0 in tl.range(0, D, CD, num_stages=STAGES):
        qc = _q_chunk(q_ptr, base, h, d0 + c, sqh, D, hok, HW)
        square += tl.sum(qc * qc, axis=1)
    head_mass = tl.abs(w) * tl.sqrt(square)
    abs_path = tl.sum(positive.to(tl.int32), axis=0) <= r
    abs_rank = tl.where(positive, _INF, tl.where(negative, head_mass * tl.minimum(p, 1.0 - p), -_INF))
    rank = tl.where(abs_path, abs_rank, tl.where(positive, head_mass, -_INF))

    # The retained heads: each head's place in the order of rank (larger first, the lower index
    # first on ties) from one comparison of every pair of heads; the first min(r, ranked heads)
    # are retained (a rank NaN counts as -inf: never retained), slot i holds the head in place i.
    rank = tl.where(rank == rank, rank, -_INF)
    ranked = hok & (rank > -_INF)
    picks = tl.minimum(r, tl.sum(ranked.to(tl.int32), axis=0))
    ahead = (rank[None, :] > rank[:, None]) | ((rank[None, :] == rank[:, None]) & (h[None, :] < h[:, None]))
    place = tl.sum((ahead & hok[None, :]).to(tl.int32), axis=1)
    retained = ranked & (place < picks)
    heads = tl.sum(tl.where(hok[:, None] & (place[:, None] == slot[None, :]), h[:, None], 0), axis=0)
    valid = slot < picks
    w_rows = tl.load(w_ptr + n * H + heads, mask=valid, other=0.0).to(tl.float64)
    half_rows = 0.5 * w_rows
    active = negative & ~retained & (p >= 0.5)
    a_weight = tl.where(active, -w, 0.0)

    # Rows (stored), their norms, aux = a_A (joint) or V (abs, stored), and the dots q_h . row_i
    # [HP, RP] as float64 matrix products of the same columns.
    row_square = tl.zeros([RP], dtype=tl.float64)
    aux_square = zero
    dots = tl.zeros([HP, RP], dtype=tl.float64)
    sok = slot < R_MAX
    for d0 in tl.range(0, D, CD, num_stages=STAGES):
        dc = d0 + c
        qc = _q_chunk(q_ptr, base, h, dc, sqh, D, hok, HW)
        rc = _q_chunk(q_ptr, base, heads, dc, sqh, D, valid, HW)
        tl.store(rows_ptr + n * R_MAX * D + slot[:, None] * D + dc[None, :], rc, mask=sok[:, None] & (dc < D)[None, :])
        row_square += tl.sum(rc * rc, axis=1)
        a_c = tl.sum(a_weight[:, None] * qc, axis=0)
        aux_c = tl.where(abs_path, a_c - tl.sum(half_rows[:, None] * rc, axis=0), a_c)
        tl.store(aux_ptr + n * D + dc, aux_c, mask=dc < D)
        aux_square += tl.sum(aux_c * aux_c, axis=0)
        dots += tl.dot(qc, tl.trans(rc))
    row_norm = tl.sqrt(row_square)

    # Joint path: each omitted positive head's best retained anchor, the first slot of the largest
    # max(dot, 0) / norm (an invalid slot counts -1).
    omitted_positive = positive & ~retained
    ratio = tl.where((row_norm > 0)[None, :], tl.maximum(dots, 0.0) / tl.where(row_norm > 0, row_norm, 1.0)[None, :],
                     0.0)
    ratio = tl.where(valid[None, :], ratio, -1.0)
    ratio = tl.where(sok[None, :], ratio, -_INF)
    best = tl.max(ratio, axis=1)
    anchor_slot = tl.min(tl.where(ratio == best[:, None], slot[None, :], RP), axis=1)
    pick = slot[None, :] == anchor_slot[:, None]
    anchor_head = tl.sum(tl.where(pick, heads[None, :], 0), axis=1)
    anchor_valid = tl.sum(tl.where(pick & valid[None, :], 1, 0), axis=1) > 0
    anchor_norm = tl.sum(tl.where(pick, row_norm[None, :], 0.0), axis=1)
    anchor_dot = tl.sum(tl.where(pick, dots, 0.0), axis=1)
    beta = tl.where(omitted_positive & (anchor_norm > 0),
                    tl.maximum(anchor_dot, 0.0) / tl.where(anchor_norm > 0, anchor_norm * anchor_norm, 1.0),
                    0.0)
    folded = tl.sum(tl.where(pick, (w * beta)[:, None], 0.0), axis=0)

    # u_h = w_h (q_h - beta_h q_anchor) on omitted positive heads: the squared norm of sum_h u_h,
    # and the Gram matrix [HP, HP] of the u_h as float64 matrix products, then sum_{h,l} |u_h . u_l|.
    u_square = zero
    gram = tl.zeros([HP, HP], dtype=tl.float64)
    for d0 in tl.range(0, D, CD, num_stages=STAGES):
        dc = d0 + c
        qc = _q_chunk(q_ptr, base, h, dc, sqh, D, hok, HW)
        ac = _q_chunk(q_ptr, base, anchor_head, dc, sqh, D, anchor_valid, HW)
        uc = tl.where(omitted_positive[:, None], w[:, None] * (qc - beta[:, None] * ac), 0.0)
        gram += tl.dot(uc, tl.trans(uc))
        col = tl.sum(uc, axis=0)
        u_square += tl.sum(col * col, axis=0)
    gram_sum = tl.sum(tl.sum(tl.abs(gram), axis=1), axis=0)
    projected_mass = tl.where(abs_path, 0.0, tl.sum(w * beta * anchor_norm, axis=0))
    row_weights = tl.where(abs_path, half_rows, w_rows + folded)
    mass_scores = tl.sum(head_mass, axis=0)
    bound_rows = tl.sum(tl.abs(row_weights) * row_norm, axis=0) + tl.sqrt(aux_square)

    tl.store(rw_ptr + n * R_MAX + slot, row_weights, mask=sok)
    field = tl.arange(0, 8)
    scalars = tl.where(field == 0, u_square, tl.where(field == 1, mass_scores, tl.where(
        field == 2, tl.sum(tl.abs(w), axis=0), tl.where(field == 3, bound_rows, projected_mass))))
    tl.store(scalars_ptr + n * 5 + field, scalars, mask=field < 5)
    tl.store(gram_ptr + n + tl.arange(0, 1), tl.zeros([1], dtype=tl.float64) + gram_sum)
    tl.store(flags_ptr + n + tl.arange(0, 1), tl.zeros([1], dtype=tl.int8) + abs_path.to(tl.int8))
    tl.store(ret_ptr + n * H + h, retained.to(tl.int8), mask=hok)


@dataclass
class KernelPlan:
    """The plan kernel's outputs for queries ``...`` (N of them), float64 unless said.

    rows [..., R, D], row_weights [..., R], aux [..., D], abs_path [...] bool, retained [..., H] bool:
    as in ``runtime.certificate.CertificatePlan``. scalars [N, 5] per query: (||sum_h u_h||^2, M_s,
    W, M_rows, B_P) with M_rows = sum_j |w~_j| ||q_j|| + ||aux|| (the norm mass of U before E);
    gram [N]: sum_{h,l} |u_h . u_l|. The plan's E is 0 on the abs path, else
    0.5 (sqrt(scalars[0]) + sqrt(gram)); its margin is ``margin_coefficients(M_s, W, M_rows + E,
    (M_s + B_P) + E)`` (``screen_operands`` evaluates both)."""

    rows: torch.Tensor
    row_weights: torch.Tensor
    aux: torch.Tensor
    abs_path: torch.Tensor
    retained: torch.Tensor
    scalars: torch.Tensor
    gram: torch.Tensor


def plan_certificate_triton(q: torch.Tensor, w: torch.Tensor, p: torch.Tensor, r: torch.Tensor,
                            r_max: int) -> KernelPlan:
    """The plan of ``plan_certificate(q, w, p, r, r_max)`` by ``_plan_kernel``, one launch (module
    docstring): q [..., H, D], w and p [..., H] (any float dtype: the kernel
    converts them to float64 exactly), r [...] int64 (clipped to [1, r_max]), r_max an int in [1, H];
    no host synchronisation."""
    *lead, H, D = q.shape
    if isinstance(r_max, bool) or not isinstance(r_max, int) or not 1 <= r_max <= H:
        raise ValueError(f"r_max: expected an int in [1, H={H}], got {r_max!r}")
    if tuple(w.shape) != (*lead, H) or tuple(p.shape) != (*lead, H) or tuple(r.shape) != tuple(lead):
        raise ValueError(f"w, p: expected [{', '.join(map(str, (*lead, H)))}] and r "
                         f"[{', '.join(map(str, lead))}], got {tuple(w.shape)}, {tuple(p.shape)}, {tuple(r.shape)}")
    N = q.numel() // (H * D) if H * D else 0
    dev = q.device
    qf = q.reshape(N, H, D)
    if qf.stride(-1) != 1:
        qf = qf.contiguous()
    wf = w.reshape(N, H).contiguous()
    pf = p.reshape(N, H).contiguous()
    rf = r.reshape(N).to(torch.int64).contiguous()
    rows = torch.empty((N, r_max, D), dtype=torch.float64, device=dev)
    row_weights = torch.empty((N, r_max), dtype=torch.float64, device=dev)
    aux = torch.empty((N, D), dtype=torch.float64, device=dev)
    scalars = torch.empty((N, 5), dtype=torch.float64, device=dev)
    gram = torch.empty(N, dtype=torch.float64, device=dev)
    flags = torch.empty(N, dtype=torch.int8, device=dev)
    retained = torch.empty((N, H), dtype=torch.int8, device=dev)
    rp, hp = max(2, next_power_of_2(r_max)), max(2, next_power_of_2(H))
    if N:
        _plan_kernel[(N,)](qf, wf, pf, rf, rows, row_weights, aux, scalars, gram, flags, retained, H, D,
                           qf.stride(0), qf.stride(1), R_MAX=r_max,
                           RP=rp, HP=hp, CD=defaults.PLAN_COLUMNS, STAGES=defaults.PLAN_STAGES, HW=not interpreter_active(),
                           num_warps=defaults.PLAN_WARPS)
    return KernelPlan(
        rows=rows.view(*lead, r_max, D),
        row_weights=row_weights.view(*lead, r_max),
        aux=aux.view(*lead, D),
        abs_path=flags.view(torch.bool).view(lead),  # 0 or 1: a view, no conversion
        retained=retained.view(torch.bool).view(*lead, H),
        scalars=scalars,
        gram=gram,
    )
