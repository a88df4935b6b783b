"""The screen's operands (compiler.lowering.screen.screen_operands) against the float64 formulas they
implement: coefficients rounded outward to the nearest float32, e and c never below their exact
values, rows converted as the screen reads them, ok false exactly where an operand is not finite or
the reach passes REACH_LIMIT."""
import pytest
import torch

from compiler.lowering.screen.screen_operands import REACH_LIMIT, screen_operands
from compiler.lowering.topk_pipeline import screen_margin
from runtime.certificate import default_r, plan_certificate
from runtime.rounding import round_up_to_float32

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

TINY = 2.0**-126


def _reference(plan, w, g, RP, margin):
    """The float64 formulas of the module docstring, written with torch, for the converted rows ``g``
    (e64 and c64 before their outward rounding; alpha64, beta64 and g64 exact)."""
    a, b, g_eval, f = margin
    R, D = plan.rows.shape[-2:]
    ap = plan.abs_path[..., None]
    rw = plan.row_weights
    pad = RP - R - 1
    zeros = torch.zeros(*rw.shape[:-1], pad, dtype=torch.float64)
    alpha64 = torch.cat((rw, -torch.ones_like(rw[..., :1]), zeros), -1)
    beta64 = torch.cat((torch.where(ap, -rw, 0.0), torch.where(ap, -1.0, 0.0) * torch.ones_like(rw[..., :1]), zeros), -1)
    g64 = torch.cat((plan.rows, plan.aux[..., None, :], torch.zeros(*rw.shape[:-1], pad, D, dtype=torch.float64)), -2)
    back = g.double()
    m = torch.maximum(round_up_to_float32(alpha64).abs(), round_up_to_float32(-beta64).abs()).double()
    row_mass = (m * back.norm(dim=-1)).sum(-1)
    err = (m * (back - g64).norm(dim=-1)).sum(-1)
    W = w.double().abs().sum(-1)
    e64 = (plan.residual + plan.slope + err + a * plan.mass + b * row_mass) / (1 - g_eval)
    c64 = (plan.offset + f * (1 + W + m.sum(-1))) / (1 - g_eval)
    return alpha64, beta64, g64, e64, c64


def _plan(regime, B=2, S=37, H=8, D=16, r_max=3, seed=0):  # 74 queries: programs of several queries, the last partial
    g = torch.Generator().manual_seed(seed)
    scale = {"normal": 1.0, "tiny": 1e-20, "huge": 1e30}[regime]
    q = torch.randn(B, S, H, D, generator=g) * scale
    w = torch.randn(B, S, H, generator=g)
    w[0, 0] = w[0, 0].abs()  # one query on the joint path (all heads positive)
    w[1, 1] = -w[1, 1].abs()  # one without positive heads
    p = torch.rand(B, S, H, generator=g)
    r = default_r(w).clamp(max=r_max)
    return plan_certificate(q, w, p, r, r_max), w


@pytest.mark.parametrize("g_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("regime", ["normal", "tiny", "huge"])
def test_operands_round_outward_and_bound_their_formulas(regime, g_dtype):
    plan, w = _plan(regime)
    RP = 8
    margin = screen_margin(16, 8, RP)
    nk_max = torch.tensor([3.0, 0.5])
    g, alpha, beta, e, c, ok = screen_operands(plan, w, g_dtype, RP, margin, nk_max)
    alpha64, beta64, g64, e64, c64 = _reference(plan, w, g, RP, margin)
    # each entry within one unit in the last place of its float64 value (the interpreter truncates;
    # below the smallest normal, flushing is allowed)
    bits = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[g_dtype]
    fits = torch.isfinite(g.float()) & (g64.abs() < torch.finfo(g_dtype).max)
    assert g.dtype == g_dtype and ((g.double() - g64).abs()[fits] <= 2.0**(1 - bits) * g64.abs()[fits] + torch.finfo(g_dtype).tiny).all()
    assert (alpha.double() >= alpha64).all() and (beta.double() <= beta64).all()
    normal_a = (alpha64 <= 0) | (alpha64 >= TINY)  # a positive value below 2^-126 may become 2^-126
    assert torch.equal(alpha[normal_a], round_up_to_float32(alpha64)[normal_a])
    normal_b = (beta64 >= 0) | (beta64 <= -TINY)
    assert torch.equal(beta[normal_b], -round_up_to_float32(-beta64)[normal_b])
    finite = torch.isfinite(e64) & torch.isfinite(c64) & torch.isfinite(g.float()).flatten(-2).all(-1)
    assert (e.double()[finite] >= e64[finite]).all() and (c.double()[finite] >= c64[finite]).all()
    assert (e.double()[finite] <= e64[finite] * (1 + 2.0**-20) + TINY).all()  # not wildly above either
    reach = (e + (alpha.abs() + beta.abs()).sum(-1)) * nk_max[:, None]
    assert torch.equal(ok, torch.isfinite(e) & torch.isfinite(c) & torch.isfinite(g.float()).flatten(-2).all(-1)
                       & (reach < REACH_LIMIT))
    if regime != "huge":
        assert ok.all()
    elif g_dtype == torch.float16:
        assert not ok.any()  # rows of 1e30 overflow fp16


def test_ok_is_false_for_an_overflowing_reach_and_a_non_finite_row():
    plan, w = _plan("normal")
    RP = 4
    margin = screen_margin(16, 8, RP)
    *_, ok = screen_operands(plan, w, torch.bfloat16, RP, margin, torch.tensor([1.0, 2.0**99]))
    assert ok[0].all() and not ok[1].any()
    rows = plan.rows.clone()
    rows[0, 2, 0, 5] = float("inf")
    bad = type(plan)(**{**plan.__dict__, "rows": rows})
    *_, ok = screen_operands(bad, w, torch.bfloat16, RP, margin, torch.tensor([1.0, 1.0]))
    assert not ok[0, 2] and ok.sum() == ok.numel() - 1


def test_too_few_screen_rows_are_refused():
    plan, w = _plan("normal")
    with pytest.raises(ValueError, match="RP"):
        screen_operands(plan, w, torch.bfloat16, 3, screen_margin(16, 8, 4), torch.ones(2))
