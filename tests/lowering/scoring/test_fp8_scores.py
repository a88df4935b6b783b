"""The FP8 scorer's kernels on E4M3 operands (here under TRITON_INTERPRET=1): the interpreter's
sequential form is runtime.dense_scorer's FP8 scorer bitwise; the GPU form (one FP8 ``tl.dot`` with
promotion, ``fma`` by the key scale) computes the same codes where every sum is exact; bad FP8
operands are clear errors."""
import pytest
import torch

from compiler.lowering import defaults
from compiler.lowering.order_codes import decode_codes
from compiler.lowering.scoring import indexer_scores as scorer
from compiler.lowering.topk_pipeline import _all_keys
from runtime.dense_scorer import masked_scores
from runtime.fp8_quant import quantize_indexer_inputs
from runtime.indexer_inputs import check_indexer_inputs

FP8 = torch.float8_e4m3fn


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
@pytest.mark.parametrize("columns", [4, 32])
def test_kernels_compute_the_runtime_fp8_scorer_bitwise(mask_kind, columns, monkeypatch):
    """In programs of one query (4 columns at 3 heads) and of eight, the FP8 scorer's own tile."""
    monkeypatch.setattr(defaults, "FP8_PRODUCT_COLUMNS", columns)
    assert scorer.score_tile_shape(3, FP8) == (columns // 4, 4)
    g = torch.Generator().manual_seed(0)
    S, T, H, D = 8, 80, 3, 32
    q, k, w = torch.randn(1, S, H, D, generator=g), torch.randn(1, T, D, generator=g) * 5, torch.randn(1, S, H, generator=g)
    q8, k8, w8, scale = quantize_indexer_inputs(q, k, w)
    mask = masks(S, T, 1)[mask_kind]
    dense, listed = every_code(q8, w8, k8, scale, mask)
    assert torch.equal(dense, listed)
    values, _ = decode_codes(dense, T)
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
    values, _ = decode_codes(dense, T)
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
