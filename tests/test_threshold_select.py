"""Exact top-kk of long code rows by threshold and compaction (compiler/lowering/threshold_select.py)
against torch.topk, under TRITON_INTERPRET=1 (integer work only: bitwise on any CPU)."""
import pytest
import torch

from compiler.lowering import threshold_select
from compiler.lowering.threshold_select import top_codes

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def rows_of(kind, R, N, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randint(-(2**62), 2**62, (R, N), generator=g)
    if kind == "increasing":  # best codes at the end of the row (recency)
        return torch.arange(N).repeat(R, 1) * 3 + torch.arange(R)[:, None]
    if kind == "decreasing":
        return -torch.arange(N).repeat(R, 1)
    if kind == "periodic":  # every interleaved chunk's maximum is the same code: forces the overflow path
        return (torch.arange(N) % 7).repeat(R, 1) * 1000 - torch.arange(N)
    if kind == "duplicates":
        return torch.randint(0, 5, (R, N), generator=g)
    if kind == "extremes":
        x = torch.randint(-3, 3, (R, N), generator=g)
        x[x == -3], x[x == 2] = INT64_MIN, INT64_MAX
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["random", "increasing", "decreasing", "periodic", "duplicates", "extremes"])
@pytest.mark.parametrize("N,kk,step", [(1000, 7, threshold_select.COMPACT_BLOCK), (1000, 7, 64), (333, 41, 64),
                                       (97, 1, 16)])
def test_equals_torch_topk(kind, N, kk, step, monkeypatch):
    """At the default compaction step (COMPACT_BLOCK) a row of 1000 codes is one partial step;
    at steps of 64 and 16 rows take several steps, shared out over COMPACT_SPLITS programs."""
    assert threshold_select.COMPACT_BLOCK >= 1000 and threshold_select.COMPACT_SPLITS > 1
    monkeypatch.setattr(threshold_select, "COMPACT_BLOCK", step)
    codes = rows_of(kind, 5, N, seed=N + kk)
    assert N > threshold_select.LONG_ROW_FACTOR * kk  # the threshold path, not the torch.topk shortcut
    got = top_codes(codes, kk)
    assert torch.equal(got, torch.topk(codes, kk).values)


def test_batch_dims_and_short_rows():
    codes = rows_of("random", 6, 400, seed=3).view(2, 3, 400)
    assert torch.equal(top_codes(codes, 9), torch.topk(codes, 9).values)
    assert torch.equal(top_codes(codes, 200), torch.topk(codes, 200).values)  # short: torch.topk
    with pytest.raises(ValueError, match="kk"):
        top_codes(codes, 401)


def test_the_overflow_path_is_taken_and_exact(monkeypatch):
    """A candidate buffer of 1 x kk overflows on random rows; the gated selector answers them."""
    monkeypatch.setattr(threshold_select, "CANDIDATE_FACTOR", 1)
    codes = rows_of("random", 4, 900, seed=5)
    assert torch.equal(top_codes(codes, 10), torch.topk(codes, 10).values)


def distinct_rows(R, N, seed):
    """[R, N] distinct int64 codes per row, spread over the whole range."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(N, generator=g) for _ in range(R)]) * (2**53 + 7) - 2**62


def thresholds_keeping(codes, kept):
    """[R] tau: row r keeps its ``kept[r]`` largest codes (0: none)."""
    top = codes.sort(dim=-1, descending=True).values
    return torch.stack([top[r, k - 1] if k else top[r, 0] + 1 for r, k in enumerate(kept)])


@pytest.mark.parametrize("R, N, step, splits", [(1, 500, 16, 1), (6, 600, 16, 3), (4, 333, 64, 2), (3, 1000, 1024, 4)])
def test_compaction_keeps_the_codes_above_tau(R, N, step, splits):
    """Rows keeping all their codes, none, a few, exactly cap, cap + 1 and far more than cap
    (overflowing: cap of them, the count goes on), with a buffer of 40 and of the row; one program
    per row and several (their atomics interleave the slots)."""
    codes = distinct_rows(R, N, seed=R * N + step)
    for cap in (40, N):
        kinds = [k for k in (N, 0, 10, cap, cap + 1, 2 * cap + 1) if k <= N]
        for shift in range(0, len(kinds), R):
            tau = thresholds_keeping(codes, [kinds[(r + shift) % len(kinds)] for r in range(R)])
            cand, count = threshold_select.compact(codes, tau.repeat_interleave(2)[::2], cap, step, splits=splits)
            kept = codes >= tau[:, None]  # tau given at stride 2: read at its stride
            assert torch.equal(count, kept.sum(-1).to(torch.int32))
            for r in range(R):
                n = min(int(count[r]), cap)
                got = cand[r, :n].sort().values
                if n == int(count[r]):
                    assert torch.equal(got, codes[r][kept[r]].sort().values), r
                else:  # overflowed: cap distinct codes of the row, all >= tau
                    assert got.unique().numel() == n and torch.isin(got, codes[r][kept[r]]).all(), r


@pytest.mark.parametrize("splits", [1, 3])
def test_compaction_of_words_keeps_the_codes_above_any_tau(splits):
    """Words compare with tau in 32-bit halves (select_codes_triton ``row_codes_at_least``): rows
    of few repeated words, the extreme ones among them, against thresholds whose high word is a
    row's word (INT32_MIN included) and whose low word cuts inside the row, at its ends, past it
    (>= N, >= 2^31) or is zero; what is kept is exactly the codes >= tau. The words are given as a
    column-major view, which compact reads at its stride."""
    R, N = 8, 700
    g = torch.Generator().manual_seed(splits)
    words = torch.tensor([-(2**31), -1, 0, 7, 2**31 - 1], dtype=torch.int32)[torch.randint(0, 5, (R, N), generator=g)]
    codes = threshold_select.codes_of_words(words)
    lows = [0, 1, 350, N - 1, N, 2**31 - 1, 2**31, 2**32 - 1]
    for high in (-(2**31), -1, 7, 2**31 - 1):
        tau = torch.tensor([high * 2**32 + low for low in lows])
        cand, count = threshold_select.compact(words.T.contiguous().T, tau, N, 64, splits=splits)
        kept = codes >= tau[:, None]
        assert torch.equal(count, kept.sum(-1).to(torch.int32)), high
        for r in range(R):
            assert torch.equal(cand[r, :int(count[r])].sort().values, codes[r][kept[r]].sort().values), (high, r)


def adversarial_rows(kind, R, N, seed):
    """Distinct codes: the 60 largest shuffled at the row's end, the rest shuffled before them
    (recency), or scores of three values whose codes differ only in the key index of their low
    word (as the scorer writes them)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "clustered_at_end":
        ascending = distinct_rows(R, N, seed).sort(dim=-1).values
        order = torch.cat([torch.randperm(N - 60, generator=g), N - 60 + torch.randperm(60, generator=g)])
        return ascending[:, order]
    scores = torch.tensor([1.0, 2.0, 3.0])[torch.randint(0, 3, (R, N), generator=g)]
    return scores.view(torch.int32).to(torch.int64) * 2**32 + (N - 1 - torch.arange(N))


@pytest.mark.parametrize("kind", ["clustered_at_end", "tied_scores"])
@pytest.mark.parametrize("factor", [threshold_select.CANDIDATE_FACTOR, 1])
def test_top_codes_equals_torch_topk_on_adversarial_rows(kind, factor, monkeypatch):
    """4 rows of 600 codes in compaction steps of 16 (the 60 clustered codes span several);
    buffers of 4 kk and of kk (rows overflowing)."""
    monkeypatch.setattr(threshold_select, "COMPACT_BLOCK", 16)
    monkeypatch.setattr(threshold_select, "CANDIDATE_FACTOR", factor)
    codes = adversarial_rows(kind, 4, 600, seed=len(kind) + factor)
    assert all(row.unique().numel() == 600 for row in codes)
    assert torch.equal(top_codes(codes, 20), torch.topk(codes, 20).values)


@pytest.mark.parametrize("kind", ["random", "ties", "extremes"])
@pytest.mark.parametrize("factor", [threshold_select.CANDIDATE_FACTOR, 1])
def test_int32_words_select_as_their_codes(kind, factor, monkeypatch):
    """Rows of int32 words (the dense scorer's ``words`` output) give the top kk of the codes
    ``(word << 32) + N - 1 - position``: random words, three repeated words (ties broken by
    position only), the extreme words; buffers of 2 kk and of kk (rows overflowing, answered from
    the words by the gated selector); the chunk maxima computed from the words."""
    monkeypatch.setattr(threshold_select, "CANDIDATE_FACTOR", factor)
    g = torch.Generator().manual_seed(len(kind) + factor)
    R, N, kk = 4, 700, 9
    if kind == "random":
        words = torch.randint(-(2**31), 2**31, (R, N), generator=g, dtype=torch.int64).to(torch.int32)
    elif kind == "ties":
        words = torch.tensor([5, 6, 7], dtype=torch.int32)[torch.randint(0, 3, (R, N), generator=g)]
    else:
        words = torch.tensor([-(2**31), 2**31 - 1, 0], dtype=torch.int32)[torch.randint(0, 3, (R, N), generator=g)]
    codes = threshold_select.codes_of_words(words)
    assert torch.equal(threshold_select.chunk_maxima(words, 64), threshold_select.chunk_maxima(codes, 64))
    assert torch.equal(threshold_select.chunk_maxima(words.T.contiguous().T, 64),  # a column-major view
                       threshold_select.chunk_maxima(codes, 64))
    want = torch.topk(codes, kk).values
    assert torch.equal(top_codes(words, kk), want)
    assert torch.equal(top_codes(words.view(2, 2, N), kk), want.view(2, 2, kk))
    assert torch.equal(top_codes(words, 100), torch.topk(codes, 100).values)  # short rows: torch.topk
    with pytest.raises(TypeError, match="codes"):
        top_codes(words.to(torch.int16), kk)


def candidate_rows(R, N, counts, seed, distinct=True):
    """[R, N] candidate buffers: row r holds ``counts[r]`` codes (at most N) then INT64_MIN."""
    g = torch.Generator().manual_seed(seed)
    x = distinct_rows(R, N, seed) if distinct else torch.randint(-3, 3, (R, N), generator=g)
    for r, c in enumerate(counts):
        x[r, min(c, N):] = INT64_MIN
    return x


def with_garbage(cand, counts, seed):
    """``cand`` with every slot past a row's count overwritten by large values (INT64_MAX among
    them): top_candidates must never read them as codes."""
    g = torch.Generator().manual_seed(seed)
    out = cand.clone()
    for r, c in enumerate(counts):
        tail = out[r, min(c, out.shape[1]):]
        tail.copy_(torch.randint(2**61, 2**62, tail.shape, generator=g))
        tail[::3] = torch.iinfo(torch.int64).max
    return out


@pytest.mark.parametrize("N,kk", [(64, 8), (100, 30), (40, 40), (300, 1)])
@pytest.mark.parametrize("distinct", [True, False])
def test_top_candidates_equals_torch_topk(N, kk, distinct):
    """Counts below kk, at kk, inside the register window, past it (the gated selector) and at
    the buffer's end; distinct codes and many ties (and a real INT64_MIN among them)."""
    win = threshold_select.window(N, kk)
    counts = sorted({0, 1, max(kk - 1, 0), kk, win // 2, win - 1, win, win + 1, N - 1, N})
    counts = [c for c in counts if 0 <= c <= N]
    cand = candidate_rows(len(counts), N, counts, seed=N * kk, distinct=distinct)
    if not distinct:
        cand[0, 0] = INT64_MIN
    got = threshold_select.top_candidates(with_garbage(cand, counts, N), torch.tensor(counts, dtype=torch.int32), kk)
    assert torch.equal(got, torch.topk(cand, kk, dim=-1).values)
    strided = torch.tensor(counts, dtype=torch.int64).repeat_interleave(2)[::2]  # counts at stride 2
    got = threshold_select.top_candidates(with_garbage(cand, counts, N), strided, kk)
    assert torch.equal(got, torch.topk(cand, kk, dim=-1).values)


def test_top_candidates_window_and_its_fallback_both_run():
    """A window smaller than the buffer: rows past it take the gated selector, others the window."""
    N, kk = 200, 10
    assert threshold_select.window(N, kk) == 32
    counts = [5, 32, 33, 150, 200]
    cand = candidate_rows(len(counts), N, counts, seed=11)
    want = torch.topk(cand, kk, dim=-1).values
    assert torch.equal(threshold_select.top_candidates(with_garbage(cand, counts, 1), torch.tensor(counts), kk), want)
    assert torch.equal(threshold_select.top_candidates(with_garbage(cand, counts, 2), torch.tensor(counts), kk,
                                                       scratch=True), want)
    with pytest.raises(ValueError, match="kk"):
        threshold_select.top_candidates(cand, torch.tensor(counts), 0)


def test_kth_largest_of_long_rows_and_batch_dims(monkeypatch):
    x = distinct_rows(6, 300, seed=2).view(2, 3, 300)
    want = torch.topk(x, 17, dim=-1).values[..., -1]
    assert torch.equal(threshold_select.kth_largest(x, 17), want)
    assert torch.equal(threshold_select.kth_largest(x[..., :250], 17), torch.topk(x[..., :250], 17, dim=-1).values[..., -1])
    monkeypatch.setattr(threshold_select, "KTH_REGISTER_ROW", 128)  # rows past the register limit: torch.topk
    assert torch.equal(threshold_select.kth_largest(x, 17), want)
    with pytest.raises(ValueError, match="kk"):
        threshold_select.kth_largest(x, 301)


@pytest.mark.parametrize("kind", ["shared_high_words", "high_word_boundary", "random", "duplicates", "extremes"])
def test_kth_largest_two_word_search_on_adversarial_rows(kind):
    """``_kth_of`` searches the high word, then the low word among codes sharing the kk-th high
    word: rows where many codes share it (the low-word search runs), where exactly the needed ones
    share it (it does not), low words with the top bit set, negative high words, repeats."""
    g = torch.Generator().manual_seed(len(kind))
    R, N = 8, 257
    if kind == "shared_high_words":
        x = torch.randint(-2, 2, (R, N), generator=g) * 2**32 + torch.randint(0, 2**32, (R, N), generator=g)
    elif kind == "high_word_boundary":
        x = torch.arange(N).repeat(R, 1) // 4 * 2**32 + (2**32 - 1 - torch.randint(0, 3, (R, N), generator=g))
    else:
        x = rows_of(kind, R, N, seed=5)
    for kk in (1, 2, 31, 128, N):
        assert torch.equal(threshold_select.kth_largest(x, kk), torch.topk(x, kk, dim=-1).values[:, -1]), kk


def test_few_gpu_rows_take_torch_topk_and_the_rest_the_threshold_path(monkeypatch):
    """The path rule: short rows never take the threshold path; long ones do on the CPU (the
    interpreter) whatever their count, and on CUDA from FEW_ROWS rows on. A call that takes
    ``torch.topk`` launches no threshold kernel."""
    few = threshold_select.FEW_ROWS
    assert not threshold_select.takes_threshold(10**6, 8 * 100, 100, "cuda")
    assert threshold_select.takes_threshold(1, 8 * 100 + 1, 100, "cpu")
    assert not threshold_select.takes_threshold(few - 1, 10**6, 100, "cuda")
    assert threshold_select.takes_threshold(few, 10**6, 100, torch.device("cuda", 0))
    codes = rows_of("random", 4, 1000, seed=3)
    monkeypatch.setattr(threshold_select, "takes_threshold",  # the CUDA rule with FEW_ROWS = 5
                        lambda rows, N, kk, device: threshold_select.long_row(N, kk) and rows >= 5)

    def no_threshold_kernel(*args, **kwargs):
        raise AssertionError("the threshold path ran")

    monkeypatch.setattr(threshold_select, "compact", no_threshold_kernel)
    assert torch.equal(top_codes(codes, 7), torch.topk(codes, 7).values)
    with pytest.raises(AssertionError, match="threshold path ran"):
        top_codes(rows_of("random", 5, 1000, seed=3), 7)
