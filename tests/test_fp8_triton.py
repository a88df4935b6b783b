"""The FP8 scorer and the certified pipeline on E4M3 operands, in Triton (here under TRITON_INTERPRET=1):
the interpreter's sequential form is runtime.dense_scorer's FP8 scorer bitwise; the GPU form (one FP8
``tl.dot`` with promotion, ``fma`` by the key scale) computes the same codes where every sum is exact;
the certified path equals the dense one bitwise, prunes, and reads FP8 key-cache views in place."""
import pytest
import torch

from compiler.lowering import dsa_score_triton as scorer
from compiler.lowering.certified_topk_triton import _all_keys, certified_topk_cuda, dense_topk_cuda
from runtime.certified_topk import CertifiedTopkConfig, TopkStats
from runtime.dense_scorer import dense_topk, masked_scores
from runtime.fp8_key_cache import Fp8KeyCache
from runtime.fp8_quant import quantize_indexer_inputs, quantize_queries
from runtime.indexer_inputs import check_indexer_inputs
from runtime.structured_indexer import structured_indexer_inputs

FP8 = torch.float8_e4m3fn
CERTIFIED = CertifiedTopkConfig(path="certified", anchor_stride=16, workspace_frac=0.1)


def masks(S, T, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.rand(1, S, T, generator=g) < 0.25
    additive = torch.randn(1, S, T, generator=g).round().masked_fill(hidden, float("-inf"))
    return {"none": None, "bool": ~hidden, "additive": additive}


def every_code(q8, w, k8, scale, mask):
    """(dense codes, key-list codes) of every key for every query."""
    T = k8.shape[1]
    dense = scorer.score_dense(q8, w, k8, mask=mask, k_scale=scale)
    listed = scorer.score_keys(q8, w, k8, *_all_keys(1, T, q8.device), cap=T, tiles_per_list=1 << 30, mask=mask,
                               k_scale=scale)
    return dense, listed


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_kernels_compute_the_runtime_fp8_scorer_bitwise(mask_kind):
    g = torch.Generator().manual_seed(0)
    S, T, H, D = 8, 80, 3, 32
    q, k, w = torch.randn(1, S, H, D, generator=g), torch.randn(1, T, D, generator=g) * 5, torch.randn(1, S, H, generator=g)
    q8, k8, w8, scale = quantize_indexer_inputs(q, k, w)
    mask = masks(S, T, 1)[mask_kind]
    dense, listed = every_code(q8, w8, k8, scale, mask)
    assert torch.equal(dense, listed)
    values, _ = scorer.decode_codes(dense, T)
    want = masked_scores(check_indexer_inputs(q8, k8, w8, 4, mask, scale))
    assert torch.equal(values.view(torch.int32), (want + 0.0).view(torch.int32))  # -0.0 is folded


def test_gpu_form_of_the_kernels_on_exact_sums(monkeypatch):
    """SEQUENTIAL off: the FP8 tl.dot (max_num_imprecise_acc), fma by the scale and the head sum by
    tl.sum run in the interpreter; with small integer E4M3 values and power-of-two scales every sum is
    exact in any order, so the codes are the reference's bitwise (the index, scale and mask logic)."""
    monkeypatch.setattr(scorer, "SEQUENTIAL", False)
    g = torch.Generator().manual_seed(2)
    S, T, H, D = 8, 70, 4, 32
    q8 = torch.randint(-3, 4, (1, S, H, D), generator=g).float().to(FP8)
    k8 = torch.randint(-3, 4, (1, T, D), generator=g).float().to(FP8)
    w = torch.randint(-2, 3, (1, S, H), generator=g).float()
    scale = 2.0 ** torch.randint(-8, 8, (1, T), generator=g).float()
    mask = masks(S, T, 3)["additive"]
    dense, listed = every_code(q8, w, k8, scale, mask)
    assert torch.equal(dense, listed)
    values, _ = scorer.decode_codes(dense, T)
    want = masked_scores(check_indexer_inputs(q8, k8, w, 4, mask, scale))
    assert torch.equal(values.view(torch.int32), (want + 0.0).view(torch.int32))


def test_fp8_operands_are_checked():
    q8, k8, w = torch.zeros(1, 2, 3, 32, dtype=FP8), torch.zeros(1, 5, 32, dtype=FP8), torch.zeros(1, 2, 3)
    with pytest.raises(TypeError, match="k_scale: float8_e4m3fn q and k"):
        scorer.score_dense(q8, w, k8)
    with pytest.raises(TypeError, match="q, k: expected float8_e4m3fn"):
        scorer.score_dense(q8.bfloat16(), w, k8, k_scale=torch.ones(1, 5))
    with pytest.raises(ValueError, match="k_scale: expected float32"):
        scorer.score_dense(q8, w, k8, k_scale=torch.ones(1, 4))
    with pytest.raises(ValueError, match="power of two >= 32"):
        scorer.score_dense(q8[..., :16], w, k8[..., :16], k_scale=torch.ones(1, 5))


def structured_fp8(S, T):
    q, k, w, _ = structured_indexer_inputs(1, S, T, 4, 32, positive_heads=1, dtype=torch.bfloat16)
    mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]
    return (*quantize_indexer_inputs(q, k, w), mask)


def test_certified_equals_dense_and_the_reference_and_prunes():
    q8, k8, w8, scale, mask = structured_fp8(16, 1024)
    want = dense_topk(q8, k8, w8, 32, mask, key_scale=scale)
    dense = dense_topk_cuda(q8, k8, w8, 32, mask, k_scale=scale)
    stats, trace = TopkStats(), []
    got = certified_topk_cuda(q8, k8, w8, 32, mask, k_scale=scale, config=CERTIFIED, stats=stats, trace=trace)
    for out in (dense, got):
        assert torch.equal(out[1], want[1]) and torch.equal(out[0].view(torch.int32), want[0].view(torch.int32))
    assert stats.pruned_frac > 0.5 and not bool(trace[0].redo.any())


def test_a_bad_key_scale_turns_pruning_off_for_its_batch_row():
    q8, k8, w8, scale, mask = structured_fp8(16, 192)
    bad = scale.clone()
    bad[0, 7] = -bad[0, 7]
    trace = []
    got = certified_topk_cuda(q8, k8, w8, 32, mask, k_scale=bad, config=CERTIFIED, trace=trace)
    want = dense_topk_cuda(q8, k8, w8, 32, mask, k_scale=bad)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0].view(torch.int32), want[0].view(torch.int32))
    assert bool(torch.isneginf(trace[0].tau).all())


def test_key_cache_views_are_read_in_place_by_the_pipeline():
    """Two batch rows: the cache's keys [2, T, D] are a strided view of its storage."""
    g = torch.Generator().manual_seed(4)
    S, T, H, D = 8, 150, 4, 32
    q, w = torch.randn(2, S, H, D, generator=g), torch.randn(2, S, H, generator=g)
    k = torch.randn(2, T, D, generator=g)
    cache = Fp8KeyCache("fp8")
    cache.append(k[:, :100])
    keys, scales = cache.append(k[:, 100:])  # storage for 200 keys
    assert not keys.is_contiguous()
    q8, w8 = quantize_queries(q, w, "fp8")
    config = CertifiedTopkConfig(path="certified", anchor_stride=16, workspace_frac=0.2)
    got = certified_topk_cuda(q8, keys, w8, 16, k_scale=scales, config=config)
    want = dense_topk(q8, keys.contiguous(), w8, 16, key_scale=scales.contiguous())
    assert torch.equal(got[1], want[1]) and torch.equal(got[0].view(torch.int32), want[0].view(torch.int32))
