"""The certified pipeline on E4M3 operands (here under TRITON_INTERPRET=1): it equals the dense one and
the plain-torch reference bitwise and prunes, a bad key scale turns pruning off for its batch row,
and FP8 key-cache views are read in place."""
import pytest
import torch

from compiler.lowering import defaults
from compiler.lowering.scoring.indexer_scores import score_tile_shape
from compiler.lowering.topk_pipeline import certified_topk_cuda, dense_topk_cuda
from runtime.certified_topk import CertifiedTopkConfig, TopkStats
from runtime.dense_scorer import dense_topk
from runtime.fp8_key_cache import Fp8KeyCache
from runtime.fp8_quant import quantize_indexer_inputs, quantize_queries
from runtime.structured_indexer import structured_indexer_inputs

CERTIFIED = CertifiedTopkConfig(path="certified", anchor_stride=16, workspace_frac=0.1)


def structured_fp8(S, T):
    q, k, w, _ = structured_indexer_inputs(1, S, T, 4, 32, positive_heads=1, dtype=torch.bfloat16)
    mask = torch.ones(S, T, dtype=torch.bool).tril(T - S)[None]
    return (*quantize_indexer_inputs(q, k, w), mask)


@pytest.mark.parametrize("fp8_columns", [None, 8])
def test_certified_equals_dense_and_the_reference_and_prunes(fp8_columns, monkeypatch):
    """Also where the FP8 scorer's tile (8 columns: two queries of 4 heads) is narrower than the
    bf16 tile the pipeline's lists and rounds are counted in."""
    if fp8_columns is not None:
        monkeypatch.setattr(defaults, "FP8_PRODUCT_COLUMNS", fp8_columns)
        assert score_tile_shape(4, torch.float8_e4m3fn)[0] < score_tile_shape(4)[0]
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
