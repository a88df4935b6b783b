"""The two-interval attention reference against independent float64 brute force and SDPA."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import runtime.attention_reference as reference
from runtime import defaults
from runtime.attention_reference import two_interval_attention


def brute_force(q, k, v, prefix_end, segment_start, scale, q_start):
    """Query-by-query float64 attention written from the two-interval rule."""
    b, hq, sq, d = q.shape
    group = hq // k.shape[1]
    o = torch.zeros(b, hq, sq, d, dtype=torch.float64)
    lse = torch.full((b, hq, sq), -math.inf, dtype=torch.float64)
    for bi in range(b):
        for h in range(hq):
            for p in range(sq):
                keys = [j for j in range(k.shape[2])
                        if j < prefix_end[bi, p] or segment_start[bi, p] <= j <= q_start + p]
                if not keys:
                    continue
                kk = k[bi, h // group, keys].double()
                s = (kk @ q[bi, h, p].double()) * scale
                lse[bi, h, p] = torch.logsumexp(s, 0)
                o[bi, h, p] = torch.softmax(s, 0) @ v[bi, h // group, keys].double()
    return o, lse


def random_inputs(b=2, hq=4, hkv=2, sq=7, sk=11, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=g)
    k = torch.randn(b, hkv, sk, d, generator=g)
    v = torch.randn(b, hkv, sk, d, generator=g)
    return q, k, v


def test_two_interval_rule_matches_float64_brute_force_with_gqa():
    q, k, v = random_inputs()
    g = torch.Generator().manual_seed(1)
    prefix_end = torch.randint(0, 6, (2, 7), generator=g)
    segment_start = torch.randint(0, 11, (2, 7), generator=g)
    o, lse = two_interval_attention(q, k, v, prefix_end, segment_start, scale=0.3, q_start=3)
    want_o, want_lse = brute_force(q, k, v, prefix_end, segment_start, 0.3, 3)
    assert o.dtype == torch.float32 and lse.dtype == torch.float32
    torch.testing.assert_close(o.double(), want_o, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-6, rtol=1e-6)


def test_causal_special_case_equals_sdpa_is_causal():
    q, k, v = random_inputs(sq=5, sk=9)
    zeros = torch.zeros(2, 5, dtype=torch.int64)
    o, _ = two_interval_attention(q, k, v, zeros, zeros, scale=8 ** -0.5, q_start=4)
    mask = torch.ones(5, 9, dtype=torch.bool).tril(diagonal=4)
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                          attn_mask=mask)
    torch.testing.assert_close(o, want, atol=1e-6, rtol=1e-6)


def test_query_with_no_visible_key_gets_zero_output_and_minus_inf_lse():
    q, k, v = random_inputs(b=1, sq=3, sk=4)
    prefix_end = torch.tensor([[0, 2, 0]])
    segment_start = torch.tensor([[4, 4, 1]])  # query 0 and 1: empty segment interval
    o, lse = two_interval_attention(q, k, v, prefix_end, segment_start, scale=1.0, q_start=0)
    assert torch.equal(o[:, :, 0], torch.zeros_like(o[:, :, 0]))
    assert torch.all(lse[:, :, 0] == -math.inf)
    assert torch.all(torch.isfinite(lse[:, :, 1:]))


def test_bfloat16_inputs_give_bfloat16_output_and_fp32_lse():
    q, k, v = (t.bfloat16() for t in random_inputs())
    idx = torch.zeros(2, 7, dtype=torch.int32)
    o, lse = two_interval_attention(q, k, v, idx, idx, scale=0.5, q_start=4)
    want_o, want_lse = brute_force(q, k, v, idx, idx, 0.5, 4)
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
    torch.testing.assert_close(o.double(), want_o, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


def test_query_chunking_does_not_change_the_result(monkeypatch):
    q, k, v = random_inputs(sq=9, sk=12)
    g = torch.Generator().manual_seed(2)
    prefix_end = torch.randint(0, 12, (2, 9), generator=g)
    segment_start = torch.randint(0, 12, (2, 9), generator=g)
    whole = two_interval_attention(q, k, v, prefix_end, segment_start, scale=0.4, q_start=2)
    monkeypatch.setattr(defaults, "ATTENTION_QUERY_CHUNK", 2)
    chunked = two_interval_attention(q, k, v, prefix_end, segment_start, scale=0.4, q_start=2)
    torch.testing.assert_close(chunked[0], whole[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(chunked[1], whole[1], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("change, error, name", [
    (dict(q=torch.zeros(2, 3, 7, 8)), ValueError, "multiple"),
    (dict(k=torch.zeros(3, 2, 11, 8), v=torch.zeros(3, 2, 11, 8)), ValueError, "k must be"),
    (dict(v=torch.zeros(2, 2, 10, 8)), ValueError, "k and v"),
    (dict(prefix_end=torch.zeros(2, 6, dtype=torch.int64)), ValueError, "prefix_end"),
    (dict(segment_start=torch.zeros(2, 7)), TypeError, "segment_start"),
    (dict(q=torch.zeros(2, 4, 7, 8, dtype=torch.int64)), TypeError, "q must be"),
    (dict(scale=float("nan")), ValueError, "scale"),
    (dict(q_start=-1), ValueError, "q_start"),
])
def test_bad_inputs_raise_errors_naming_the_argument(change, error, name):
    q, k, v = random_inputs()
    args = dict(q=q, k=k, v=v, prefix_end=torch.zeros(2, 7, dtype=torch.int64),
                segment_start=torch.zeros(2, 7, dtype=torch.int64), scale=1.0, q_start=0)
    args.update(change)
    with pytest.raises(error, match=name):
        two_interval_attention(args.pop("q"), args.pop("k"), args.pop("v"),
                               args.pop("prefix_end"), args.pop("segment_start"), **args)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_key_spans_and_chunks_give_the_brute_force_answer_for_any_interval_bounds(data):
    """Bounds outside [0, Sk], empty intervals, whole chunks that see nothing, GQA, any chunking."""
    b, hkv, group = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3))
    sq, sk = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 12))
    q, k, v = random_inputs(b=b, hq=hkv * group, hkv=hkv, sq=sq, sk=sk, d=4, seed=data.draw(st.integers(0, 99)))
    bound = st.integers(-2, sk + 2)
    prefix_end = torch.tensor(data.draw(st.lists(st.lists(bound, min_size=sq, max_size=sq), min_size=b, max_size=b)))
    segment_start = torch.tensor(data.draw(st.lists(st.lists(bound, min_size=sq, max_size=sq),
                                                    min_size=b, max_size=b)))
    q_start = data.draw(st.integers(0, sk + 1))
    budget, min_chunk = defaults.ATTENTION_SCORE_BUDGET, defaults.ATTENTION_MIN_CHUNK
    defaults.ATTENTION_SCORE_BUDGET = hkv * group * sk * data.draw(st.integers(1, sq))
    defaults.ATTENTION_MIN_CHUNK = data.draw(st.integers(1, 4))
    try:
        chunks = reference.query_chunks(segment_start, data.draw(st.integers(1, sq)))
        o, lse = two_interval_attention(q, k, v, prefix_end, segment_start, scale=0.7, q_start=q_start)
    finally:
        defaults.ATTENTION_SCORE_BUDGET, defaults.ATTENTION_MIN_CHUNK = budget, min_chunk
    assert [start for start, _ in chunks] == [0] + [stop for _, stop in chunks[:-1]] and chunks[-1][1] == sq
    want_o, want_lse = brute_force(q, k, v, prefix_end, segment_start, 0.7, q_start)
    torch.testing.assert_close(o.double(), want_o, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-6, rtol=1e-6)
