"""The screen's operands from a certificate plan, one Triton program per query (SPEC C.2).

``screen_operands(plan, w, g_dtype, RP, margin, nk_max)`` turns a plan, float64 with rows [N, R, D]
(a ``runtime.certificate`` ``CertificatePlan``, or the ``KernelPlan`` of
``certificate_plan.plan_certificate_triton``, whose residual E, slope and offset this kernel
evaluates from the plan kernel's scalars by ``runtime.rounding.margin_coefficients``' float64
operations in their order, so bitwise as the torch form would), into what
``certificate_screen.screen`` reads: rows g [N, RP, D] in ``g_dtype`` (the R retained rows, the aux
row, zero rows), alpha and beta [N, RP] fp32 rounded outward, e and c [N] fp32 rounded up, and ok [N]
bool. With m_rho = max(|alpha|, |beta|), G = sum_rho m_rho ||g_rho|| and the rows' rounding error X
= sum_rho m_rho ||g_rho - g64_rho||, ``margin = (a, b, g_eval, f)`` (``topk_pipeline.screen_margin``)
gives
    e = (E + slope + X + a M_s + b G) / (1 - g_eval),   c = (offset + f (1 + W + sum_rho m_rho)) / (1 - g_eval)
(E, slope, offset and M_s the plan's, W = sum_h |w_h|), each float64 term multiplied by 1 + 2^-40
(any summation order is inside it). ok: every operand finite and (e + sum_rho |alpha| + |beta|)
max_k ||k||_up < 2^100 (``nk_max`` [B], the batch row of query n being n // (N / B)). One launch
instead of the float64 tensor algebra it replaces; float scalars are passed as float64 and the
kernel is compiled without fused multiply-adds, so that its float64 operations round as written.

``screen_threshold(ok, witness, theta, scales_ok)`` gives the screen's tau [B, S]: the larger of the
seeds' two thresholds where the query's operands are ok, that threshold finite and its batch row's
FP8 key scales usable, else -inf (no key pruned), in one launch."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiler.lowering import defaults
from compiler.lowering.outward_rounding import round_up_f32
from compiler.lowering.screen.certificate_plan import KernelPlan
from runtime.certificate import CertificatePlan
from runtime.rounding import margin_constants
from compiler.lowering.host_ints import cdiv, next_power_of_2

__all__ = ["screen_operands", "screen_threshold", "REACH_LIMIT"]

REACH_LIMIT = 2.0**100
"""Largest value of (e + sum_rho |alpha| + |beta|) max_k ||k||_up for which a query is screened: the
screen's fp32 sums then stay far from overflow."""
_REACH = tl.constexpr(REACH_LIMIT)
_SLACK = tl.constexpr(1.0 + 2.0**-40)


@triton.jit
def _finite(x):
    return (x == x) & (tl.abs(x) < float("inf"))


@triton.jit
def _plan_terms(terms_ptr, gram_ptr, abs_path, n, nok, c_s, c_u, c_plan, floor, c_w, KERNEL_PLAN: tl.constexpr):
    """(E, slope, offset, M_s) float64 [QB] of queries n: read from terms [N, 4] (a CertificatePlan's
    residual, slope, offset, mass), or with KERNEL_PLAN evaluated from a KernelPlan's scalars
    terms [N, 5] and gram [N] by the torch form's operations in its order (tl.sqrt on float64 is
    sqrt.rn.f64, correctly rounded as torch's)."""
    if KERNEL_PLAN:
        u_square = tl.load(terms_ptr + n * 5, mask=nok, other=0.0)
        mass = tl.load(terms_ptr + n * 5 + 1, mask=nok, other=0.0)
        weight_sum = tl.load(terms_ptr + n * 5 + 2, mask=nok, other=0.0)
        bound_rows = tl.load(terms_ptr + n * 5 + 3, mask=nok, other=0.0)
        projected = tl.load(terms_ptr + n * 5 + 4, mask=nok, other=0.0)
        gram = tl.load(gram_ptr + n, mask=nok, other=0.0)
        residual = tl.where(abs_path, 0.0, 0.5 * (tl.sqrt(u_square) + tl.sqrt(gram)))
        slope = c_s * mass + c_u * (bound_rows + residual) + c_plan * (mass + projected + residual) + floor
        offset = c_w * (1.0 + weight_sum)
    else:
        residual = tl.load(terms_ptr + n * 4, mask=nok, other=0.0)
        slope = tl.load(terms_ptr + n * 4 + 1, mask=nok, other=0.0)
        offset = tl.load(terms_ptr + n * 4 + 2, mask=nok, other=0.0)
        mass = tl.load(terms_ptr + n * 4 + 3, mask=nok, other=0.0)
    return residual, slope, offset, mass


@triton.jit
def _operands_kernel(rows_ptr, rw_ptr, aux_ptr, abs_ptr, terms_ptr, gram_ptr, w_ptr, nkmax_ptr, g_ptr, alpha_ptr,
                     beta_ptr, e_ptr, c_ptr, ok_ptr, N, H, D, per_batch, coef_mass: tl.float64,
                     coef_rows: tl.float64, g_eval: tl.float64, ftz: tl.float64, c_s: tl.float64,
                     c_u: tl.float64, c_plan: tl.float64, floor: tl.float64, c_w: tl.float64,
                     R: tl.constexpr, RP: tl.constexpr, DP: tl.constexpr, HP: tl.constexpr, QB: tl.constexpr,
                     KERNEL_PLAN: tl.constexpr):
    """Queries pid * QB ..: tiles [QB, RP, DP] of rows, [QB, RP] of coefficients."""
    n = tl.program_id(0).to(tl.int64) * QB + tl.arange(0, QB)
    nok = n < N
    slot = tl.arange(0, RP)
    d = tl.arange(0, DP)
    dok = d < D
    is_row = slot < R
    is_aux = slot == R
    at = n[:, None, None] * R * D + slot[None, :, None] * D + d[None, None, :]
    rows = tl.load(rows_ptr + at, mask=nok[:, None, None] & is_row[None, :, None] & dok[None, None, :], other=0.0)
    aux = tl.load(aux_ptr + n[:, None] * D + d[None, :], mask=nok[:, None] & dok[None, :], other=0.0)
    g64 = tl.where(is_aux[None, :, None], aux[:, None, :], rows)
    abs_path = tl.load(abs_ptr + n, mask=nok, other=0) != 0
    rw = tl.load(rw_ptr + n[:, None] * R + slot[None, :], mask=nok[:, None] & is_row[None, :], other=0.0)
    alpha64 = tl.where(is_aux[None, :], -1.0, rw)
    beta64 = tl.where(abs_path[:, None], tl.where(is_aux[None, :], -1.0, -rw), 0.0)
    alpha = round_up_f32(alpha64)
    beta = -round_up_f32(-beta64)
    g = g64.to(tl.float32).to(g_ptr.dtype.element_ty)
    back = g.to(tl.float32).to(tl.float64)
    m = tl.maximum(tl.abs(alpha), tl.abs(beta)).to(tl.float64)
    row_mass = tl.sum(m * tl.sqrt(tl.sum(back * back, axis=2)), axis=1)
    diff = back - g64
    rows_err = tl.sum(m * tl.sqrt(tl.sum(diff * diff, axis=2)), axis=1) * _SLACK
    h = tl.arange(0, HP)
    w = tl.load(w_ptr + n[:, None] * H + h[None, :], mask=nok[:, None] & (h < H)[None, :], other=0.0)
    W = tl.sum(tl.abs(w.to(tl.float64)), axis=1)
    residual, plan_slope, offset, mass = _plan_terms(terms_ptr, gram_ptr, abs_path, n, nok, c_s, c_u, c_plan, floor,
                                                     c_w, KERNEL_PLAN)
    slope = coef_mass * mass + coef_rows * row_mass
    e64 = (residual + plan_slope + rows_err + slope) / (1.0 - g_eval) * _SLACK
    c64 = (offset + ftz * (1.0 + W + tl.sum(m, axis=1))) / (1.0 - g_eval) * _SLACK
    e = round_up_f32(e64)
    c = round_up_f32(c64)
    finite = (tl.min(tl.min(_finite(g.to(tl.float32)).to(tl.int32), axis=2), axis=1) > 0) \
        & (tl.min((_finite(alpha) & _finite(beta)).to(tl.int32), axis=1) > 0) & _finite(e) & _finite(c)
    reach = (e + tl.sum(tl.abs(alpha) + tl.abs(beta), axis=1)) * tl.load(nkmax_ptr + n // per_batch, mask=nok, other=0.0)
    ok = finite & (reach < _REACH)
    tl.store(g_ptr + n[:, None, None] * RP * D + slot[None, :, None] * D + d[None, None, :], g,
             mask=nok[:, None, None] & dok[None, None, :])
    tl.store(alpha_ptr + n[:, None] * RP + slot[None, :], alpha, mask=nok[:, None])
    tl.store(beta_ptr + n[:, None] * RP + slot[None, :], beta, mask=nok[:, None])
    tl.store(e_ptr + n, e, mask=nok)
    tl.store(c_ptr + n, c, mask=nok)
    tl.store(ok_ptr + n, ok.to(tl.int8), mask=nok)


def screen_operands(plan: CertificatePlan | KernelPlan, w: torch.Tensor, g_dtype: torch.dtype, RP: int,
                    margin: tuple[float, float, float, float], nk_max: torch.Tensor):
    """(g [..., RP, D] g_dtype, alpha [..., RP] fp32, beta [..., RP] fp32, e [...] fp32, c [...] fp32,
    ok [...] bool) for the plan's queries ``...`` = [B, S] (module docstring). w [B, S, H] any float
    dtype; RP > the plan's row count R; nk_max [B] fp32. A KernelPlan costs this one launch; a
    CertificatePlan (the torch planner's) one more, its four per-query terms stacked."""
    *lead, R, D = plan.rows.shape
    H = w.shape[-1]
    if RP <= R:
        raise ValueError(f"RP: expected more than the plan's {R} rows, got {RP}")
    dev = plan.rows.device
    N = plan.rows.numel() // max(1, R * D)
    B = nk_max.shape[0]
    g = torch.empty((*lead, RP, D), dtype=g_dtype, device=dev)
    alpha = torch.empty((*lead, RP), dtype=torch.float32, device=dev)
    beta = torch.empty_like(alpha)
    e = torch.empty(lead, dtype=torch.float32, device=dev)
    c = torch.empty_like(e)
    ok = torch.empty(lead, dtype=torch.int8, device=dev)
    if N:
        kernel_plan = isinstance(plan, KernelPlan)
        if kernel_plan:
            terms, gram = plan.scalars, plan.gram
        else:
            terms = torch.stack([x.reshape(N) for x in (plan.residual, plan.slope, plan.offset, plan.mass)], dim=-1)
            gram = terms
        flat = [x.contiguous() for x in (plan.rows, plan.row_weights, plan.aux, plan.abs_path.view(torch.int8),
                                         terms, gram)]
        qb = defaults.SCREEN_OPERANDS_QUERIES
        _operands_kernel[(cdiv(N, qb),)](*flat, w.contiguous(), nk_max.float().contiguous(), g, alpha, beta, e,
                                         c, ok, N, H, D, N // B, *margin, *margin_constants(D, H, R), R=R,
                                         RP=RP, DP=next_power_of_2(D), HP=next_power_of_2(H),
                                         QB=qb, KERNEL_PLAN=kernel_plan, enable_fp_fusion=False,
                                         num_warps=defaults.SCREEN_OPERANDS_WARPS)
    return g, alpha, beta, e, c, ok.view(torch.bool)


@triton.jit
def _threshold_kernel(ok_ptr, witness_ptr, theta_ptr, scales_ptr, out_ptr, N, per_batch, WITNESS: tl.constexpr,
                      THETA: tl.constexpr, SCALES: tl.constexpr, BLOCK: tl.constexpr):
    """Queries pid * BLOCK ..: out = max(witness, theta) where ok and it is finite (``screen_threshold``)."""
    n = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = n < N
    keep = tl.load(ok_ptr + n, mask=inside, other=0) != 0
    tau = tl.full([BLOCK], float("-inf"), tl.float32)
    if WITNESS:
        tau = tl.load(witness_ptr + n, mask=inside, other=0.0)
        keep &= tau == tau
    if THETA:
        theta = tl.load(theta_ptr + n, mask=inside, other=0.0)
        theta = tl.where(tl.abs(theta) < float("inf"), theta, float("-inf"))
        tau = tl.where(theta > tau, theta, tau)
    keep &= tl.abs(tau) < float("inf")
    if SCALES:
        keep &= tl.load(scales_ptr + n // per_batch, mask=inside, other=0) != 0
    tl.store(out_ptr + n, tl.where(keep, tau, float("-inf")), mask=inside)


def screen_threshold(ok: torch.Tensor, witness: torch.Tensor | None, theta: torch.Tensor | None,
                     scales_ok: torch.Tensor | None = None) -> torch.Tensor:
    """The screen's tau, fp32 [B, S] contiguous: t = max(``witness``, ``theta`` where finite), both fp32
    [B, S] and -inf where None (a NaN witness makes t NaN), kept where ``ok`` [B, S] bool, t is finite
    and (when given) ``scales_ok`` [B] bool of the query's batch row; else -inf."""
    B, S = ok.shape
    out = torch.empty((B, S), dtype=torch.float32, device=ok.device)
    if out.numel():
        ok8 = ok.contiguous().view(torch.int8)
        witness32 = ok8 if witness is None else witness.float().contiguous()
        theta32 = ok8 if theta is None else theta.float().contiguous()
        scales = ok8 if scales_ok is None else scales_ok.contiguous().view(torch.int8)
        block = defaults.REDO_ROWS_BLOCK
        _threshold_kernel[(cdiv(B * S, block),)](ok8, witness32, theta32, scales, out, B * S, S,
                                                 WITNESS=witness is not None, THETA=theta is not None,
                                                 SCALES=scales_ok is not None, BLOCK=block)
    return out
