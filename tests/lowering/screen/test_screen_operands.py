"""The screen's operands (compiler.lowering.screen.screen_operands) against the float64 formulas they
implement: coefficients rounded outward to the nearest float32, e and c never below their exact
values, rows converted as the screen reads them, ok false exactly where an operand is not finite or
the reach passes REACH_LIMIT; and the screen's threshold, -inf exactly where a query may not prune."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from compiler.lowering.screen.screen_operands import REACH_LIMIT, screen_operands, screen_threshold
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


SIGNATURE_LINES = """
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature
from compiler.lowering.screen.key_norms import _key_norms_kernel
from compiler.lowering.screen.screen_operands import _operands_kernel

backend = make_backend(GPUTarget("cuda", 90, 32))
t = lambda dtype: torch.empty(8, dtype=dtype)
f64, f32 = t(torch.float64), t(torch.float32)
launches = [
    (_key_norms_kernel, [t(torch.bfloat16), f32, 8, 8, 64, 8, 1, 1.5], dict(BLOCK=32, DP=8)),
    (_operands_kernel, [f64, f64, f64, t(torch.int8), f64, f64, f32, f32, t(torch.bfloat16), f32, f32, f32, f32,
                        t(torch.int8), 8, 8, 8, 8] + [0.1] * 9, dict(R=3, RP=4, DP=8, HP=8, QB=1, KERNEL_PLAN=True)),
]
for kernel, args, meta in launches:
    meta = dict(meta, num_warps=4, debug=False)
    bound, spec, opts = create_function_from_signature(kernel.signature, kernel.params, backend)(*args, **meta)
    signature = kernel._pack_args(backend, meta, bound, spec, opts)[1]
    print(" ".join(ty for ty in signature.values() if ty in ("fp32", "fp64")))
"""


def test_float_scalars_reach_the_compiled_kernels_as_float64():
    # Triton passes an unannotated Python float to a compiled kernel as fp32: the margin
    # constants and the key norms' factor 1 + 2 gamma_{D+2}(u64) (which rounds to 1.0) would lose
    # their low bits on the GPU while the interpreter keeps them. Built for sm_90 without a GPU.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", SIGNATURE_LINES], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[3], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == ["fp64", " ".join(["fp64"] * 9)], out.stdout


@pytest.mark.parametrize("seeds", ["witness", "theta", "both", "neither"])
@pytest.mark.parametrize("with_scales", [False, True])
def test_screen_threshold_is_the_torch_form(seeds, with_scales):
    """max(witness, theta where finite), kept where ok, finite and the batch row's scales usable, else
    -inf: NaN, both infinities and signed zeros in either threshold, operands that are not ok, over
    several kernel steps of queries."""
    g = torch.Generator().manual_seed(5)
    B, S = 3, 1500
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0])

    def threshold():
        t = torch.randn(B, S, generator=g) * 10
        pick = torch.rand(B, S, generator=g) < 0.2
        t[pick] = special[torch.randint(0, 5, (int(pick.sum()),), generator=g)]
        return t

    witness = threshold() if seeds in ("witness", "both") else None
    theta = threshold() if seeds in ("theta", "both") else None
    ok = torch.rand(B, S, generator=g) < 0.8
    scales_ok = torch.tensor([True, False, True]) if with_scales else None
    none = torch.full((B, S), float("-inf"))
    clean = none if theta is None else torch.where(torch.isfinite(theta), theta, float("-inf"))
    tau = torch.maximum(none if witness is None else witness, clean)
    keep = ok & torch.isfinite(tau)
    if with_scales:
        keep &= scales_ok[:, None]
    want = torch.where(keep, tau, float("-inf"))
    got = screen_threshold(ok, witness, theta, scales_ok)
    assert got.dtype == torch.float32 and got.is_contiguous()
    assert torch.equal(got, want)  # by value: a tie of -0.0 and +0.0 may keep either, both prune the same keys
