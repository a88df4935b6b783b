"""The certificate bounds THE SCORER's float32 output; the margin is needed, tight, and sound."""
import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from runtime.certificate import default_r, evaluate_bound, plan_certificate
from runtime.dense_scorer import dense_topk, exact_scores, head_dots
from runtime.rounding import (
    gamma,
    key_norm_up,
    next_up,
    range_is_safe,
    round_up_to_float32,
)
from runtime.structured_indexer import structured_indexer_inputs

REGIMES = ("normal", "integer", "huge", "tiny", "mixed_scale", "cancel", "correlated", "zeros")


pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def _draw(regime, shape, g):
    if regime == "integer":
        return torch.randint(-3, 4, shape, generator=g).float()
    x = torch.randn(shape, generator=g)
    if regime == "huge":
        return x * 1e15
    if regime == "tiny":
        return x * 1e-18
    if regime == "mixed_scale":
        return x * 10.0 ** (30 * torch.rand(shape[:-1] + (1,), generator=g) - 15)
    if regime == "cancel":  # large components that cancel in q . k
        return x.round() * 4096 + torch.randn(shape, generator=g) * 1e-3
    if regime == "zeros":
        return x * (torch.rand(shape, generator=g) < 0.4)
    return x


@st.composite
def certificate_cases(draw):
    N, H = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    D, M = draw(st.integers(1, 8)), draw(st.integers(1, 24))
    regime = draw(st.sampled_from(REGIMES))
    signs = draw(st.sampled_from(("mixed", "positive", "negative", "few_positive")))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = _draw(regime, (N, H, D), g)
    if regime == "correlated":  # heads close to one direction: projections with tiny residuals
        q = q[:, :1] * (1 + 0.01 * torch.rand(N, H, 1, generator=g)) + 1e-4 * q
    k = _draw(regime if regime != "correlated" else "normal", (N, M, D), g)
    if regime == "cancel":
        k = k.round()
    w = _draw("integer" if regime == "integer" else "normal", (N, H), g)
    if signs == "positive":
        w = w.abs()
    elif signs == "negative":
        w = -w.abs()
    elif signs == "few_positive":
        w = torch.where(torch.rand(N, H, generator=g) < 1.5 / H, w.abs(), -w.abs())
    p = torch.rand(N, H, generator=g, dtype=torch.float64)
    if draw(st.booleans()):  # activation frequencies measured on the keys themselves
        p = (head_dots(q, k) > 0).double().mean(-1)
    r = torch.full((N,), draw(st.integers(1, H))) if draw(st.booleans()) else default_r(w)
    bias = None
    if draw(st.booleans()):
        bias = torch.randn(N, M, generator=g) * 10.0 ** float(torch.randint(-3, 20, (), generator=g))
    return q, k, w, p, r, bias


def _bounds(q, k, w, p, r):
    plan = plan_certificate(q, w, p, r)
    return plan, evaluate_bound(plan, k, key_norm_up(k))


def _in_range(q, k, w):
    q64, w64 = q.double(), w.double()
    head_norm = q64.norm(dim=-1)
    return range_is_safe((w64.abs() * head_norm).sum(-1), head_norm.amax(-1), key_norm_up(k).amax(-1))


@settings(max_examples=1800, deadline=None, derandomize=True)
@given(case=certificate_cases())
def test_float32_scores_never_exceed_the_rounded_bound_on_adversarial_inputs(case):
    q, k, w, p, r, bias = case
    plan, bound = _bounds(q, k, w, p, r)
    scores = exact_scores(q, w, k)
    safe = _in_range(q, k, w)
    assert (scores[safe] <= bound[safe]).all()
    if bias is not None:
        compare = round_up_to_float32(next_up(bound + bias.double()))
        assert (compare.to(torch.float32)[safe] >= (scores + bias)[safe]).all()
    retained = plan.retained.sum(-1)
    assert (retained <= r).all()
    positive = w > 0
    abs_path = positive.sum(-1) <= r
    assert torch.equal(plan.abs_path, abs_path)
    assert (plan.retained | ~positive)[abs_path].all()  # abs path keeps every positive head
    assert (~plan.retained | positive)[~abs_path].all()  # joint path keeps positive heads only


def _exact_relu_score(q, w, k):
    """Exact real score of float32 inputs (rational arithmetic)."""
    total = Fraction(0)
    for h in range(q.shape[0]):
        dot = sum(Fraction(float(a)) * Fraction(float(b)) for a, b in zip(q[h], k))
        total += Fraction(float(w[h])) * max(dot, Fraction(0))
    return total


@settings(max_examples=400, deadline=None, derandomize=True)
@given(case=certificate_cases(), extra=st.integers(0, 8))
def test_a_static_row_count_above_every_budget_keeps_the_bound_valid(case, extra):
    q, k, w, p, r, _ = case
    H = q.shape[-2]
    r_max = min(H, int(r.max()) + extra)
    plan = plan_certificate(q, w, p, r, r_max)
    assert plan.rows.shape[-2] == r_max
    assert (plan.retained.sum(-1) <= r.clamp(1, H)).all()
    bound = evaluate_bound(plan, k, key_norm_up(k))
    safe = _in_range(q, k, w)
    assert (exact_scores(q, w, k)[safe] <= bound[safe]).all()


def test_a_static_row_count_must_be_a_head_count():
    q, w, p, r = torch.ones(2, 4, 8), torch.ones(2, 4), torch.full((2, 4), 0.5), torch.ones(2, dtype=torch.long)
    for bad in (0, 5, 2.0, True):
        with pytest.raises(ValueError, match="r_max"):
            plan_certificate(q, w, p, r, bad)


def test_margin_is_needed_float32_scores_exceed_the_unmargined_bound():
    # H = 1, r = 1, w = 1: the abs path bound is exactly relu(q . k) (zero slack), so every
    # float32 rounding upwards of the scorer exceeds it; the margin covers it.
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 8, generator=g)
    k = torch.randn(1, 400, 8, generator=g)
    w = torch.ones(1, 1)
    half = torch.full((1, 1), 0.5, dtype=torch.float64)
    plan, bound = _bounds(q, k, w, half, torch.ones(1, dtype=torch.int64))
    bare = evaluate_bound(dataclasses.replace(plan, slope=torch.zeros(1, dtype=torch.float64),
                                              offset=torch.zeros(1, dtype=torch.float64)),
                          k, key_norm_up(k))
    scores = exact_scores(q, w, k)
    exceed = (scores.double() > bare).nonzero()
    assert exceed.numel() > 0
    i = int(exceed[0, 1])
    assert Fraction(float(scores[0, i])) > _exact_relu_score(q[0], w[0], k[0, i])  # fp32 rounded up
    assert (scores <= bound).all()


def test_margin_costs_almost_no_pruning_on_structured_inputs():
    q, k, w, _ = structured_indexer_inputs(1, 16, 1024, 16, 32, seed=1)
    tau = dense_topk(q, k, w, 32)[0][0, :, -1]
    plan, bound = _bounds(q[0], k, w[0], torch.full((16, 16), 0.5, dtype=torch.float64), default_r(w[0]))
    bare = evaluate_bound(dataclasses.replace(plan, slope=torch.zeros(16, dtype=torch.float64),
                                              offset=torch.zeros(16, dtype=torch.float64)),
                          k, key_norm_up(k))
    kept_with_margin = (round_up_to_float32(bound) >= tau[:, None]).sum()
    kept_without = (round_up_to_float32(bare) >= tau[:, None]).sum()
    assert kept_with_margin < 0.5 * bound.numel()
    assert kept_with_margin - kept_without <= 0.001 * bound.numel()


def _plain_and_joint_residuals(q, w, retained):
    """Independent computation of E_P and E_P^joint for the joint path (float64)."""
    q, w = q.double(), w.double()
    plain, joint = [], []
    for n in range(q.shape[0]):
        R = [j for j in range(q.shape[1]) if retained[n, j]]
        P = [h for h in range(q.shape[1]) if w[n, h] > 0 and not retained[n, h]]
        u = []
        for h in P:
            score = [max(float(q[n, h] @ q[n, j]), 0.0) / float(q[n, j].norm()) for j in R]
            j = R[int(np.argmax(score))]
            beta = max(float(q[n, h] @ q[n, j]), 0.0) / float(q[n, j].norm()) ** 2
            u.append(w[n, h] * (q[n, h] - beta * q[n, j]))
        plain.append(sum(float(x.norm()) for x in u))
        cross = sum(abs(float(a @ b)) for a in u for b in u)
        joint.append(0.5 * (float(sum(u).norm()) + math.sqrt(cross)) if u else 0.0)
    return torch.tensor(plain, dtype=torch.float64), torch.tensor(joint, dtype=torch.float64)


def test_joint_residual_is_the_one_used_and_prunes_more_than_the_plain_residual():
    S, T = 16, 1024
    q, k, w, _ = structured_indexer_inputs(1, S, T, 16, 32, seed=2, positive_heads=6)
    tau = dense_topk(q, k, w, 32)[0][0, :, -1]
    p = (head_dots(q[0], k.expand(S, T, 32)) > 0).double().mean(-1)
    plan, bound = _bounds(q[0], k, w[0], p, torch.full((S,), 2))
    assert not plan.abs_path.any()
    plain, joint = _plain_and_joint_residuals(q[0], w[0], plan.retained)
    torch.testing.assert_close(plan.residual, joint, rtol=1e-9, atol=0)
    assert (joint <= plain).all()
    plain_bound = evaluate_bound(dataclasses.replace(plan, residual=plain), k, key_norm_up(k))
    pruned_joint = round_up_to_float32(bound) < tau[:, None]
    pruned_plain = round_up_to_float32(plain_bound) < tau[:, None]
    assert (pruned_plain <= pruned_joint).all() and pruned_joint.sum() > pruned_plain.sum()


def test_default_r_is_positive_heads_rounded_up_to_four_clipped_to_heads():
    w = torch.tensor([[-1.0] * 6, [1.0] + [-1.0] * 5, [1.0] * 5 + [0.0], [1.0] * 6])
    assert default_r(w).tolist() == [1, 4, 6, 6]


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(st.floats(allow_nan=False, allow_infinity=True, width=64))
def test_round_up_to_float32_is_the_smallest_float32_not_below(x):
    y = float(round_up_to_float32(torch.tensor([x], dtype=torch.float64))[0])
    assert y >= x
    below = float(torch.nextafter(torch.tensor([y], dtype=torch.float32), torch.tensor([-math.inf]))[0])
    assert below < x or y == -math.inf


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(st.lists(st.floats(min_value=-(2.0**127), max_value=2.0**127, width=32), min_size=1, max_size=8))
def test_key_norm_bound_never_underestimates_the_exact_norm(values):
    k = torch.tensor([values], dtype=torch.float32)
    bound = Fraction(float(key_norm_up(k)[0]))
    assert bound >= 0 and bound * bound >= sum(Fraction(float(v)) ** 2 for v in k[0])


def test_gamma_matches_its_definition_and_refuses_unusable_counts():
    assert gamma(3, 2.0**-24) == 3 * 2.0**-24 / (1 - 3 * 2.0**-24)
    with pytest.raises(ValueError, match="n: n\\*u"):
        gamma(2**23, 2.0**-24)
    with pytest.raises(ValueError, match="n: expected a non-negative count"):
        gamma(-1, 2.0**-53)
