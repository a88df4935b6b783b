"""The plain-torch sparse attention reference against the dense masked chains transformers runs.

The dense oracle is built as transformers' DSA layers build it: the index mask
``ones.scatter(-1, indices, False)`` (indices out of [0, T) dropped first: transformers never emits
them, FlashMLA-style -1 padding selects nothing), combined with the model's bool mask and run
through ``F.scaled_dot_product_attention`` (bool mask: a row with no visible key gives 0) or the
eager chain with an additive ``finfo.min`` mask (such a row gives the mean of v over all keys).
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from runtime.union_attention import selected_keys, sparse_attention

LOWEST = torch.finfo(torch.float32).min


def index_mask(indices, num_keys):
    """[B, 1, S, T] bool, True = not selected (the scatter transformers writes)."""
    b, s, _ = indices.shape
    valid = (indices >= 0) & (indices < num_keys)
    safe = torch.where(valid, indices.long(), torch.zeros((), dtype=torch.long))
    hit = torch.zeros(b, s, num_keys, dtype=torch.long).scatter_add(-1, safe, valid.long())
    return (hit == 0).unsqueeze(1)


def dense_sdpa(q, k, v, indices, mask, scale):
    visible = ~index_mask(indices, k.shape[2])
    if mask is not None:
        visible = visible & mask
    group = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                          attn_mask=visible, scale=scale)


def dense_eager(q, k, v, indices, mask, scale):
    additive = torch.where(mask, 0.0, LOWEST)
    additive = additive.masked_fill(index_mask(indices, k.shape[2]), LOWEST)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    weights = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * scale + additive, dim=-1, dtype=torch.float32)
    return torch.matmul(weights, v)


def inputs(b, hq, hkv, s, t, width, dqk=24, dv=16, seed=0, low=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, s, dqk, generator=g)
    k = torch.randn(b, hkv, t, dqk, generator=g)
    v = torch.randn(b, hkv, t, dv, generator=g)
    indices = torch.randint(low, t, (b, s, width), generator=g)
    return q, k, v, indices


def causal(b, s, t):
    """Causal bool mask of S queries ending at key T-1 (decode / chunked prefill when S < T)."""
    q_pos = torch.arange(t - s, t)[:, None]
    return (torch.arange(t)[None, :] <= q_pos).expand(b, 1, s, t)


def test_matches_sdpa_with_gqa_mla_dims_and_causal_prefill():
    q, k, v, indices = inputs(2, 4, 2, 20, 20, 6)
    mask = causal(2, 20, 20)
    out, lse = sparse_attention(q, k, v, indices, mask, scale=0.3)
    torch.testing.assert_close(out, dense_sdpa(q, k, v, indices, mask, 0.3), rtol=0, atol=1e-5)
    assert out.shape == (2, 4, 20, 16) and lse.shape == (2, 4, 20) and lse.dtype == torch.float32


@pytest.mark.parametrize("s,t", [(1, 33), (5, 40)])
def test_decode_and_chunked_prefill_with_a_cache(s, t):
    q, k, v, indices = inputs(1, 2, 2, s, t, 9, seed=s)
    mask = causal(1, s, t)
    out, _ = sparse_attention(q, k, v, indices, mask, scale=0.25)
    torch.testing.assert_close(out, dense_sdpa(q, k, v, indices, mask, 0.25), rtol=0, atol=1e-5)


def test_repeated_and_out_of_range_indices_select_each_key_once():
    q, k, v, indices = inputs(1, 2, 1, 6, 12, 10, seed=3, low=-3)
    indices[0, 0] = torch.tensor([4, 4, 4, -1, 11, 11, 12, 99, -7, 0])
    out, lse = sparse_attention(q, k, v, indices, None, scale=0.5)
    torch.testing.assert_close(out, dense_sdpa(q, k, v, indices, None, 0.5), rtol=0, atol=1e-5)
    keys, visible = selected_keys(indices[:, :1], 12, None)
    assert sorted(keys[visible].tolist()) == [0, 4, 11]
    scores = (q[0, :, 0] @ k[0, 0, [0, 4, 11]].T) * 0.5
    torch.testing.assert_close(lse[0, :, 0], torch.logsumexp(scores, dim=-1), rtol=0, atol=1e-5)


def test_rows_without_a_visible_key_are_zero_or_the_mean_of_every_value():
    q, k, v, indices = inputs(2, 2, 2, 7, 7, 3, seed=4)
    mask = causal(2, 7, 7).clone()
    mask[1, 0, :3] = False  # left padding: three query rows see nothing
    mask[1, 0, :, :3] = False
    zero, lse = sparse_attention(q, k, v, indices, mask, scale=0.4, masked_rows="zero")
    mean, _ = sparse_attention(q, k, v, indices, mask, scale=0.4, masked_rows="mean")
    torch.testing.assert_close(zero, dense_sdpa(q, k, v, indices, mask, 0.4), rtol=0, atol=1e-5)
    torch.testing.assert_close(mean, dense_eager(q, k, v, indices, mask, 0.4), rtol=0, atol=1e-5)
    assert torch.isneginf(lse[1, :, :3]).all() and (zero[1, :, :3] == 0).all()
    torch.testing.assert_close(mean[1, :, 0], v[1].mean(dim=1), rtol=0, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), group=st.integers(1, 2), s=st.integers(1, 9),
       extra=st.integers(0, 9), width=st.integers(1, 12), seed=st.integers(0, 2 ** 16),
       broadcast=st.booleans(), masked_rows=st.sampled_from(["zero", "mean"]))
def test_property_equals_the_dense_masked_chain(b, hkv, group, s, extra, width, seed, broadcast, masked_rows):
    t = s + extra
    q, k, v, indices = inputs(b, hkv * group, hkv, s, t, width, dqk=8, dv=4, seed=seed, low=-2)
    g = torch.Generator().manual_seed(seed + 1)
    shape = (1, 1, 1, t) if broadcast else (b, 1, s, t)
    mask = torch.rand(shape, generator=g) < 0.7
    out, lse = sparse_attention(q, k, v, indices, mask, scale=0.6, masked_rows=masked_rows)
    dense = dense_sdpa if masked_rows == "zero" else dense_eager
    torch.testing.assert_close(out, dense(q, k, v, indices, mask.expand(b, 1, s, t), 0.6), rtol=0, atol=2e-5)
    _, visible = selected_keys(indices, t, mask)
    assert torch.equal(torch.isneginf(lse), ~visible.any(-1)[:, None].expand(b, hkv * group, s))


def poisoned_values(v):
    """v with inf, -inf and NaN in the value rows of keys 0, 1 and 2 (of every k/v head)."""
    v = v.clone()
    v[:, :, 0, 0] = float("inf")
    v[:, :, 1, 1] = float("-inf")
    v[:, :, 2, 2] = float("nan")
    return v


def test_a_key_that_is_not_attended_to_never_reaches_the_output():
    q, k, v, _ = inputs(1, 2, 1, 4, 12, 3, seed=6)
    k = k.clone()
    k[:, :, 2] = float("nan")  # a hidden key's k row may be poisoned too
    bad = poisoned_values(v)
    mask = torch.ones(1, 1, 4, 12, dtype=torch.bool)
    mask[..., 2] = False
    # Row 0: -1 padding, row 1: an index past T, row 2: key 2 hidden by the mask: none of these
    # keys is attended to. Row 3 attends to keys 0 and 1: its columns 0 and 1 become infinite.
    indices = torch.tensor([[[-1, 3, 5], [12, 3, 5], [2, 3, 5], [0, 1, 3]]])
    out, _ = sparse_attention(q, k, bad, indices, mask, scale=0.5)
    clean, _ = sparse_attention(q, k, v, torch.tensor([[[3, 5, -1]] * 4]), None, scale=0.5)
    torch.testing.assert_close(out[:, :, :3], clean[:, :, :3], rtol=0, atol=1e-6)
    assert torch.isfinite(out[:, :, :3]).all()
    assert torch.isinf(out[0, :, 3, 0]).all() and torch.isinf(out[0, :, 3, 1]).all()
    assert torch.isfinite(out[0, :, 3, 2:]).all()


def test_bfloat16_inputs_give_bfloat16_outputs_close_to_fp32():
    q, k, v, indices = inputs(1, 2, 2, 8, 16, 5, seed=5)
    out, _ = sparse_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), indices, None, scale=0.3)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), sparse_attention(q, k, v, indices, None, scale=0.3)[0],
                               rtol=0, atol=3e-2)


@pytest.mark.parametrize("change,message", [
    (dict(q=torch.zeros(1, 2, 3, 8, dtype=torch.int64)), "q, k, v must be floating-point"),
    (dict(k=torch.zeros(1, 2, 5, 7)), "k must be"),
    (dict(v=torch.zeros(1, 2, 4, 4)), "v must be"),
    (dict(k=torch.zeros(1, 3, 5, 8), v=torch.zeros(1, 3, 5, 4)), "multiple of k/v heads"),
    (dict(indices=torch.zeros(1, 3, 2)), "indices must be an int32 or int64"),
    (dict(indices=torch.zeros(1, 4, 2, dtype=torch.int64)), "indices must be"),
    (dict(mask=torch.ones(1, 1, 3, 5)), "mask must be a bool"),
    (dict(mask=torch.ones(1, 2, 3, 5, dtype=torch.bool)), "mask must be broadcastable"),
    (dict(scale=float("nan")), "scale must be finite"),
    (dict(masked_rows="nan"), "masked_rows must be one of"),
    (dict(scale=True), "scale must be a float"),
    (dict(q=torch.zeros(1, 2, 3, 8, dtype=torch.float64), k=torch.zeros(1, 2, 5, 8, dtype=torch.float64),
          v=torch.zeros(1, 2, 5, 4, dtype=torch.float64)), "q must be bfloat16, float16 or float32"),
    (dict(v=torch.zeros(1, 2, 5, 4, dtype=torch.float16)), "v must have q's dtype"),
    (dict(k=torch.zeros(1, 2, 5, 8, device="meta")), "k must be on q's device cpu"),
    (dict(mask=torch.ones(1, 1, 3, 5, dtype=torch.bool, device="meta")), "mask must be on q's device"),
    (dict(k=torch.zeros(1, 2, 1, 8).expand(1, 2, 2**31, 8), v=torch.zeros(1, 2, 1, 4).expand(1, 2, 2**31, 4)),
     "k: expected fewer than 2\\^31 keys T"),
    (dict(q=torch.zeros(1, 1, 1, 1).expand(1, 2, 2**31, 8),
          indices=torch.zeros(1, 1, 1, dtype=torch.int64).expand(1, 2**31, 2)), "q: expected fewer than 2\\^31 queries S"),
    (dict(q=torch.zeros(1, 1, 1, 1).expand(1, 2, 2**30, 8),
          indices=torch.zeros(1, 1, 1, dtype=torch.int64).expand(1, 2**30, 2**20)),
     "q, k, v, indices: B=1, Hq=2, S=1073741824, K=1048576 need about .* GiB of workspace on cpu"),
])
def test_bad_inputs_name_the_argument(change, message):
    args = dict(q=torch.zeros(1, 2, 3, 8), k=torch.zeros(1, 2, 5, 8), v=torch.zeros(1, 2, 5, 4),
                indices=torch.zeros(1, 3, 2, dtype=torch.int64), mask=None, scale=1.0, masked_rows="zero")
    args.update(change)
    with pytest.raises((TypeError, ValueError), match=message):
        sparse_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("indices"), args.pop("mask"),
                         **args)
