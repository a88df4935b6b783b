"""The Triton plan (compiler.lowering.screen.certificate_plan) is the torch plan: same choices, same values up to
float64 summation order, and a bound that never falls below THE SCORER, on adversarial inputs."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings, strategies as st

from compiler.lowering import topk_pipeline as ct
from compiler.lowering.screen.certificate_plan import plan_certificate_triton
from compiler.lowering.screen import screen_operands as screen_operands_module
from compiler.lowering.screen.screen_operands import _plan_terms, screen_operands
from runtime.certificate import CertificatePlan, default_r, evaluate_bound, plan_certificate
from runtime.certified_topk import CertifiedTopkConfig
from runtime.dense_scorer import exact_scores, head_dots
from runtime import rounding
from runtime.rounding import key_norm_up, margin_coefficients, margin_constants, range_is_safe
from runtime.structured_indexer import structured_indexer_inputs

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

SCALAR_FIELDS = ("residual", "slope", "offset", "mass")


def _draw(regime, shape, g):
    x = torch.randn(shape, generator=g)
    if regime == "integer":  # ties in every rank and dot
        return torch.randint(-2, 3, shape, generator=g).float()
    if regime == "huge":
        return x * 1e15
    if regime == "tiny":
        return x * 1e-18
    if regime == "zeros":  # zero heads: zero norms, zero anchors
        return x * (torch.rand(shape[:-1] + (1,), generator=g) < 0.5)
    if regime == "correlated":  # heads along one direction: small residual directions
        return x[..., :1, :] * (1 + 0.01 * torch.rand(shape[:-1] + (1,), generator=g)) + 1e-4 * x
    return x


@st.composite
def plan_cases(draw):
    N, H, D, M = draw(st.integers(1, 3)), draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 12))
    regime = draw(st.sampled_from(("normal", "integer", "huge", "tiny", "zeros", "correlated")))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = _draw(regime, (N, H, D), g)
    k = _draw("integer" if regime == "integer" else "normal", (N, M, D), g)
    w = _draw("integer" if regime == "integer" else "normal", (N, H), g)
    signs = draw(st.sampled_from(("mixed", "positive", "negative")))
    w = w.abs() if signs == "positive" else -w.abs() if signs == "negative" else w
    p = (head_dots(q, k) > 0).double().mean(-1) if draw(st.booleans()) else torch.rand(N, H, generator=g)
    r_max = draw(st.integers(1, H))
    r = default_r(w).clamp(max=r_max) if draw(st.booleans()) else torch.full((N,), draw(st.integers(1, H)))
    return q, k, w, p, r, r_max


def _sqrt(x):
    """The correctly rounded float64 square root, as CUDA's (torch's CPU sqrt, SLEEF's, is at times
    one unit in the last place off)."""
    return torch.from_numpy(np.sqrt(x.numpy()))


def certificate_form(plan, r_max):
    """The KernelPlan ``plan`` as a CertificatePlan, its residual and margin by the torch formulas
    (those ``screen_operands`` evaluates in its kernel)."""
    *lead, H = plan.retained.shape
    D = plan.aux.shape[-1]
    u_square, mass, weight_sum, bound_rows, projected = (x.reshape(lead) for x in plan.scalars.unbind(-1))
    gram = plan.gram.reshape(lead)
    residual = torch.where(plan.abs_path, 0.0, 0.5 * (_sqrt(u_square) + _sqrt(gram)))
    slope, offset = margin_coefficients(mass, weight_sum, bound_rows + residual, mass + projected + residual,
                                        D=D, H=H, r=r_max)
    return CertificatePlan(rows=plan.rows, row_weights=plan.row_weights, aux=plan.aux, residual=residual,
                           abs_path=plan.abs_path, retained=plan.retained, slope=slope, offset=offset, mass=mass)


def _close(a, b, scale):
    return bool(((a - b).abs() <= 1e-12 * scale).all())


@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=plan_cases())
def test_triton_plan_bounds_the_scorer_and_matches_the_torch_plan(case):
    q, k, w, p, r, r_max = case
    plan = certificate_form(plan_certificate_triton(q, w, p, r, r_max), r_max)
    ref = plan_certificate(q, w, p, r, r_max)
    head_norm = q.double().norm(dim=-1)
    safe = range_is_safe((w.double().abs() * head_norm).sum(-1), head_norm.amax(-1), key_norm_up(k).amax(-1))
    bound = evaluate_bound(plan, k, key_norm_up(k))
    assert (exact_scores(q, w, k)[safe] <= bound[safe]).all()
    assert torch.equal(plan.abs_path, ref.abs_path)
    assert torch.equal(plan.retained.sum(-1), ref.retained.sum(-1))
    scale = ref.mass + ref.residual + w.double().abs().sum(-1) + 1e-300
    assert _close(plan.mass, ref.mass, scale)
    same = (plan.retained == ref.retained).all(-1)  # equal ranks may retain other heads
    for field in SCALAR_FIELDS:
        assert _close(getattr(plan, field)[same], getattr(ref, field)[same], scale[same])
    assert _close(plan.aux[same], ref.aux[same], scale[same, None])


@pytest.mark.parametrize("r_max", [1, 7, 40])
def test_triton_plan_equals_the_torch_plan_at_model_size(r_max):
    g = torch.Generator().manual_seed(r_max)
    q = torch.randn(3, 64, 128, generator=g).bfloat16()
    w = torch.randn(3, 64, generator=g)
    w[0] = w[0].abs().clamp_min(1e-3) * (torch.arange(64) < r_max)  # abs path: few positive heads
    p = torch.rand(3, 64, generator=g)
    r = default_r(w).clamp(max=r_max)
    plan, ref = certificate_form(plan_certificate_triton(q, w, p, r, r_max), r_max), plan_certificate(q, w, p, r, r_max)
    assert plan.abs_path.tolist() == ref.abs_path.tolist()
    assert plan.abs_path.tolist() == ([True, False, False] if r_max < 32 else [True, True, True])
    assert torch.equal(plan.retained, ref.retained)
    for field in ("aux", *SCALAR_FIELDS):
        torch.testing.assert_close(getattr(plan, field), getattr(ref, field), rtol=1e-12, atol=0)
    joint = ~ref.abs_path  # (the abs path retains its positive heads, all of rank inf, in any order)
    assert torch.equal(plan.rows[joint], ref.rows[joint])
    torch.testing.assert_close(plan.row_weights[joint], ref.row_weights[joint], rtol=1e-12, atol=0)
    torch.testing.assert_close(plan.row_weights[~joint].sort(-1).values, ref.row_weights[~joint].sort(-1).values,
                               rtol=1e-12, atol=0)


@triton.jit
def _plan_terms_probe(terms_ptr, gram_ptr, abs_ptr, out_ptr, N, c_s: tl.float64, c_u: tl.float64,
                      c_plan: tl.float64, floor: tl.float64, c_w: tl.float64, QB: tl.constexpr):
    """out [N, 4]: ``_plan_terms`` of a KernelPlan's scalars (E, slope, offset, M_s)."""
    n = tl.arange(0, QB)
    nok = n < N
    abs_path = tl.load(abs_ptr + n, mask=nok, other=0) != 0
    terms = _plan_terms(terms_ptr, gram_ptr, abs_path, n, nok, c_s, c_u, c_plan, floor, c_w, True)
    for i in tl.static_range(4):
        tl.store(out_ptr + n * 4 + i, terms[i], mask=nok)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(case=plan_cases(), g_dtype=st.sampled_from((torch.bfloat16, torch.float16, torch.float32)))
def test_operands_of_the_kernel_plan_are_those_of_its_torch_form_bitwise(case, g_dtype):
    # screen_operands evaluates a KernelPlan's residual E, slope and offset in its kernel: those
    # float64 terms equal the torch formulas' bitwise, and every operand equals the one from the
    # same plan in its torch form, also with large margin constants (so that each constant's term
    # shows in the fp32 operands)
    q, k, w, p, r, r_max = case
    plan = plan_certificate_triton(q, w, p, r, r_max)
    ref = certificate_form(plan, r_max)
    N, H, D = q.shape
    out = torch.empty(N, 4, dtype=torch.float64)
    _plan_terms_probe[(1,)](plan.scalars, plan.gram, plan.abs_path.view(torch.int8), out, N,
                            *margin_constants(D, H, r_max), QB=4)
    for got, want in zip(out.unbind(-1), (ref.residual, ref.slope, ref.offset, ref.mass)):
        assert torch.equal(got.view(torch.int64), want.view(torch.int64))
    RP = triton.next_power_of_2(r_max + 1)
    margin = ct.screen_margin(D, H, RP)
    nk_max = key_norm_up(k).amax(-1).amax(-1, keepdim=True).float()
    for constants in (margin_constants, lambda *_: (0.25, 0.75, 1.5, 2.0**-30, 3.0)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(rounding, "margin_constants", constants)
            mp.setattr(screen_operands_module, "margin_constants", constants)
            got = screen_operands(plan, w[None], g_dtype, RP, margin, nk_max)
            want = screen_operands(certificate_form(plan, r_max), w[None], g_dtype, RP, margin, nk_max)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_the_certified_op_with_the_triton_plan_equals_dense(monkeypatch):
    monkeypatch.setattr(ct, "plan_certificate", plan_certificate_triton)  # the CUDA planner, on the CPU
    # 8 queries (the plan kernel runs one program per query): lists still ~10% of the 512 keys
    q, k, w, _ = structured_indexer_inputs(1, 8, 512, 4, 16, positive_heads=2, seed=3, dtype=torch.bfloat16)
    config = CertifiedTopkConfig(path="certified", anchor_stride=16, workspace_frac=0.1, r=2)
    want = ct.dense_topk_cuda(q, k, w, 32)
    trace = []
    got = ct.certified_topk_cuda(q, k, w, 32, config=config, trace=trace)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    assert trace[0].list_count.float().median() < 0.5 * k.shape[1]  # it pruned


def test_a_bad_row_count_is_named():
    q, w, p, r = torch.ones(2, 4, 8), torch.ones(2, 4), torch.full((2, 4), 0.5), torch.ones(2, dtype=torch.long)
    for bad in (0, 5, 2.0, True, None):
        with pytest.raises(ValueError, match="r_max"):
            plan_certificate_triton(q, w, p, r, bad)
    with pytest.raises(ValueError, match="w, p"):
        plan_certificate_triton(q, w[:, :3], p, r, 2)


PLAN_IR = """
import os, subprocess, sys, tempfile, torch, triton
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature
import compiler.lowering.screen.certificate_plan as pt
from compiler.lowering.defaults import PLAN_COLUMNS, PLAN_STAGES, PLAN_WARPS

target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
kernel = pt._plan_kernel
f64 = lambda: torch.empty(8, dtype=torch.float64)
args = [torch.empty(8, dtype=torch.bfloat16), f64(), f64(), torch.empty(8, dtype=torch.int64), f64(), f64(), f64(),
        f64(), f64(), torch.empty(8, dtype=torch.int8), torch.empty(8, dtype=torch.int8), 64, 128, 8192, 128]


def source(r_max, warps):
    meta = dict(R_MAX=r_max, RP=triton.next_power_of_2(r_max), HP=64, CD=PLAN_COLUMNS, STAGES=PLAN_STAGES, HW=True,
                num_warps=warps, debug=False)
    bound, spec, opts = create_function_from_signature(kernel.signature, kernel.params, backend)(*args, **meta)
    options, signature, constexprs, attrs = kernel._pack_args(backend, meta, bound, spec, opts)
    return ASTSource(kernel, signature, constexprs, attrs), options
"""

TTIR_LINES = PLAN_IR + """
for r_max in map(int, sys.argv[1:]):
    src, options = source(r_max, 1)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)
    print(len(str(module).splitlines()))
"""

PTXAS_SPILLS = PLAN_IR + """
src, options = source(int(sys.argv[1]), PLAN_WARPS)
ptx = triton.compile(src, target=target, options=options.__dict__).asm["ptx"]
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
with tempfile.TemporaryDirectory() as d:
    with open(os.path.join(d, "k.ptx"), "w") as f:
        f.write(ptx)
    out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", os.path.join(d, "k.ptx"), "-o", os.path.join(d, "k.cubin")],
                         capture_output=True, text=True, check=True)
print(out.stderr)
"""


def _plan_ir(script, *argv):
    """Run ``script`` (PLAN_IR's prelude) outside the interpreter: the kernel built for sm_90 on the CPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[3], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_plan_kernel_does_not_unroll_its_budget():
    # Its loops over the R_MAX retained rows were unrolled (tl.static_range): compiling the kernel
    # for sm_90 took 1.9 s at R_MAX = 7, 8 s at 16, 55 s at 32 and 280 s at 64 (Triton 3.6, 2-core
    # x86 CPU), so a first call with a large explicit r stalled for minutes. The kernel's Triton
    # IR (built for sm_90 without a GPU, outside the interpreter) must not grow with R_MAX.
    small, large = map(int, _plan_ir(TTIR_LINES, "4", "64").split())
    assert large < 1.2 * small, (small, large)


def test_the_plan_kernel_keeps_its_registers_at_the_largest_screened_budget():
    # The kernel holds an [H, H] float64 Gram accumulator and compares every pair of heads for
    # the retained ones; over too few warps that spilled (ptxas, sm_90a, Triton's own, at 2 warps:
    # 255 registers and 196 bytes of spill stores at R_MAX = 15). It must report no spills at the
    # largest screened budget.
    report = _plan_ir(PTXAS_SPILLS, "31")
    assert "registers" in report and "0 bytes spill stores, 0 bytes spill loads" in report, report


def test_an_infinite_weight_on_a_zero_head_leaves_its_query_unscreened():
    """|w| = inf on a zero head has rank NaN (inf * 0): the plan still places every other head,
    and the query's operands are not ok (its keys are never pruned); the other query is planned as
    without it."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 16, 32, generator=g).bfloat16()
    w = torch.randn(1, 2, 16, generator=g)
    q[0, 0, 3], w[0, 0, 3] = 0, -float("inf")
    q[0, 0, 5], w[0, 0, 5] = 0, float("inf")
    p = torch.rand(1, 2, 16, generator=g)
    r = torch.full((1, 2), 4)
    plan = plan_certificate_triton(q, w, p, r, 4)
    ok = screen_operands(plan, w, torch.bfloat16, ct.screen_rows(4), ct.screen_margin(32, 16, 8), torch.ones(1))[5]
    assert ok.tolist() == [[False, True]]
    assert not plan.retained[0, 0, 3] and plan.retained[0, 0].sum() <= 4
    ref = plan_certificate_triton(q[:, 1:], w[:, 1:], p[:, 1:], r[:, 1:], 4)
    assert torch.equal(plan.retained[:, 1:], ref.retained) and torch.equal(plan.rows[:, 1:], ref.rows)
