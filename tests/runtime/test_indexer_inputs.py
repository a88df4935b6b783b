"""check_indexer_inputs: normalisation of valid inputs and clear errors for invalid ones; checked_kk
(its check once per signature) answers as it does."""
import pytest
import torch

from runtime.indexer_inputs import check_indexer_inputs, checked_kk

B, S, T, H, D = 2, 3, 5, 4, 6


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, S, H, D, generator=g).to(dtype)
    k = torch.randn(B, T, D, generator=g).to(dtype)
    w = torch.randn(B, S, H, generator=g).to(dtype)
    return q, k, w


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_half_precision_inputs_are_upcast_exactly_to_float32(dtype):
    q, k, w = _inputs(dtype)
    x = check_indexer_inputs(q, k, w, 3)
    assert x.q.dtype == x.k.dtype == x.weights.dtype == torch.float32
    assert torch.equal(x.q.to(dtype), q) and torch.equal(x.k.to(dtype), k)
    assert torch.equal(x.weights.to(dtype), w)


def test_kk_is_topk_clipped_to_the_number_of_keys():
    q, k, w = _inputs()
    assert check_indexer_inputs(q, k, w, 3).kk == 3
    assert check_indexer_inputs(q, k, w, 100).kk == T
    assert check_indexer_inputs(q, k, w, 100).topk == 100


def test_empty_batch_query_or_key_dimensions_are_accepted():
    x = check_indexer_inputs(torch.zeros(0, 0, H, D), torch.zeros(0, 0, D), torch.zeros(0, 0, H), 3)
    assert x.kk == 0 and x.visible.shape == (0, 0, 0)


def test_no_mask_means_every_key_visible_and_no_bias():
    x = check_indexer_inputs(*_inputs(), 2)
    assert x.visible.shape == (B, S, T) and bool(x.visible.all()) and x.bias is None


def test_bool_mask_is_the_visibility_and_has_no_bias():
    mask = torch.rand(B, S, T, generator=torch.Generator().manual_seed(1)) > 0.5
    x = check_indexer_inputs(*_inputs(), 2, mask)
    assert torch.equal(x.visible, mask) and x.bias is None


def test_additive_mask_hides_minus_inf_and_keeps_other_values_as_bias():
    mask = torch.zeros(B, S, T, dtype=torch.bfloat16)
    mask[0, 0, 1] = float("-inf")
    mask[0, 1, 2] = -3.5
    mask[1, 2, 0] = float("nan")
    mask[1, 2, 3] = float("inf")
    x = check_indexer_inputs(*_inputs(), 2, mask)
    assert x.bias.dtype == torch.float32
    assert not x.visible[0, 0, 1] and int((~x.visible).sum()) == 1
    assert x.bias[0, 0, 1] == 0 and x.bias[0, 1, 2] == -3.5
    assert torch.isnan(x.bias[1, 2, 0]) and x.bias[1, 2, 3] == float("inf")


@pytest.mark.parametrize(
    "which, bad, error, words",
    [
        ("q", torch.zeros(B, S, H), ValueError, "q: expected 4 dimensions"),
        ("q", torch.zeros(B, S, 0, D), ValueError, "q: expected at least one head and one dimension"),
        ("q", torch.zeros(B, S, H, 0), ValueError, "q: expected at least one head and one dimension"),
        ("k", torch.zeros(B, T), ValueError, "k: expected 3 dimensions"),
        ("weights", torch.zeros(B, S), ValueError, "weights: expected 3 dimensions"),
        ("k", torch.zeros(B, T, D + 1), ValueError, "k: expected shape [B,T,D]"),
        ("k", torch.zeros(B + 1, T, D), ValueError, "k: expected shape [B,T,D]"),
        ("weights", torch.zeros(B, S, H + 1), ValueError, "weights: expected shape [B,S,H]"),
        ("weights", torch.zeros(B, S + 1, H), ValueError, "weights: expected shape [B,S,H]"),
        ("q", torch.zeros(B, S, H, D, dtype=torch.int32), TypeError, "q: expected dtype"),
        ("k", torch.zeros(B, T, D, dtype=torch.float64), TypeError, "k: expected dtype"),
        ("weights", torch.zeros(B, S, H, dtype=torch.bool), TypeError, "weights: expected dtype"),
        ("q", [[1.0]], TypeError, "q: expected a torch.Tensor"),
        ("mask", torch.zeros(B, S, T + 1, dtype=torch.bool), ValueError, "mask: expected shape"),
        ("mask", torch.zeros(B, S, T, dtype=torch.int64), TypeError, "mask: expected dtype"),
        ("mask", torch.zeros(B, S, T, dtype=torch.float64), TypeError, "mask: expected dtype"),
        ("mask", [[True]], TypeError, "mask: expected None or a torch.Tensor"),
        ("k", torch.zeros(B, T, D, device="meta"), ValueError, "k: expected device"),
        ("mask", torch.zeros(B, S, T, dtype=torch.bool, device="meta"), ValueError, "mask: expected device"),
    ],
)
@pytest.mark.parametrize("check", [check_indexer_inputs, checked_kk])
def test_malformed_argument_raises_an_error_naming_it(which, bad, error, words, check):
    q, k, w = _inputs()
    args = {"q": q, "k": k, "weights": w, "topk": 2, "mask": None}
    assert checked_kk(**args) == 2  # a good call at the same shapes first: errors are not cached away
    args[which] = bad
    for _ in range(2):
        with pytest.raises(error) as info:
            check(**args)
        assert words in str(info.value)


@pytest.mark.parametrize(
    "topk, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError), ("2", TypeError)]
)
@pytest.mark.parametrize("check", [check_indexer_inputs, checked_kk])
def test_topk_must_be_a_positive_int_and_not_a_bool(topk, error, check):
    with pytest.raises(error, match="topk: expected a positive int"):
        check(*_inputs(), topk)


def test_checked_kk_is_topk_clipped_to_the_keys_per_signature():
    q, k, w = _inputs()
    assert [checked_kk(q, k, w, t) for t in (2, 9, 2)] == [2, T, 2]
    assert checked_kk(q, k[:, :3], w, 9, torch.ones(B, S, 3, dtype=torch.bool)) == 3


@pytest.mark.parametrize("check", [check_indexer_inputs, checked_kk])
def test_sizes_the_kernels_cannot_index_and_absurd_topk_are_named(check):
    q, k, w = _inputs()
    long_k = k[:, :1].expand(B, 2**31, D)  # zero-stride views: the sizes cost no memory
    with pytest.raises(ValueError, match=r"k: expected fewer than 2\^31 keys T"):
        check(q, long_k, w, 2)
    many_q = q[:, :1].expand(B, 2**31, H, D)
    with pytest.raises(ValueError, match=r"q: expected fewer than 2\^31 queries S"):
        check(many_q, k, w[:, :1].expand(B, 2**31, H), 2)
    with pytest.raises(ValueError, match=r"topk: expected a positive int below 2\^63"):
        check(q, k, w, 2**70)


def test_a_workspace_beyond_the_memory_is_refused_before_the_mask_is_built():
    q = torch.zeros(1, 1, 1, 8).expand(1, 2**20, 1, 8)
    k = torch.zeros(1, 1, 8).expand(1, 2**20, 8)
    w = torch.zeros(1, 1, 1).expand(1, 2**20, 1)
    with pytest.raises(ValueError, match=r"q, k: B=1, S=1048576, T=1048576 need about .* GiB of workspace on cpu"):
        check_indexer_inputs(q, k, w, 4)
    assert checked_kk(q, k, w, 4) == 4  # shapes alone (meta tensors): no device, no memory to compare
