"""The Triton two-interval attention kernel (under TRITON_INTERPRET=1) against the torch reference."""
import pytest
import torch

from compiler.lowering.attention.two_interval_attention import two_interval_attention_triton
from runtime.attention_reference import two_interval_attention

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0:DeprecationWarning")  # Triton interpreter internals

# Output tolerance per input dtype: the kernel and the reference both accumulate in fp32, so the
# gap is the final rounding of o to the input dtype (one unit in the last place of |o| <= ~3).
O_ATOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
LSE_ATOL = 1e-4


def random_qkv(b, hq, hkv, sq, sk, d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=gen).to(dtype)
    k = torch.randn(b, hkv, sk, d, generator=gen).to(dtype)
    v = torch.randn(b, hkv, sk, d, generator=gen).to(dtype)
    return q, k, v


def packed_spine_layout(lengths_spine, lengths_blocks, reads):
    """prefix_end/segment_start [1, P] for [spine (causal) ‖ block_0 ‖ ...]; block i reads reads[i]
    spine tokens."""
    spine = sum(lengths_spine)
    prefix_end, segment_start = [0] * spine, [0] * spine
    start = spine
    for length, read in zip(lengths_blocks, reads):
        prefix_end += [read] * length
        segment_start += [start] * length
        start += length
    return torch.tensor([prefix_end]), torch.tensor([segment_start])


def assert_matches_reference(q, k, v, prefix_end, segment_start, scale, q_start=0):
    o, lse = two_interval_attention_triton(q, k, v, prefix_end, segment_start,
                                           scale=scale, q_start=q_start)
    ref_o, ref_lse = two_interval_attention(q, k, v, prefix_end, segment_start,
                                            scale=scale, q_start=q_start)
    assert o.dtype == q.dtype and o.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=0, atol=LSE_ATOL)
    torch.testing.assert_close(o.float(), ref_o.float(), rtol=0, atol=O_ATOL[q.dtype])
    return o, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_causal_gqa_matches_reference_in_every_input_dtype(dtype):
    q, k, v = random_qkv(2, 4, 2, 37, 37, 16, dtype, seed=1)
    zeros = torch.zeros(2, 37, dtype=torch.int64)
    assert_matches_reference(q, k, v, zeros, zeros, scale=0.25)


def test_packed_spine_layout_matches_reference_including_partial_tiles():
    prefix_end, segment_start = packed_spine_layout([5, 6, 7], [19, 21, 9], reads=[0, 11, 18])
    p = prefix_end.shape[1]
    q, k, v = random_qkv(1, 4, 1, p, p, 16, torch.float32, seed=2)
    assert_matches_reference(q, k, v, prefix_end, segment_start, scale=0.3)


def test_queries_after_q_start_with_full_prefix_and_int32_bounds():
    sq, sk = 9, 45
    q, k, v = random_qkv(1, 2, 2, sq, sk, 16, torch.float32, seed=3)
    prefix_end = torch.full((1, sq), sk, dtype=torch.int32)
    segment_start = torch.full((1, sq), sk, dtype=torch.int32)
    o, _ = assert_matches_reference(q, k, v, prefix_end, segment_start, scale=0.2, q_start=sk - sq)
    # prefix_end = Sk lets every query see every key: the rows are identical to plain softmax.
    dense = torch.softmax((q @ k.transpose(-1, -2)) * 0.2, dim=-1) @ v
    torch.testing.assert_close(o, dense, rtol=0, atol=1e-5)


def test_query_without_visible_keys_gets_zero_output_and_minus_infinite_lse():
    sq = 20
    q, k, v = random_qkv(1, 2, 1, sq, sq, 16, torch.float32, seed=4)
    prefix_end = torch.zeros(1, sq, dtype=torch.int64)
    segment_start = torch.zeros(1, sq, dtype=torch.int64)
    segment_start[0, 3:7] = sq  # rows 3..6: empty second interval, empty first interval
    o, lse = assert_matches_reference(q, k, v, prefix_end, segment_start, scale=0.25)
    assert torch.all(o[:, :, 3:7] == 0)
    assert torch.all(torch.isneginf(lse[:, :, 3:7]))
    assert torch.isfinite(lse[:, :, :3]).all() and torch.isfinite(lse[:, :, 7:]).all()


def test_non_power_of_two_head_dim_and_strided_inputs():
    b, s, hq, hkv, d = 1, 26, 4, 2, 24
    gen = torch.Generator().manual_seed(5)
    # [B, S, H, D] storage viewed as [B, H, S, D], as attention modules usually produce it.
    q = torch.randn(b, s, hq, d, generator=gen).transpose(1, 2)
    k = torch.randn(b, s, hkv, d, generator=gen).transpose(1, 2)
    v = torch.randn(b, s, hkv, d, generator=gen).transpose(1, 2)
    assert not q.is_contiguous()
    segment_start = torch.tensor([[0] * 10 + [10] * 16])
    prefix_end = torch.tensor([[0] * 10 + [4] * 16])
    assert_matches_reference(q, k, v, prefix_end, segment_start, scale=d ** -0.5)


@pytest.mark.parametrize("seed", range(4))
def test_arbitrary_per_row_bounds_match_reference(seed):
    # Unsorted, out-of-range and empty intervals: the tile ranges (whole, partial, skipped) are
    # derived from row minima and maxima, which must stay right for any bounds.
    gen = torch.Generator().manual_seed(100 + seed)
    sq, sk = 40, 70
    q_start = int(torch.randint(0, sk - sq + 10, (1,), generator=gen))
    q, k, v = random_qkv(1, 2, 1, sq, sk, 16, torch.float32, seed=200 + seed)
    prefix_end = torch.randint(-5, sk + 5, (1, sq), generator=gen)
    segment_start = torch.randint(-5, sk + 5, (1, sq), generator=gen)
    assert_matches_reference(q, k, v, prefix_end, segment_start, scale=0.3, q_start=q_start)


def test_key_tiles_outside_both_intervals_are_never_read():
    # Queries at keys 128..191 see [0, 64) and [128, own position]: keys 64..127 are invisible to
    # the whole query tile. Poisoning them with NaN changes nothing only if their tiles are
    # skipped (a loaded, masked NaN value would still give 0 * NaN = NaN in p @ v).
    sq, sk = 64, 192
    q, k, v = random_qkv(1, 2, 1, sq, sk, 16, torch.float32, seed=6)
    prefix_end = torch.full((1, sq), 64)
    segment_start = torch.full((1, sq), 128)
    clean = two_interval_attention(q, k, v, prefix_end, segment_start, scale=0.25, q_start=128)
    k[:, :, 64:128] = float("nan")
    v[:, :, 64:128] = float("nan")
    o, lse = two_interval_attention_triton(q, k, v, prefix_end, segment_start,
                                           scale=0.25, q_start=128)
    torch.testing.assert_close(o, clean[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(lse, clean[1], rtol=0, atol=LSE_ATOL)


def test_repeated_runs_are_bitwise_identical():
    q, k, v = random_qkv(1, 2, 1, 33, 33, 16, torch.bfloat16, seed=7)
    zeros = torch.zeros(1, 33, dtype=torch.int64)
    first = two_interval_attention_triton(q, k, v, zeros, zeros, scale=0.25)
    second = two_interval_attention_triton(q, k, v, zeros, zeros, scale=0.25)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_custom_op_passes_opcheck():
    q, k, v = random_qkv(1, 2, 1, 17, 17, 16, torch.float32, seed=8)
    zeros = torch.zeros(1, 17, dtype=torch.int64)
    torch.library.opcheck(torch.ops.pulsar_dosa.two_interval_attention_triton,
                          (q, k, v, zeros, zeros, 0.25, 0),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("change, error, words", [
    (dict(q=torch.zeros(1, 2, 4, 16, dtype=torch.float64)), TypeError, "q must be bfloat16"),
    (dict(k=torch.zeros(1, 1, 4, 16, dtype=torch.float16)), TypeError, "k must have q's dtype"),
    (dict(v=torch.zeros(1, 1, 5, 16)), ValueError, "k and v"),
    (dict(prefix_end=torch.zeros(1, 3, dtype=torch.int64)), ValueError, "prefix_end"),
    (dict(segment_start=torch.zeros(1, 4)), TypeError, "segment_start"),
    (dict(scale="0.25"), TypeError, "scale"),
    (dict(q_start=-1), ValueError, "q_start"),
])
def test_bad_inputs_raise_errors_naming_the_argument(change, error, words):
    args = dict(q=torch.zeros(1, 2, 4, 16), k=torch.zeros(1, 1, 4, 16), v=torch.zeros(1, 1, 4, 16),
                prefix_end=torch.zeros(1, 4, dtype=torch.int64),
                segment_start=torch.zeros(1, 4, dtype=torch.int64), scale=0.25, q_start=0)
    args.update(change)
    with pytest.raises(error, match=words):
        two_interval_attention_triton(args.pop("q"), args.pop("k"), args.pop("v"),
                                      args.pop("prefix_end"), args.pop("segment_start"), **args)
