"""The decode path's one-launch selection (compiler/lowering/selection/few_rows_select.py) against torch.topk of
the codes, decoded, under TRITON_INTERPRET=1 (integer work only: bitwise on any CPU)."""
import pytest
import torch

from compiler.lowering import defaults
from compiler.lowering.selection import few_rows_select
from compiler.lowering.order_codes import decode_codes
from compiler.lowering.selection.few_rows_select import few_rows_top_codes, few_rows_topk, takes_few_rows
from compiler.lowering.selection.threshold_select import chunk_maxima

from tests.lowering.selection.test_threshold_select import rows_of


def expected(codes, kk, T):
    return decode_codes(torch.topk(codes, kk).values, T)


def same(got, want):
    return torch.equal(got[1], want[1]) and torch.equal(got[0].view(torch.int32), want[0].view(torch.int32))


@pytest.mark.parametrize("kind", ["random", "increasing", "decreasing", "periodic", "duplicates", "extremes"])
@pytest.mark.parametrize("N,kk,n", [(3000, 40, 80), (2500, 7, 7), (4096, 100, 256)])
def test_equals_torch_topk_decoded(kind, N, kk, n, monkeypatch):
    """Slices of 1024 codes (several programs per row, reserving slots by atomics); "periodic" and
    "duplicates" rows leave more candidates than the register window (the radix select finishes)."""
    monkeypatch.setattr(defaults, "FEW_ROWS_INTERPRETER_PROGRAMS", 5)
    codes = rows_of(kind, 3, N, seed=N + kk)
    maxima = chunk_maxima(codes, n)
    want = expected(codes, kk, N)
    assert same(few_rows_topk(codes.clone(), maxima, kk, N), want)


def test_both_finishes_are_taken():
    """A row whose candidates fit the window and one whose candidates do not, in one call."""
    N, kk, n = 2048, 16, 32
    fits = torch.randperm(N, generator=torch.Generator().manual_seed(1)).to(torch.int64)
    ties = torch.arange(N) % 3  # every chunk's maximum is 2: a third of the row is a candidate
    codes = torch.stack([fits, ties])
    maxima = chunk_maxima(codes, n)
    count = (codes >= torch.topk(maxima, kk).values[:, -1:]).sum(1)
    window = few_rows_select.window(N, kk)
    assert count[0] <= window < count[1]
    assert same(few_rows_topk(codes.clone(), maxima, kk, N), expected(codes, kk, N))


def test_scorer_codes_of_hidden_and_tied_keys():
    """Order codes as the scorer encodes them (``compiler.lowering.order_codes.order_code``): tied values (lower
    key first), hidden keys, NaN."""
    N, kk = 3000, 50
    g = torch.Generator().manual_seed(7)
    values = torch.randint(0, 20, (2, N), generator=g).float()
    values[0, 5] = float("nan")
    visible = torch.rand(2, N, generator=g) > 0.3
    bits = values.view(torch.int32).to(torch.int64)
    c32 = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    c32 = torch.where(values != values, 0x7FFFFFFF, c32)
    c32 = torch.where(visible, c32, -(2**31))
    codes = c32 * 2**32 + (N - 1 - torch.arange(N))
    maxima = chunk_maxima(codes, 128)
    got = few_rows_topk(codes.clone(), maxima, kk, N)
    assert same(got, expected(codes, kk, N))
    assert torch.isnan(got[0][0, 0]) and got[1][0, 0] == 5


def test_bad_arguments_are_named():
    codes = rows_of("random", 2, 500, seed=0)
    with pytest.raises(ValueError, match="kk"):
        few_rows_topk(codes, chunk_maxima(codes, 8), 9, 500)
    with pytest.raises(ValueError, match="maxima"):
        few_rows_topk(codes, chunk_maxima(codes[:1], 16), 9, 500)


def test_takes_few_rows_only_on_cuda_for_few_rows():
    assert not takes_few_rows(1, 131072, 2048, 4096, "cpu")
    assert takes_few_rows(64, 131072, 2048, 4096, "cuda")
    assert takes_few_rows(1, 2048, 2048, 2048, "cuda")  # a row no longer than kk: all candidates
    assert not takes_few_rows(defaults.FEW_ROWS, 131072, 2048, 4096, "cuda")
    assert not takes_few_rows(1, 2048, 2048, 1024, "cuda")  # fewer chunks than kk
    assert not takes_few_rows(1, 1 << 20, 2048, 2 * defaults.KTH_REGISTER_ROW, "cuda")


def test_short_rows_are_selected_in_registers():
    """Rows of kk to 2 kk codes (the chunks hold one or two codes): every code can be a candidate."""
    for N, kk, n in ((64, 64, 64), (96, 40, 64), (128, 40, 128)):
        codes = rows_of("random", 2, N, seed=N)
        assert same(few_rows_topk(codes.clone(), chunk_maxima(codes, n), kk, N), expected(codes, kk, N))


@pytest.mark.parametrize("kind", ["random", "duplicates", "extremes"])
def test_gated_rows_write_their_top_codes_to_their_out_rows(kind, monkeypatch):
    """``few_rows_top_codes``: valid rows' top kk codes, descending, in their out rows (mapped out of
    order); invalid rows and a valid row mapped past ``out`` write nothing; a "duplicates" row leaves
    more candidates than the window."""
    monkeypatch.setattr(defaults, "FEW_ROWS_INTERPRETER_PROGRAMS", 4)
    N, kk, n = 3000, 40, 80
    codes = rows_of(kind, 5, N, seed=3)
    maxima = chunk_maxima(codes, n)
    valid = torch.tensor([True, False, True, True, True])
    out_rows = torch.tensor([6, 0, 1, 3, 9])  # row 4: past out's 8 rows
    out = torch.full((8, kk), 7, dtype=torch.int64)
    few_rows_top_codes(codes.clone(), maxima, kk, valid, out, out_rows)
    want = torch.topk(codes, kk).values
    for row, dst in ((0, 6), (2, 1), (3, 3)):
        assert torch.equal(out[dst], want[row])
    assert (out[[0, 2, 4, 5, 7]] == 7).all()


def test_gated_bad_arguments_are_named():
    codes = rows_of("random", 2, 500, seed=0)
    maxima = chunk_maxima(codes, 16)
    out = torch.empty(2, 9, dtype=torch.int64)
    with pytest.raises(ValueError, match="valid, out_rows"):
        few_rows_top_codes(codes, maxima, 9, torch.ones(3, dtype=torch.bool), out, torch.arange(2))
    with pytest.raises(ValueError, match="out"):
        few_rows_top_codes(codes, maxima, 9, torch.ones(2, dtype=torch.bool), out[:, :8], torch.arange(2))
