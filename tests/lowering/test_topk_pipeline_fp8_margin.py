"""The FP8 scorer's GPU rounding margin (SPEC A.10): ``fp8_dot_error`` against an emulation of the FP8
tensor-core model it assumes (aligned truncation to FP8_MMA_BITS fraction bits, steps of at least FP8_MMA_STEP
products, promotion to fp32 every fp8_interval(D) products): sound on worst-case sums, not vacuous,
and losing a swamped tail without the promotion."""
import math

import numpy as np
import pytest

from benchmarks.fp8_dot_check import adversarial_pairs
from compiler.lowering.scoring.indexer_scores import FP8_PROMOTE, fp8_interval
from compiler.lowering.topk_pipeline import FP8_MMA_BITS, FP8_MMA_STEP, fp8_dot_error


def emulated_fp8_dot(products: list[float], promote: int, step: int, bits: int) -> float:
    """The FP8 tensor-core model of SPEC A.10 on exact products (float64 holds them exactly): every
    ``promote`` products summed from zero in steps of ``step`` products (and the running sum after
    the first), each term truncated toward zero to a multiple of 2^(E - bits), E the exponent of
    the step's largest term, and each step's sum to ``bits`` fraction bits; the interval results go
    to float32 and are added in float32."""
    def exponent(v):
        return math.frexp(abs(v))[1] - 1

    def truncated(v, e):
        unit = 2.0 ** (e - bits)
        return math.trunc(v / unit) * unit

    total = np.float32(0.0)
    for lo in range(0, len(products), promote):
        running = None
        for i in range(lo, min(lo + promote, len(products)), step):
            terms = products[i:min(i + step, lo + promote)] + ([] if running is None else [running])
            nonzero = [t for t in terms if t != 0.0]
            e = max(exponent(t) for t in nonzero) if nonzero else 0
            summed = sum(truncated(t, e) for t in terms)
            running = truncated(summed, exponent(summed)) if summed else 0.0
        total = np.float32(total + np.float32(running))
    return float(total)


@pytest.mark.parametrize("D", [32, 128, 256])
def test_fp8_dot_error_bounds_the_modelled_tensor_core_sums(D):
    phi = fp8_dot_error(D)
    worst = 0.0
    for q8, k8 in adversarial_pairs(D, random_pairs=16).values():
        for q, k in zip(q8.double(), k8.double()):
            products = (q * k).tolist()
            exact = sum(products)  # multiples of 2^-18 below 2^26: exact in float64
            mass = sum(abs(p) for p in products)
            for step in (FP8_MMA_STEP, 8, 16, fp8_interval(D)):
                err = abs(emulated_fp8_dot(products, fp8_interval(D), step, FP8_MMA_BITS) - exact)
                assert err <= phi * mass
                worst = max(worst, err / (phi * mass))
    assert worst > 0.3  # the worst case comes within a small factor: the bound is not vacuous


def test_promotion_keeps_a_tail_that_the_running_sum_would_swamp_within_the_bound():
    """One interval of large products, then products just below the running sum's truncation unit:
    promoted every fp8_interval(D) products, the later interval is summed from zero (exactly) and
    the dot is within the bound; one running sum over all D drops the tail."""
    D = 2 * FP8_PROMOTE
    q, k = (x[0].double() for x in adversarial_pairs(D)["unpromoted_tail"])
    products = (q * k).tolist()
    exact, mass = sum(products), sum(abs(p) for p in products)
    promoted = emulated_fp8_dot(products, fp8_interval(D), FP8_MMA_STEP, FP8_MMA_BITS)
    unpromoted = emulated_fp8_dot(products, D, FP8_MMA_STEP, FP8_MMA_BITS)
    assert abs(promoted - exact) <= fp8_dot_error(D) * mass
    assert abs(unpromoted - exact) > 100 * abs(promoted - exact)


def test_the_fp8_factor_at_deepseek_v32_sizes():
    """D = 128: one interval, 191 truncations at 2^-13, about 770x the bf16 factor; D = 32: 47."""
    assert fp8_dot_error(128) == pytest.approx(191 * 2.0**-13, rel=3e-2)
    assert fp8_dot_error(32) == pytest.approx(47 * 2.0**-13, rel=2e-2)
    assert FP8_PROMOTE == 128 and FP8_MMA_BITS == 13 and FP8_MMA_STEP == 4
