"""Exact top-kk of long code rows by threshold and compaction (compiler/lowering/selection/threshold_select.py)
against torch.topk, under TRITON_INTERPRET=1 (integer work only: bitwise on any CPU)."""
import pytest
import torch

from compiler.lowering import defaults
from compiler.lowering.order_codes import codes_of_words
from compiler.lowering.selection import threshold_select
from compiler.lowering.selection.threshold_select import top_codes

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
@pytest.mark.parametrize("N,kk,tile,min_segment", [(1000, 7, None, None), (1000, 8, 2, 1), (333, 41, 2, 1),
                                                   (97, 1, 1, 1)])
def test_equals_torch_topk(kind, N, kk, tile, min_segment, monkeypatch):
    """At the default tile and segment sizes a buffer of 2 kk = 14 is one segment and a row of 1000
    codes two rounds of tiles; with tiles of 32 or 64 positions and segments of any size the
    buffer is cut into 2 or 4 segments (of 1 to 41 slots: many rows overflow one, the gated
    selector answers them)."""
    if tile is not None:
        monkeypatch.setattr(defaults, "COMPACT_TILE", tile)
        monkeypatch.setattr(defaults, "MIN_SEGMENT", min_segment)
        assert threshold_select.compact_segments(defaults.THRESHOLD_BUFFER_K * kk) > 1
    codes = rows_of(kind, 5, N, seed=N + kk)
    assert N > defaults.LONG_ROW_FACTOR * kk  # the threshold path, not the torch.topk shortcut
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
    monkeypatch.setattr(defaults, "THRESHOLD_BUFFER_K", 1)
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


def check_compaction(cand, count, codes, tau, cap):
    """``compact``'s contract for rows of distinct codes: the counts add up to the codes >= tau;
    each segment holds min(count, its slots) distinct codes >= tau in position order; a row whose
    segments all held their codes holds exactly the row's codes >= tau."""
    R, N = codes.shape
    G = count.shape[1]
    seg = cap // G
    kept = codes >= tau[:, None]
    assert torch.equal(count.sum(-1), kept.sum(-1).to(count.dtype))
    ordered, order = codes.sort(dim=-1)
    for r in range(R):
        held = []
        for g in range(G):
            got = cand[r, g * seg:g * seg + min(int(count[r, g]), seg)]
            where = order[r, torch.searchsorted(ordered[r], got).clamp(max=N - 1)]
            assert torch.equal(codes[r, where], got), (r, g)  # codes of the row
            assert bool((where.diff() > 0).all()), (r, g)  # distinct, in position order
            assert bool(kept[r, where].all()), (r, g)
            held.append(where)
        if not threshold_select.overflowed(count[r:r + 1], cap):
            assert torch.equal(torch.cat(held).sort().values, kept[r].nonzero().flatten()), r


@pytest.mark.parametrize("R, N, tile, segments", [(1, 500, 1, 1), (6, 600, 1, 3), (4, 333, 2, 2), (3, 1000, 4, 4),
                                                  (2, 4096, 4, 4)])
def test_compaction_keeps_the_codes_above_tau(R, N, tile, segments):
    """Rows keeping all their codes, none, a few, exactly cap, cap + 1 and far more than cap
    (overflowing), with a buffer of 48 and of the row cut into 1 to 4 segments, rows of several
    rounds of tiles, partial ones and whole ones (4096 = 8 rounds of 4 tiles of 128)."""
    codes = distinct_rows(R, N, seed=R * N + tile)
    for cap in (48, N - N % segments):
        kinds = [k for k in (N, 0, 10, cap, cap + 1, 2 * cap + 1) if k <= N]
        for shift in range(0, len(kinds), R):
            tau = thresholds_keeping(codes, [kinds[(r + shift) % len(kinds)] for r in range(R)])
            tau = tau.repeat_interleave(2)[::2]  # tau given at stride 2: read at its stride
            cand, count = threshold_select.compact(codes, tau, cap, segments, tile)
            assert count.shape == (R, segments)
            check_compaction(cand, count, codes, tau, cap)


def test_compaction_segments_and_their_errors():
    """Buffers of 2 kk take COMPACT_SEGMENTS segments when large enough, fewer or one when small;
    a segment count that does not divide the buffer is refused before any launch."""
    assert threshold_select.compact_segments(4096) == defaults.COMPACT_SEGMENTS == 4
    assert threshold_select.compact_segments(2 * defaults.MIN_SEGMENT) == 2
    assert threshold_select.compact_segments(14) == 1
    # Tiles: COMPACT_TILE on CUDA; larger under the interpreter while 4 rounds per segment remain.
    assert threshold_select.compact_tile(10**6, 4, "cuda") == defaults.COMPACT_TILE == 4
    assert threshold_select.compact_tile(20000, 1, "cpu") == defaults.INTERPRETER_TILE
    assert threshold_select.compact_tile(4096, 1, "cpu") == 32 and threshold_select.compact_tile(1000, 4, "cpu") == 4
    with pytest.raises(ValueError, match="segments"):
        threshold_select.compact(distinct_rows(2, 100, seed=0), torch.zeros(2, dtype=torch.int64), 10, segments=3)


@pytest.mark.parametrize("segments", [1, 4])
def test_compaction_of_words_keeps_the_codes_above_any_tau(segments):
    """Words compare with tau in 32-bit halves (radix_select ``row_codes_at_least``): rows
    of few repeated words, the extreme ones among them, against thresholds whose high word is a
    row's word (INT32_MIN included) and whose low word cuts inside the row, at its ends, past it
    (>= N, >= 2^31) or is zero; what is kept is exactly the codes >= tau, in position order. The
    words are given as a column-major view, which compact reads at its stride."""
    R, N = 8, 700
    g = torch.Generator().manual_seed(segments)
    words = torch.tensor([-(2**31), -1, 0, 7, 2**31 - 1], dtype=torch.int32)[torch.randint(0, 5, (R, N), generator=g)]
    codes = codes_of_words(words)
    lows = [0, 1, 350, N - 1, N, 2**31 - 1, 2**31, 2**32 - 1]
    for high in (-(2**31), -1, 7, 2**31 - 1):
        tau = torch.tensor([high * 2**32 + low for low in lows])
        cand, count = threshold_select.compact(words.T.contiguous().T, tau, 4 * N, segments, tile=2)
        check_compaction(cand, count, codes, tau, 4 * N)


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
@pytest.mark.parametrize("factor", [defaults.THRESHOLD_BUFFER_K, 1])
def test_top_codes_equals_torch_topk_on_adversarial_rows(kind, factor, monkeypatch):
    """4 rows of 600 codes in compaction tiles of 32 (the 60 clustered codes span two), the buffer
    in segments of any size; buffers of 2 kk and of kk (rows overflowing)."""
    monkeypatch.setattr(defaults, "COMPACT_TILE", 1)
    monkeypatch.setattr(defaults, "MIN_SEGMENT", 1)
    monkeypatch.setattr(defaults, "THRESHOLD_BUFFER_K", factor)
    codes = adversarial_rows(kind, 4, 600, seed=len(kind) + factor)
    assert all(row.unique().numel() == 600 for row in codes)
    assert torch.equal(top_codes(codes, 20), torch.topk(codes, 20).values)


@pytest.mark.parametrize("kind", ["random", "ties", "extremes"])
@pytest.mark.parametrize("factor", [defaults.THRESHOLD_BUFFER_K, 1])
def test_int32_words_select_as_their_codes(kind, factor, monkeypatch):
    """Rows of int32 words (the dense scorer's ``words`` output) give the top kk of the codes
    ``(word << 32) + N - 1 - position``: random words, three repeated words (ties broken by
    position only), the extreme words; buffers of 2 kk and of kk (rows overflowing, answered from
    the words by the gated selector); the chunk maxima computed from the words."""
    monkeypatch.setattr(defaults, "THRESHOLD_BUFFER_K", factor)
    g = torch.Generator().manual_seed(len(kind) + factor)
    R, N, kk = 4, 700, 9
    if kind == "random":
        words = torch.randint(-(2**31), 2**31, (R, N), generator=g, dtype=torch.int64).to(torch.int32)
    elif kind == "ties":
        words = torch.tensor([5, 6, 7], dtype=torch.int32)[torch.randint(0, 3, (R, N), generator=g)]
    else:
        words = torch.tensor([-(2**31), 2**31 - 1, 0], dtype=torch.int32)[torch.randint(0, 3, (R, N), generator=g)]
    codes = codes_of_words(words)
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
    """Counts below kk, at kk, on both sides of the smaller window tier, inside the register
    window, past it (the gated selector) and at the buffer's end; distinct codes and many ties (and
    a real INT64_MIN among them)."""
    win = threshold_select.window(N, kk)
    counts = sorted({0, 1, max(kk - 1, 0), kk, win // 2, win // 2 + 1, win - 1, win, win + 1, N - 1, N})
    counts = [c for c in counts if 0 <= c <= N]
    cand = candidate_rows(len(counts), N, counts, seed=N * kk, distinct=distinct)
    if not distinct:
        cand[0, 0] = INT64_MIN
    got = threshold_select.top_candidates(with_garbage(cand, counts, N), torch.tensor(counts, dtype=torch.int32), kk)
    assert torch.equal(got, torch.topk(cand, kk, dim=-1).values)
    strided = torch.tensor(counts, dtype=torch.int64).repeat_interleave(2)[::2]  # counts at stride 2
    got = threshold_select.top_candidates(with_garbage(cand, counts, N), strided, kk)
    assert torch.equal(got, torch.topk(cand, kk, dim=-1).values)


def test_window_tiers_halve_an_unsegmented_window_that_still_holds_kk():
    assert threshold_select.window_tiers(200, 10, 1, 32) == (16, 32)
    assert threshold_select.window_tiers(200, 17, 1, 32) == (32,)  # half would not hold kk
    assert threshold_select.window_tiers(32, 4, 4, 32) == (32,)  # segments: the whole buffer
    assert threshold_select.window_warps(4096) == 4 and threshold_select.window_warps(8192) == 8
    assert threshold_select.window_warps(2**16) == 32  # a block holds at most 1024 threads


def test_top_candidates_of_a_window_past_2_15():
    """A window of 2^16 codes: the window kernel's ranks are counted in int64 (``SHIFT`` 32)."""
    N, kk = 2**16, 2**14 + 1
    assert threshold_select.window(N, kk) == N
    counts = [N, kk + 5]
    cand = candidate_rows(2, N, counts, seed=3, distinct=False)
    got = threshold_select.top_candidates(with_garbage(cand, counts, 4), torch.tensor(counts), kk)
    assert torch.equal(got, torch.topk(cand, kk, dim=-1).values)


def test_top_candidates_over_segments():
    """A buffer of 4 segments of 8 slots (``compact``'s layout): each segment's codes first,
    garbage after them, segments empty, full and overflowed (that row is flagged by
    ``overflowed`` and left to the caller); a buffer wider than the window cannot be segmented."""
    N, kk = 32, 16
    assert threshold_select.window(N, kk) == N
    counts = torch.tensor([[0, 0, 0, 0], [8, 8, 8, 8], [1, 7, 0, 5], [3, 8, 2, 9], [8, 0, 0, 1]], dtype=torch.int32)
    cand = distinct_rows(len(counts), N, seed=7)
    held = torch.arange(N) % 8 < counts.repeat_interleave(8, dim=1)
    garbage = torch.where(held, cand, torch.iinfo(torch.int64).max)
    want = torch.topk(torch.where(held, cand, INT64_MIN), kk, dim=-1).values
    got = threshold_select.top_candidates(garbage, counts, kk)
    fine = ~threshold_select.overflowed(counts, N)
    assert fine.tolist() == [True, True, True, False, True]
    assert torch.equal(got[fine], want[fine])
    with pytest.raises(ValueError, match="count"):
        threshold_select.top_candidates(distinct_rows(2, 64, seed=1), torch.zeros(2, 4, dtype=torch.int32), 8)


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
    monkeypatch.setattr(defaults, "KTH_REGISTER_ROW", 128)  # rows past the register limit: torch.topk
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
    few = defaults.FEW_ROWS
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


def rows_with_hidden_tails(R, N, ends, seed):
    """int32 words: random visible words before each row's end (a few hidden ones among them), the
    hidden word INT32_MIN from it on (the scorer's words under a causal-like mask)."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31) + 1, 2**31, (R, N), generator=g, dtype=torch.int64).to(torch.int32)
    words[torch.rand(R, N, generator=g) < 0.05] = -(2**31)
    words[torch.arange(N)[None, :] >= torch.tensor(ends)[:, None]] = -(2**31)
    return words


@pytest.mark.parametrize("segments,tile", [(1, 1), (4, 2)])
def test_compaction_stops_at_the_visible_extent(segments, tile):
    """With ``ends``, compaction keeps the same codes (rows with no visible key, one, fewer than kk,
    a partial last round, all N visible, an end past N), and where tau is above every hidden code it
    reads no position from the row's end on: a code planted there, against the contract, is not
    seen; where tau is a hidden code the whole row is read."""
    R, N, kk = 7, 300, 12  # rounds of 32 and 256 positions: N and the ends 111, 213 end inside one
    ends = [0, 1, kk - 3, 111, 213, N, N + 50]
    words = rows_with_hidden_tails(R, N, ends, seed=segments)
    codes = codes_of_words(words)
    end_t = torch.tensor(ends, dtype=torch.int32)
    want = torch.topk(codes, kk).values
    assert torch.equal(top_codes(words, kk, ends=end_t), want)
    assert torch.equal(top_codes(codes, kk, ends=end_t), want)
    tau = threshold_select.kth_largest(threshold_select.chunk_maxima(words, 64), kk)
    for rows in (words, codes):
        cand, count = threshold_select.compact(rows, tau, 4 * kk, segments, tile, ends=end_t)
        plain, plain_count = threshold_select.compact(rows, tau, 4 * kk, segments, tile)
        assert torch.equal(count, plain_count)
        check_compaction(cand, count, codes, tau, 4 * kk)
    visible_tau = (tau >> 32) > -(2**31)
    assert visible_tau[3:].all() and not visible_tau[:3].any()
    planted = words.clone()
    planted[3:6, -1] = 2**31 - 1  # the last position: past the end of rows 3 and 4, inside row 5
    _, count = threshold_select.compact(planted, tau, 4 * kk, segments, tile, ends=end_t)
    _, seen = threshold_select.compact(planted, tau, 4 * kk, segments, tile)
    assert torch.equal(count.sum(1)[3:5], seen.sum(1)[3:5] - 1)  # not read past the end
    assert torch.equal(count.sum(1)[5], seen.sum(1)[5])  # row 5 ends at N: the planted code is inside
    planted[0, -1] = 2**31 - 1  # tau hidden (no visible key): the whole row is read
    tau0 = threshold_select.kth_largest(threshold_select.chunk_maxima(planted, 64), kk)
    _, count = threshold_select.compact(planted, tau0, 4 * kk, segments, tile, ends=end_t)
    _, seen = threshold_select.compact(planted, tau0, 4 * kk, segments, tile)
    assert torch.equal(count[0], seen[0])
    with pytest.raises(ValueError, match="ends"):
        top_codes(words, kk, ends=end_t.long())
