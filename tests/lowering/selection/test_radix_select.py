"""The row-gated Triton top-K of int64 order codes (under TRITON_INTERPRET=1) against torch.topk,
with one program per row (splits=1, reading the codes or compacting them in place with
scratch=True) and with 2 or 5 programs sharing each row over uneven chunks (3 in the tests of views,
dead rows, unwritten codes and uneven splits)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.lowering.selection.radix_select import default_splits, select_top_codes

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0:DeprecationWarning")  # Triton interpreter internals

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
SENTINEL = 0x5E5E5E5E
LAYOUTS = [(1, False), (1, True), (2, False), (5, False)]
SPLITS = pytest.mark.parametrize("splits, scratch", LAYOUTS)
"""One program per row (reading, or compacting in place), and 2 or 5 programs per row. With block 16
the chunks are uneven: 2 programs take chunks of several blocks and a short last one, 5 take short
chunks and, on most rows here, empty ones; 3 programs (chunks of one or two blocks, a short last
one) would add no case of their own, so they run only in the tests below that name them."""


def select(codes, valid, kk, out=None, out_rows=None, *, block=16, splits, scratch):
    """select_top_codes on a copy of codes when it may overwrite them (scratch=True)."""
    source = codes.clone() if scratch else codes
    return select_top_codes(source, valid, kk, out, out_rows, block=block, splits=splits,
                            scratch=scratch)


def ranks_to_check(every, few, splits, scratch=False):
    """The split layout runs 18 launches per call under the interpreter, and scratch=True repeats
    the one-program checks in place: they check fewer ranks."""
    return every if splits == 1 and not scratch else few


def expected_top(codes, kk):
    return torch.topk(codes, kk, dim=-1, largest=True, sorted=True).values


def all_valid(rows):
    return torch.ones(rows, dtype=torch.bool)


def random_unique_codes(rows, n, seed):
    """Random int64 codes over the whole range; the seeds used give rows without repeats."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(INT64_MIN, INT64_MAX, (rows, n), dtype=torch.int64, generator=gen)
    assert all(torch.unique(r).numel() == n for r in codes)
    return codes


@pytest.mark.parametrize("scratch", [False, True])
@pytest.mark.parametrize("n, kk, block", [(1, 1, 16), (37, 5, 16), (300, 64, 64), (300, 17, 1024)])
def test_matches_torch_topk_on_random_unique_codes(n, kk, block, scratch):
    codes = random_unique_codes(3, n, seed=n + kk)
    out = select(codes, all_valid(3), kk, block=block, splits=1, scratch=scratch)
    assert out.shape == (3, kk) and out.dtype == torch.int64
    assert torch.equal(out, expected_top(codes, kk))


def test_order_codes_of_indexer_scores_select_the_top_keys():
    # high word: an fp32 score's order code, low word: T - 1 - key (as the scorer writes them)
    gen = torch.Generator().manual_seed(5)
    t = 200
    scores = torch.randn(2, t, generator=gen)
    bits = scores.view(torch.int32).to(torch.int64)
    high = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    codes = high * 2**32 + (t - 1 - torch.arange(t))
    out = select_top_codes(codes, all_valid(2), 9, block=32)
    keys = t - 1 - (out & 0xFFFFFFFF)
    assert torch.equal(keys, torch.topk(scores, 9, dim=-1).indices)


@SPLITS
def test_codes_sharing_all_high_bits_are_separated_by_their_low_bits(splits, scratch):
    base = torch.tensor(0x1234_5678_9ABC_DE00, dtype=torch.int64)
    codes = (base + torch.randperm(100, generator=torch.Generator().manual_seed(1))).reshape(1, 100)
    out = select(codes, all_valid(1), 7, block=16, splits=splits, scratch=scratch)
    assert torch.equal(out, expected_top(codes, 7))


@SPLITS
def test_codes_differing_only_in_the_lowest_bit(splits, scratch):
    pairs = torch.tensor([[v, v ^ 1] for v in (-6, 4, 2**40, -(2**40), 0)] * 4, dtype=torch.int64)
    codes = pairs.view(1, -1)[:, torch.randperm(40, generator=torch.Generator().manual_seed(2))]
    # descending: 4 copies each of 2**40 + 1, 2**40, 5, 4, 1, 0, ...;
    # kk = 5, 13, 21 stop inside a pair
    every = (1, 3, 4, 5, 8, 9, 12, 13, 20, 21, 39, 40)
    for kk in ranks_to_check(every, (4, 5, 13, 21), splits, scratch):
        out = select(codes, all_valid(1), kk, block=16, splits=splits, scratch=scratch)
        assert torch.equal(out, expected_top(codes, kk))


@SPLITS
def test_extreme_codes_and_mixed_signs_sort_in_signed_order(splits, scratch):
    row = torch.tensor([0, -1, 1, INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1,
                        -(2**62), 2**62, -(2**32), 2**32 - 1, 2**31, -(2**31),
                        INT64_MIN + 2, 3, -3, 2**40, INT64_MAX - 2], dtype=torch.int64)
    codes = torch.stack([row, row.flip(0)])
    n = row.numel()
    for kk in ranks_to_check((1, 2, 6, n - 1, n), (1, n - 1), splits, scratch):
        out = select(codes, all_valid(2), kk, block=16, splits=splits, scratch=scratch)
        assert torch.equal(out, expected_top(codes, kk)), kk


@SPLITS
def test_repeated_values_are_selected_as_a_multiset(splits, scratch):
    codes = torch.tensor([[3, 9, 3, 9, 3, 1, 9, 3] * 3,
                          ([INT64_MIN] * 5 + [2, INT64_MIN, 2]) * 3,
                          [INT64_MAX] * 24,
                          [7, 7, 7, INT64_MAX, 7, 7, INT64_MAX, 7] * 3], dtype=torch.int64)
    few = (1, 10, 24) if scratch else (10,)  # kk = 1 and kk = N on rows of one value
    for kk in ranks_to_check((1, 6, 7, 10, 22, 24), few, splits, scratch):
        out = select(codes, all_valid(4), kk, block=16, splits=splits, scratch=scratch)
        assert torch.equal(out, expected_top(codes, kk)), kk


@SPLITS
def test_kk_equal_to_n_sorts_the_whole_row_over_many_chunks(splits, scratch):
    codes = random_unique_codes(1, 70, seed=3)
    out = select(codes, all_valid(1), 70, block=16, splits=splits, scratch=scratch)
    assert torch.equal(out, codes.sort(dim=-1, descending=True).values)


def test_scratch_compaction_halving_the_candidates_at_every_pass_matches_torch_topk():
    # every 4-bit digit is 7 or 8, so each pass keeps about half of the candidates: with block 16
    # the compactions of passes 0..3 span several blocks, and values above the prefix range are
    # dropped (appended to out) at every pass
    gen = torch.Generator().manual_seed(9)
    bits = torch.randint(0, 2, (2, 256, 16), generator=gen)
    digits = (7 + bits) << (4 * torch.arange(16))
    codes = digits.sum(-1) ^ INT64_MIN  # repeats allowed: a multiset
    for kk in (1, 37, codes.shape[1]):
        out = select(codes, all_valid(2), kk, splits=1, scratch=True)
        assert torch.equal(out, expected_top(codes, kk)), kk


def test_scratch_leaves_invalid_rows_codes_and_out_rows_untouched():
    codes = random_unique_codes(4, 90, seed=10)
    valid = torch.tensor([True, False, True, False])
    source = codes.clone()
    out = torch.full((4, 8), SENTINEL, dtype=torch.int64)
    select_top_codes(source, valid, 8, out, block=16, splits=1, scratch=True)
    assert torch.equal(out[valid], expected_top(codes, 8)[valid])
    assert (out[~valid] == SENTINEL).all()
    assert torch.equal(source[~valid], codes[~valid])
    assert not torch.equal(source[valid], codes[valid])  # the valid rows were compacted


@pytest.mark.parametrize("splits, scratch", [(1, False), (3, True)])
def test_codes_are_not_written_without_scratch_or_with_several_programs_per_row(splits, scratch):
    codes = random_unique_codes(2, 60, seed=11)
    source = codes.clone()
    out = select_top_codes(source, all_valid(2), 5, block=16, splits=splits, scratch=scratch)
    assert torch.equal(out, expected_top(codes, 5))
    assert torch.equal(source, codes)


def test_scratch_on_a_strided_view_writes_inside_the_view_only():
    big = random_unique_codes(6, 70, seed=12)
    source = big.clone()
    view = source[::2, 3:68]
    out = select_top_codes(view, all_valid(3), 4, block=16, splits=1, scratch=True)
    assert torch.equal(out, expected_top(big[::2, 3:68], 4))
    outside = torch.ones_like(big, dtype=torch.bool)
    outside[::2, 3:68] = False
    assert torch.equal(source[outside], big[outside])


def test_a_wrong_kth_value_would_be_caught():
    codes = torch.tensor([[5, 1, 4, 2, 3]], dtype=torch.int64)
    out = select_top_codes(codes, all_valid(1), 3, block=16)
    assert out.tolist() == [[5, 4, 3]]
    wrong = out.clone()
    wrong[0, -1] = 2
    assert not torch.equal(wrong, expected_top(codes, 3))


@SPLITS
def test_invalid_rows_leave_out_untouched(splits, scratch):
    codes = random_unique_codes(5, 50, seed=4)
    valid = torch.tensor([False, True, False, True, False])
    out = torch.full((5, 6), SENTINEL, dtype=torch.int64)
    returned = select(codes, valid, 6, out, block=16, splits=splits, scratch=scratch)
    assert returned is out
    assert torch.equal(out[valid], expected_top(codes, 6)[valid])
    assert (out[~valid] == SENTINEL).all()


@pytest.mark.parametrize("splits, scratch", [(1, False), (1, True), (3, False)])
def test_dead_rows_change_no_output_even_with_entries_naming_live_destinations(splits, scratch):
    """Dead rows (valid False) skip every stage, stage 3's sort included, in each kernel that has
    it: live rows get their top kk, and the out rows no live row names keep their content."""
    codes = random_unique_codes(4, 40, seed=13)
    valid = torch.tensor([True, False, True, False])
    out_rows = torch.tensor([0, 0, 2, 2])  # dead rows' entries name live rows' destinations
    out = torch.full((4, 12), SENTINEL, dtype=torch.int64)
    select(codes, valid, 12, out, out_rows, block=16, splits=splits, scratch=scratch)
    assert torch.equal(out[[0, 2]], expected_top(codes, 12)[[0, 2]])
    assert (out[[1, 3]] == SENTINEL).all()


@SPLITS
def test_no_valid_row_writes_nothing(splits, scratch):
    codes = random_unique_codes(2, 20, seed=6)
    out = torch.full((2, 4), SENTINEL, dtype=torch.int64)
    select(codes, torch.zeros(2, dtype=torch.bool), 4, out, block=16, splits=splits, scratch=scratch)
    assert (out == SENTINEL).all()


@SPLITS
def test_out_rows_scatter_valid_rows_and_ignore_invalid_rows_entries(splits, scratch):
    codes = random_unique_codes(4, 40, seed=7)
    valid = torch.tensor([True, False, True, True])
    out_rows = torch.tensor([5, -99, 0, 2])  # the invalid row's entry is out of range: ignored
    out = torch.full((7, 3), SENTINEL, dtype=torch.int64)
    select(codes, valid, 3, out, out_rows, block=16, splits=splits, scratch=scratch)
    top = expected_top(codes, 3)
    assert torch.equal(out[5], top[0]) and torch.equal(out[0], top[2]) and torch.equal(out[2], top[3])
    assert (out[[1, 3, 4, 6]] == SENTINEL).all()


@pytest.mark.parametrize("splits", [1, 3])
def test_rows_of_a_strided_view_are_read_at_their_stride(splits):
    big = random_unique_codes(6, 30, seed=8)
    codes = big[::2, 3:28]
    out = select_top_codes(codes, all_valid(3), 4, block=16, splits=splits)
    assert torch.equal(out, expected_top(codes, 4))


@SPLITS
def test_zero_rows_return_an_empty_out(splits, scratch):
    codes = torch.zeros(0, 5, dtype=torch.int64)
    out = select(codes, torch.zeros(0, dtype=torch.bool), 2, splits=splits, scratch=scratch)
    assert out.shape == (0, 2)


@pytest.mark.parametrize("n, kk, splits",
                         [(37, 1, 5), (37, 37, 5), (1, 1, 3), (100, 20, 3), (100, 1, 2)])
def test_split_rows_with_uneven_or_empty_chunks_match_torch_topk(n, kk, splits):
    # block 16: 37 codes -> 3 blocks, so 5 splits give chunks of 16, 16, 5, 0, 0 codes;
    # 100 codes -> 7 blocks, 3 splits give 48, 48, 4; 2 splits give 64, 36
    codes = random_unique_codes(1, n, seed=n + 7 * kk)
    out = select_top_codes(codes, all_valid(1), kk, block=16, splits=splits)
    assert torch.equal(out, expected_top(codes, kk))


def test_default_splits_is_one_program_per_row_off_cuda():
    assert default_splits(1, 10**6, 16, torch.device("cpu")) == 1


@st.composite
def adversarial_rows(draw):
    """Rows whose codes share few distinct high words and low words, with extremes mixed in."""
    rows = draw(st.integers(1, 3))
    n = draw(st.integers(1, 80))
    highs = draw(st.lists(st.sampled_from([INT64_MIN >> 32, -1, 0, 1, 0x7FFF_FFFF, -0x8000_0000 + 1,
                                           0x1234]), min_size=1, max_size=3))
    lows = draw(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=4))
    values = [h * 2**32 + lo for h in highs for lo in lows] + [INT64_MIN, INT64_MAX]
    codes = draw(st.lists(st.lists(st.sampled_from(values), min_size=n, max_size=n),
                          min_size=rows, max_size=rows))
    kk = draw(st.integers(1, n))
    valid = draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
    splits, scratch = draw(st.sampled_from(LAYOUTS + [(4, True)]))
    return torch.tensor(codes, dtype=torch.int64), kk, torch.tensor(valid), splits, scratch


@settings(max_examples=16, deadline=None)
@given(adversarial_rows())
def test_property_valid_rows_equal_torch_topk_and_invalid_rows_stay_for_any_layout(case):
    codes, kk, valid, splits, scratch = case
    out = torch.full((codes.shape[0], kk), SENTINEL, dtype=torch.int64)
    source = codes.clone()
    select_top_codes(source, valid, kk, out, block=16, splits=splits, scratch=scratch)
    assert torch.equal(out[valid], expected_top(codes, kk)[valid])
    assert (out[~valid] == SENTINEL).all()
    written = valid if scratch and splits == 1 else torch.zeros_like(valid)
    assert torch.equal(source[~written], codes[~written])


@pytest.mark.parametrize("splits", [1, 2])
def test_int32_words_select_as_their_codes(splits):
    """Rows of int32 words stand for the codes (word << 32) + N - 1 - position: random words and
    repeated extreme words (ties broken by position), one program per row and two."""
    gen = torch.Generator().manual_seed(splits)
    words = torch.randint(-(2**31), 2**31, (4, 90), generator=gen).to(torch.int32)
    words[2:] = torch.tensor([-(2**31), 2**31 - 1, 3], dtype=torch.int32)[torch.randint(0, 3, (2, 90), generator=gen)]
    codes = (words.to(torch.int64) << 32) + torch.arange(89, -1, -1)
    valid = torch.tensor([True, False, True, True])
    out = select_top_codes(words, valid, 11, block=16, splits=splits)
    assert torch.equal(out[valid], expected_top(codes, 11)[valid])


def good_arguments():
    return dict(codes=torch.zeros(2, 8, dtype=torch.int64), valid=all_valid(2), kk=3)


@pytest.mark.parametrize("change, error, name", [
    (dict(codes=[[1, 2]]), TypeError, "codes"),
    (dict(codes=torch.zeros(2, 8, dtype=torch.int16)), TypeError, "codes"),
    (dict(codes=torch.zeros(2, 8, dtype=torch.int32), scratch=True), ValueError, "scratch"),
    (dict(codes=torch.zeros(2, 8, 1, dtype=torch.int64)), ValueError, "codes"),
    (dict(codes=torch.zeros(8, 2, dtype=torch.int64).t()), ValueError, "codes"),
    (dict(valid=torch.ones(2, dtype=torch.int64)), TypeError, "valid"),
    (dict(valid=all_valid(3)), ValueError, "valid"),
    (dict(kk=0), ValueError, "kk"),
    (dict(kk=9), ValueError, "kk"),
    (dict(kk=2.0), TypeError, "kk"),
    (dict(kk=True), TypeError, "kk"),
    (dict(out=torch.zeros(2, 4, dtype=torch.int64)), ValueError, "out"),
    (dict(out=torch.zeros(3, 3, dtype=torch.int64)), ValueError, "out"),
    (dict(out=torch.zeros(2, 3, dtype=torch.float32)), TypeError, "out"),
    (dict(out_rows=torch.zeros(2, dtype=torch.int64)), ValueError, "out"),
    (dict(out=torch.zeros(4, 3, dtype=torch.int64), out_rows=torch.zeros(2, dtype=torch.int32)),
     TypeError, "out_rows"),
    (dict(out=torch.zeros(4, 3, dtype=torch.int64), out_rows=torch.zeros(3, dtype=torch.int64)),
     ValueError, "out_rows"),
    (dict(block=24), ValueError, "block"),
    (dict(block=8), ValueError, "block"),
    (dict(splits=0), ValueError, "splits"),
    (dict(splits=2.0), TypeError, "splits"),
    (dict(splits=True), TypeError, "splits"),
    (dict(scratch=1), TypeError, "scratch"),
])
def test_bad_arguments_raise_naming_the_argument(change, error, name):
    arguments = {**good_arguments(), **change}
    with pytest.raises(error, match=rf"\b{name}\b"):
        select_top_codes(**arguments)
