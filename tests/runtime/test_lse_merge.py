"""The LSE merge of attention partials over any split of the keys equals attention over the union."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from runtime.attention_reference import two_interval_attention
from runtime.lse_merge import merge_partials


def shard_partial(q, k, v, keys, q_start):
    """Causal attention of q over the key indices ``keys`` only (query p sees keys <= q_start + p)."""
    b, _, sq, _ = q.shape
    last = q_start + torch.arange(sq)
    visible_count = (keys.unsqueeze(0) <= last.unsqueeze(1)).sum(1)  # keys are ascending
    prefix_end = visible_count.expand(b, sq).contiguous()
    segment_start = torch.full((b, sq), len(keys), dtype=torch.int64)  # empty second interval
    return two_interval_attention(q, k[:, :, keys], v[:, :, keys], prefix_end, segment_start,
                                  scale=0.5, q_start=0)


@settings(max_examples=30, deadline=None)
@given(owner=st.lists(st.integers(0, 3), min_size=12, max_size=12), seed=st.integers(0, 2 ** 16))
def test_merge_of_any_split_equals_attention_over_the_union(owner, seed):
    """Keys dealt to 4 shards in any pattern (shards may be empty or fully masked for a query)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, 5, 8, generator=g)
    k = torch.randn(1, 2, 12, 8, generator=g)
    v = torch.randn(1, 2, 12, 8, generator=g)
    owner = torch.tensor(owner)
    parts = [shard_partial(q, k, v, torch.nonzero(owner == r).flatten(), q_start=7) for r in range(4)]
    o, lse = merge_partials(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    want_o, want_lse = shard_partial(q, k, v, torch.arange(12), q_start=7)
    torch.testing.assert_close(o, want_o, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, want_lse, atol=1e-6, rtol=1e-6)


def test_partials_with_minus_inf_lse_contribute_nothing_even_with_nan_outputs():
    o = torch.tensor([[1.0, 2.0], [float("nan"), float("nan")], [3.0, 5.0]])
    lse = torch.tensor([0.0, -math.inf, math.log(3.0)])
    out, merged = merge_partials(o, lse)
    torch.testing.assert_close(out, torch.tensor([2.5, 4.25]))
    torch.testing.assert_close(merged, torch.tensor(math.log(4.0)))


def test_all_minus_inf_gives_zero_output_and_minus_inf_lse():
    out, merged = merge_partials(torch.randn(3, 2, 4), torch.full((3, 2), -math.inf))
    assert torch.equal(out, torch.zeros(2, 4)) and torch.all(merged == -math.inf)


def test_huge_lse_values_do_not_overflow():
    """exp(1000) overflows fp32 and fp64; the merge weights never do."""
    o = torch.tensor([[1.0], [0.0]])
    lse = torch.tensor([1000.0, 1000.0 + math.log(3.0)])
    out, merged = merge_partials(o, lse)
    torch.testing.assert_close(out, torch.tensor([0.25]))
    torch.testing.assert_close(merged, torch.tensor(1000.0 + math.log(4.0)))


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_or_plus_inf_lse_propagates_as_nan(bad):
    out, merged = merge_partials(torch.ones(2, 1, 3), torch.tensor([[0.0], [bad]]))
    assert torch.isnan(out).all() and torch.isnan(merged).all()


def test_bfloat16_outputs_merge_in_fp32_and_return_bfloat16():
    o = torch.tensor([[1.0, -1.0], [3.0, 1.0]], dtype=torch.bfloat16)
    out, merged = merge_partials(o, torch.tensor([0.0, 0.0]))
    assert out.dtype == torch.bfloat16 and merged.dtype == torch.float32
    assert torch.equal(out, torch.tensor([2.0, 0.0], dtype=torch.bfloat16))


def test_bad_shapes_and_types_raise():
    with pytest.raises(ValueError, match="lses must have shape"):
        merge_partials(torch.zeros(2, 3, 4), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="at least one"):
        merge_partials(torch.zeros(0, 3, 4), torch.zeros(0, 3))
    with pytest.raises(TypeError, match="floating"):
        merge_partials(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.int64))
