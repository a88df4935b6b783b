"""THE SCORER and THE ORDER: layout-independent float32 rounding and the one tie-break."""
import numpy as np
import pytest
import torch

from runtime.dense_scorer import dense_topk, exact_scores, masked_scores, select_topk
from runtime.indexer_inputs import check_indexer_inputs

NAN, INF = float("nan"), float("inf")


def _numpy_scorer(q, w, k):
    """Independent float32 scorer: q [H,D], w [H], k [M,D] numpy float32 -> [M]."""
    x = np.zeros((q.shape[0], k.shape[0]), dtype=np.float32)
    for d in range(q.shape[1]):
        x = x + q[:, d, None] * k[None, :, d]
    s = np.zeros(k.shape[0], dtype=np.float32)
    for h in range(q.shape[0]):
        s = s + w[h] * np.maximum(x[h], np.float32(0))
    return s


def test_scores_match_an_independent_sequential_float32_scorer_bitwise():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(5, 7, 9, generator=g) * torch.logspace(-3, 3, 9)
    w = torch.randn(5, 7, generator=g)
    k = torch.randn(5, 11, 9, generator=g)
    got = exact_scores(q, w, k)
    for n in range(5):
        want = _numpy_scorer(q[n].numpy(), w[n].numpy(), k[n].numpy())
        assert np.array_equal(got[n].numpy().view(np.int32), want.view(np.int32))


def test_products_are_rounded_before_the_sum_so_no_fused_multiply_add():
    # fl(fl(a*a) - 1) differs from fma(a, a, -1) for a = 1 + 2^-12: a*a = 1 + 2^-11 + 2^-24.
    a = 1.0 + 2.0**-12
    q = torch.tensor([[[a, 1.0]]])
    k = torch.tensor([[[a, -1.0]]])
    score = exact_scores(q, torch.ones(1, 1), k)
    assert score.item() == np.float32(np.float32(a) * np.float32(a)) - np.float32(1.0)
    assert score.item() == 2.0**-11  # the fused result would keep the 2^-24 term


def test_score_of_a_key_does_not_depend_on_the_other_keys_or_on_broadcasting():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 3, 6, 8, generator=g)
    w = torch.randn(2, 3, 6, generator=g)
    k = torch.randn(2, 50, 8, generator=g)
    together = exact_scores(q, w, k[:, None])  # [2,3,50] broadcast keys
    for b in range(2):
        for s in range(3):
            alone = torch.stack([exact_scores(q[b, s][None], w[b, s][None], k[b, t][None, None])[0, 0]
                                 for t in range(50)])
            assert torch.equal(together[b, s], alone)


def test_masked_scores_of_selected_rows_equal_those_of_all_rows():
    g = torch.Generator().manual_seed(5)
    inputs = check_indexer_inputs(
        torch.randn(2, 4, 3, 5, generator=g), torch.randn(2, 9, 5, generator=g),
        torch.randn(2, 4, 3, generator=g), 3, torch.randn(2, 4, 9, generator=g),
    )
    full = masked_scores(inputs)
    b_idx, s_idx = torch.tensor([1, 0, 1]), torch.tensor([3, 2, 0])
    assert torch.equal(masked_scores(inputs, b_idx, s_idx), full[b_idx, s_idx])


def test_order_puts_nan_first_then_descending_values_with_lower_index_on_ties():
    values = torch.tensor([[1.0, NAN, INF, 2.0, 1.0, NAN, -0.0, 0.0]])
    visible = torch.ones_like(values, dtype=torch.bool)
    v, i = select_topk(values, visible, 8)
    assert i.tolist() == [[1, 5, 2, 3, 0, 4, 6, 7]]
    assert torch.isnan(v[0, :2]).all()
    assert torch.equal(v[0, 2:].view(torch.int32), values[0, i[0, 2:]].view(torch.int32))


def test_order_puts_visible_minus_inf_before_hidden_keys():
    values = torch.tensor([[-INF, -INF, -INF, 3.0]])
    visible = torch.tensor([[False, True, False, True]])
    _, i = select_topk(values, visible, 4)
    assert i.tolist() == [[3, 1, 0, 2]]


def test_row_with_fewer_visible_keys_than_topk_is_padded_with_hidden_keys_in_index_order():
    q = torch.ones(1, 1, 1, 1)
    k = torch.tensor([[[1.0], [5.0], [3.0], [2.0], [4.0]]])
    mask = torch.tensor([[[False, True, False, True, False]]])
    v, i = dense_topk(q, k, torch.ones(1, 1, 1), 4, mask)
    assert i.tolist() == [[[1, 3, 0, 2]]]
    assert v.tolist() == [[[5.0, 2.0, -INF, -INF]]]


def test_additive_mask_values_are_added_and_minus_inf_hides():
    q = torch.ones(1, 1, 1, 1)
    k = torch.tensor([[[1.0], [2.0], [3.0]]])
    mask = torch.tensor([[[10.0, -INF, 0.5]]])
    v, i = dense_topk(q, k, torch.ones(1, 1, 1), 3, mask)
    assert i.tolist() == [[[0, 2, 1]]] and v.tolist() == [[[11.0, 3.5, -INF]]]


def test_nan_in_a_query_ranks_its_visible_keys_first_in_index_order():
    q = torch.tensor([[[[NAN]]]])
    k = torch.tensor([[[1.0], [2.0], [3.0]]])
    mask = torch.tensor([[[True, False, True]]])
    v, i = dense_topk(q, k, torch.ones(1, 1, 1), 3, mask)
    assert i.tolist() == [[[0, 2, 1]]]
    assert torch.isnan(v[0, 0, :2]).all() and v[0, 0, 2] == -INF


def test_select_topk_rejects_kk_beyond_the_row_length():
    with pytest.raises(ValueError, match="kk: expected 0 <= kk <= 3"):
        select_topk(torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool), 4)


def test_zero_keys_give_empty_outputs():
    v, i = dense_topk(torch.ones(1, 2, 3, 4), torch.ones(1, 0, 4), torch.ones(1, 2, 3), 5)
    assert v.shape == (1, 2, 0) and i.shape == (1, 2, 0) and i.dtype == torch.int64
