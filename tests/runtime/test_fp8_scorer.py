"""The FP8 scorer of SPEC A.10 in plain torch: its definition (exact E4M3 products, THE SCORER's sums,
then one multiply by the key's scale, then the bias), and the certified top-K on FP8 inputs equal to
the dense one bitwise on adversarial inputs: ties, extreme and overflowing scales, masks, non-finite
values and bad scales (routed to dense scoring, as every non-finite input is)."""
import pytest
import torch

from runtime.certified_topk import CertifiedTopkConfig, TopkStats, certified_topk
from runtime.dense_scorer import dense_topk, masked_scores
from runtime.fp8_quant import quantize_indexer_inputs
from runtime.indexer_inputs import check_indexer_inputs
from runtime.structured_indexer import structured_indexer_inputs

FP8 = torch.float8_e4m3fn
E4M3 = torch.arange(256, dtype=torch.uint8).view(FP8)


def test_every_product_of_two_e4m3_values_is_exact_in_float32():
    x = E4M3[torch.isfinite(E4M3.float())].float()
    assert torch.equal((x[:, None] * x[None, :]).double(), x.double()[:, None] * x.double()[None, :])


def test_the_scorer_multiplies_the_unscaled_sum_by_the_key_scale_then_adds_the_bias():
    g = torch.Generator().manual_seed(0)
    B, S, T, H, D = 1, 3, 7, 4, 32
    q8 = (torch.randn(B, S, H, D, generator=g) * 40).to(FP8)
    k8 = (torch.randn(B, T, D, generator=g) * 40).to(FP8)
    w, scale = torch.randn(B, S, H, generator=g), torch.rand(B, T, generator=g) * 1e-3
    bias = torch.randn(B, S, T, generator=g)
    got = masked_scores(check_indexer_inputs(q8, k8, w, 2, bias, scale))
    qf, kf = q8.float(), k8.float()
    for s in range(S):
        for t in range(T):
            total = torch.zeros((), dtype=torch.float32)
            for h in range(H):
                x = torch.zeros((), dtype=torch.float32)
                for d in range(D):
                    x = x + qf[0, s, h, d] * kf[0, t, d]
                total = total + w[0, s, h] * torch.relu(x)
            assert got[0, s, t].view(torch.int32) == (total * scale[0, t] + bias[0, s, t]).view(torch.int32)


def test_fp8_inputs_are_checked_with_their_scales():
    q8, k8, w = torch.zeros(1, 2, 3, 32, dtype=FP8), torch.zeros(1, 5, 32, dtype=FP8), torch.zeros(1, 2, 3)
    with pytest.raises(TypeError, match="need their key_scale"):
        dense_topk(q8, k8, w, 2)
    with pytest.raises(TypeError, match="q: expected dtype float8_e4m3fn"):
        dense_topk(q8.float(), k8, w, 2, key_scale=torch.ones(1, 5))
    with pytest.raises(ValueError, match=r"key_scale: expected shape \[B,T\] = \(1, 5\)"):
        dense_topk(q8, k8, w, 2, key_scale=torch.ones(1, 4))
    with pytest.raises(TypeError, match="key_scale: expected None or a float32"):
        dense_topk(q8, k8, w, 2, key_scale=torch.ones(1, 5, dtype=torch.float64))
    with pytest.raises(TypeError, match="weights: expected dtype float32 with FP8"):
        dense_topk(q8, k8, w.bfloat16(), 2, key_scale=torch.ones(1, 5))


def assert_certified_equals_dense(q8, k8, w, topk, mask, scale, config=None, min_pruned=None):
    stats = TopkStats()
    got = certified_topk(q8, k8, w, topk, mask, key_scale=scale, config=config, stats=stats)
    want = dense_topk(q8, k8, w, topk, mask, key_scale=scale)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)
    assert torch.equal(got[1], want[1])
    if min_pruned is not None:
        assert stats.pruned_frac >= min_pruned
    return stats.summary()


@pytest.mark.parametrize("precision", ["fp8", "fp8_unrotated"])
def test_certified_equals_dense_on_quantised_structured_inputs_and_prunes(precision):
    S, T = 48, 1536
    q, k, w, _ = structured_indexer_inputs(1, S, T, 8, 32, dtype=torch.bfloat16)
    mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]
    q8, k8, w8, scale = quantize_indexer_inputs(q, k, w, precision)
    summary = assert_certified_equals_dense(q8, k8, w8, 64, mask, scale, min_pruned=0.5)
    assert sum(summary["fallbacks"].values()) == 0


def small_integer_inputs(S, T, H, D, seed):
    """E4M3 q, k from {-2..2}, integer weights: every sum exact, scores tie everywhere."""
    g = torch.Generator().manual_seed(seed)
    q8 = torch.randint(-2, 3, (1, S, H, D), generator=g).float().to(FP8)
    k8 = torch.randint(-2, 3, (1, T, D), generator=g).float().to(FP8)
    w = torch.randint(-2, 3, (1, S, H), generator=g).float()
    return q8, k8, w


@pytest.mark.parametrize("r", [None, 4])
def test_ties_with_equal_power_of_two_scales(r):
    """Exact slack (r = H: every head retained, the bound is the score in real arithmetic) and ties
    at the threshold: only the margin and the up-rounded scale step keep the boundary keys."""
    q8, k8, w = small_integer_inputs(40, 600, 4, 32, seed=3)
    scale = torch.full((1, 600), 2.0**-7)
    config = CertifiedTopkConfig(r=r, anchor_stride=8, window=64, sink=8)
    assert_certified_equals_dense(q8, k8, w.abs() if r else w, 50, None, scale, config)


def test_extreme_and_overflowing_scales_with_an_additive_mask():
    q8, k8, w = small_integer_inputs(32, 700, 4, 32, seed=4)
    g = torch.Generator().manual_seed(5)
    scale = 2.0 ** torch.randint(-100, 100, (1, 700), generator=g).float()
    scale[0, ::97] = 2.0**125  # scores overflow to +-inf there
    bias = torch.randn(1, 32, 700, generator=g).round().masked_fill(torch.rand(1, 32, 700, generator=g) < 0.2,
                                                                     float("-inf"))
    config = CertifiedTopkConfig(anchor_stride=8, window=64, sink=8)
    summary = assert_certified_equals_dense(q8, k8, w, 40, bias, scale, config)
    assert summary["fallbacks"]["nonfinite"] == 0


def test_non_finite_values_and_bad_scales_send_their_queries_to_dense_scoring():
    q8, k8, w = small_integer_inputs(32, 500, 4, 32, seed=6)
    scale = torch.rand(1, 500, generator=torch.Generator().manual_seed(7)) + 0.5
    q8[0, 5, 1, 3] = float("nan")
    k8[0, 100, 0] = float("nan")
    scale[0, 200] = 0.0
    scale[0, 300] = -1.0
    scale[0, 400] = float("inf")
    mask = torch.ones(32, 500, dtype=torch.bool).tril(500 - 32)[None]
    mask[0, :16, 100:] = False  # queries 0-15 see none of the bad keys
    config = CertifiedTopkConfig(anchor_stride=8, window=16, sink=8)
    summary = assert_certified_equals_dense(q8, k8, w, 30, mask, scale, config)
    assert summary["fallbacks"]["nonfinite"] == 16 + 1  # queries 16-31 see the bad keys; query 5 has a NaN
