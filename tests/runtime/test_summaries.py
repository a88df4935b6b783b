"""Pulsar summaries (runtime.summaries): IDF, chunk-group heuristics, budgets, tie-break."""
import math
from collections import Counter
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.summaries import (HEURISTICS, TIE_BREAKS, novelty_weights, position_idf,
                               score_chunk_groups, select_summaries)

LOG2, LOG4 = math.log(2.0), math.log(4.0)
BAG_OF_TOKENS = ("max_idf", "tfidf", "bm25", "entropy")  # scores blind to the order inside a group

# Four blocks of 9, chunk groups of 3. Tokens 1, 2, 3 are in every block (IDF 0), 4 and 5 in
# blocks 0 and 3 (IDF log 2), 9 only in block 3 (IDF log 4). Block 3 has three groups:
#   A = [9 1 1] one rare token     -> best Max-IDF
#   B = [4 4 5] moderately rare     -> best TF-IDF and BM25
#   C = [1 2 3] all distinct        -> best entropy
FOUR_BLOCKS = torch.tensor([1, 2, 3, 4, 5, 1, 2, 3, 1,
                            1, 2, 3, 1, 2, 3, 1, 2, 3,
                            1, 2, 3, 1, 2, 3, 1, 2, 3,
                            9, 1, 1, 4, 4, 5, 1, 2, 3])
ONE_GROUP = dict(chunk=3, ratio=1 / 3, sink=0)  # sigma = 3 tokens = one group per block


def idf_as_computed(df: int, n: int) -> float:
    """log(n / df) as the module computes it (float64 on the CPU, clamped at 0)."""
    return max(torch.log(n / torch.tensor(float(df), dtype=torch.float64)).item(), 0.0)


def bm25_idf(df: int, n: int) -> float:
    """BM25's IDF as the module computes it (float64 on the CPU)."""
    found_in = torch.tensor(float(df), dtype=torch.float64)
    return torch.log((float(n) - found_in + 0.5) / (found_in + 0.5) + 1.0).item()


def canonical_sum(values: list[float]) -> float:
    """The module's order of summation: descending, zero-padded to a power of two, folded in halves."""
    row = sorted(values, reverse=True)
    row += [0.0] * ((1 << (len(row) - 1).bit_length()) - len(row))
    while len(row) > 1:
        row = [a + b for a, b in zip(row[:len(row) // 2], row[len(row) // 2:])]
    return row[0]


def bm25_term(df: int, tf: int, n: int, size: int, mean_size: float) -> float:
    return bm25_idf(df, n) * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * size / mean_size))


def test_position_idf_counts_blocks_not_occurrences():
    # blocks [0 1] [0 2] [2 2]: df(0) = 2, df(1) = 1, df(2) = 2 (twice in one block counts once)
    idf = position_idf(torch.tensor([0, 1, 0, 2, 2, 2]), 2)
    assert idf.dtype == torch.float64
    third, half = math.log(3), math.log(3 / 2)
    assert idf.tolist() == pytest.approx([half, third, half, half, half, half], abs=0)


def test_position_idf_is_zero_for_one_block():
    assert position_idf(torch.tensor([3, 1, 3]), 8).tolist() == [0.0] * 3


def test_position_idf_counts_the_shorter_last_block():
    # blocks [7 7 7] [8]: n = 2, df(7) = df(8) = 1
    assert position_idf(torch.tensor([7, 7, 7, 8]), 3).tolist() == [LOG2] * 4


def test_max_idf_scores_by_hand():
    scores = score_chunk_groups(FOUR_BLOCKS, 9, heuristic="max_idf", chunk=3, sink=0)
    assert scores.block.tolist() == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert scores.start.tolist() == list(range(0, 36, 3))
    assert scores.length.tolist() == [3] * 12
    assert scores.score.tolist() == pytest.approx([0, LOG2, 0] + [0] * 6 + [LOG4, LOG2, 0], abs=1e-15)


def test_tfidf_scores_by_hand():
    scores = score_chunk_groups(FOUR_BLOCKS, 9, heuristic="tfidf", chunk=3, sink=0).score
    expected = [0, 2 * LOG2 / 3, 0] + [0] * 6 + [LOG4 / 3, LOG2, 0]
    assert scores.tolist() == pytest.approx(expected, abs=1e-15)


def test_entropy_scores_by_hand():
    scores = score_chunk_groups(FOUR_BLOCKS, 9, heuristic="entropy", chunk=3, sink=0).score
    assert scores.tolist() == pytest.approx([1, 1, 1] + [1] * 6 + [2 / 3, 2 / 3, 1], abs=1e-15)


def test_bm25_scores_by_hand():
    scores = score_chunk_groups(FOUR_BLOCKS, 9, heuristic="bm25", chunk=3, sink=0).score
    common = bm25_term(4, 1, 4, 3, 3.0)
    assert common == pytest.approx(bm25_idf(4, 4))  # |C| = mean length: tf = 1 weighs exactly IDF
    group_a = bm25_term(1, 1, 4, 3, 3.0) + bm25_term(4, 2, 4, 3, 3.0)
    group_b = bm25_term(2, 2, 4, 3, 3.0) + bm25_term(2, 1, 4, 3, 3.0)
    block0_middle = 2 * bm25_term(2, 1, 4, 3, 3.0) + common
    expected = [3 * common, block0_middle, 3 * common] + [3 * common] * 6 + [group_a, group_b, 3 * common]
    assert scores.tolist() == pytest.approx(expected, rel=1e-14)


def test_bm25_length_normalisation_uses_the_mean_group_length():
    # blocks of 5, chunk 3: groups [0,3) and [3,5) per block, mean length 2.5
    tokens = torch.tensor([1, 1, 1, 2, 2, 3, 3, 3, 4, 4])
    scores = score_chunk_groups(tokens, 5, heuristic="bm25", chunk=3, sink=0).score
    expected = [bm25_term(1, 3, 2, 3, 2.5), bm25_term(1, 2, 2, 2, 2.5)] * 2
    assert scores.tolist() == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("heuristic, expected_block3", [
    ("max_idf", [27, 28, 29]), ("tfidf", [30, 31, 32]), ("bm25", [30, 31, 32]),
    ("entropy", [33, 34, 35]), ("uniform", [27, 31, 35]),
])
def test_each_heuristic_picks_its_group_by_hand(heuristic, expected_block3):
    summaries = select_summaries(FOUR_BLOCKS, 9, heuristic=heuristic, **ONE_GROUP)
    assert len(summaries) == 4
    assert summaries[3].tolist() == expected_block3
    assert all(s.dtype == torch.int64 for s in summaries)


@pytest.mark.parametrize("heuristic, expected", [
    ("max_idf", [3, 4, 5]), ("tfidf", [3, 4, 5]), ("bm25", [3, 4, 5]), ("entropy", [0, 1, 2]),
])
def test_ties_go_to_the_earlier_group(heuristic, expected):
    summaries = select_summaries(FOUR_BLOCKS, 9, heuristic=heuristic, **ONE_GROUP)
    assert summaries[0].tolist() == expected  # entropy: three groups tie at 1
    assert summaries[1].tolist() == [9, 10, 11]  # all groups of blocks 1 and 2 tie
    assert summaries[2].tolist() == [18, 19, 20]


def test_tfidf_tie_break_orders_max_idf_ties_by_mean_idf():
    # block 1 groups [1 1 1 7] and [8 9 1 1] tie at Max-IDF log 2; the second has the higher TF-IDF
    tokens = torch.tensor([1] * 8 + [1, 1, 1, 7, 8, 9, 1, 1])
    by_position = select_summaries(tokens, 8, chunk=4, ratio=0.5, sink=0)
    by_tfidf = select_summaries(tokens, 8, chunk=4, ratio=0.5, sink=0, tie_break="tfidf")
    assert by_position[1].tolist() == [8, 9, 10, 11]
    assert by_tfidf[1].tolist() == [12, 13, 14, 15]


def test_tfidf_tie_break_keeps_strict_max_idf_winners():
    # block 3: group A wins Max-IDF strictly although group B has the higher TF-IDF
    summaries = select_summaries(FOUR_BLOCKS, 9, tie_break="tfidf", **ONE_GROUP)
    assert summaries[3].tolist() == [27, 28, 29]
    assert summaries[1].tolist() == [9, 10, 11]  # full ties remain broken by position


def test_selected_groups_come_back_in_position_order():
    # TF-IDF of block 1's groups: [14,15] (two block-unique tokens) > [10,11] (one) > the rest
    tokens = torch.tensor([1] * 8 + [1, 1, 1, 7, 1, 1, 8, 9])
    groups = score_chunk_groups(tokens, 8, heuristic="tfidf", chunk=2, sink=0)
    assert groups.score[7] > groups.score[5] > groups.score[4]
    summary = select_summaries(tokens, 8, heuristic="tfidf", chunk=2, ratio=0.5, sink=0)[1]
    assert summary.tolist() == [10, 11, 14, 15]


def test_sink_tokens_are_never_candidates_and_groups_start_after_the_sink():
    # the rare token 9 sits in the sink; groups of block 0 are [3,5) and [5,7) and [7,8)
    tokens = torch.tensor([9, 1, 1, 1, 1, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    summaries = select_summaries(tokens, 8, chunk=2, ratio=0.25, sink=3)
    assert summaries[0].tolist() == [5, 6]
    groups = score_chunk_groups(tokens, 8, chunk=2, sink=3)
    assert groups.start.tolist() == [3, 5, 7, 8, 10, 12, 14]
    assert groups.length.tolist() == [2, 2, 1, 2, 2, 2, 2]


def test_whole_block_sink_leaves_block_zero_without_summary():
    tokens = torch.tensor([5, 6, 7, 8, 1, 2, 3, 4])
    assert select_summaries(tokens, 4, chunk=1, ratio=0.5, sink=4)[0].numel() == 0
    assert select_summaries(tokens, 4, chunk=1, ratio=0.5, sink=4, heuristic="uniform")[0].numel() == 0


def test_shorter_last_block_budget_follows_its_own_length():
    # blocks of 8 then 5; ratio 1/2, chunk 2: sigma = 4 -> 2 groups, last block sigma = 2 -> 1 group.
    # The last block's groups are [8,10), [10,12), [12] and its rare token 9 is in the short one.
    tokens = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 9])
    summaries = select_summaries(tokens, 8, chunk=2, ratio=0.5, sink=0)
    assert summaries[0].tolist() == [0, 1, 2, 3]
    assert summaries[1].tolist() == [12]


@pytest.mark.parametrize("ratio, block_size, budget", [(0.29, 100, 29), (1 / 3, 9, 3), (0.125, 4096, 512)])
def test_budget_reads_ratio_as_an_exact_fraction(ratio, block_size, budget):
    # 0.29 * 100 is 28.999999999999996 in floating point and 1/3 is just below 1/3
    tokens = torch.arange(2 * block_size) % 7
    summaries = select_summaries(tokens, block_size, chunk=1, ratio=ratio, sink=0)
    assert [s.numel() for s in summaries] == [budget, budget]


def test_budget_below_one_group_selects_nothing():
    tokens = torch.arange(40) % 5
    summaries = select_summaries(tokens, 20, chunk=8, ratio=0.25, sink=0)  # sigma 5 < 8
    assert [s.numel() for s in summaries] == [0, 0]


def test_uniform_is_floor_linspace_over_the_candidates():
    tokens = torch.arange(20)
    summaries = select_summaries(tokens, 10, heuristic="uniform", chunk=2, ratio=0.4, sink=3)
    assert summaries[0].tolist() == [3, 5, 7, 9]  # floor(linspace(3, 9, 4))
    assert summaries[1].tolist() == [10, 13, 16, 19]  # floor(linspace(10, 19, 4))


def test_uniform_count_is_capped_at_the_candidates():
    summaries = select_summaries(torch.arange(10), 5, heuristic="uniform", chunk=1, ratio=1.0, sink=2)
    assert summaries[0].tolist() == [2, 3, 4]
    assert summaries[1].tolist() == [5, 6, 7, 8, 9]


def test_max_idf_catches_a_single_rare_token_that_tfidf_dilutes():
    # four blocks of 16, chunk 8. Block 3: [1 1 1 50 1 1 1 1] holds the needle 50 (IDF log 4) among
    # tokens of every block (IDF 0); [3 4 3 4 ...] holds tokens of two blocks (IDF log 2).
    tokens = torch.tensor([1] * 16 + [1] * 8 + [3, 4] * 4 + [1] * 16 + [1, 1, 1, 50, 1, 1, 1, 1] + [3, 4] * 4)
    max_idf = select_summaries(tokens, 16, chunk=8, ratio=0.5, sink=0)
    tfidf = select_summaries(tokens, 16, chunk=8, ratio=0.5, sink=0, heuristic="tfidf")
    assert max_idf[3].tolist() == list(range(48, 56))
    assert tfidf[3].tolist() == list(range(56, 64))


def reference_novelty_weights(tokens: list[int]) -> list[int]:
    once = Counter(tokens)
    pairs = Counter(zip(tokens, tokens[1:]))
    return [int(once[t] == 1) + int(p > 0 and pairs[(tokens[p - 1], t)] == 1) for p, t in enumerate(tokens)]


def reference_groups(tokens: list[int], block_size: int, heuristic: str, chunk: int, sink: int):
    """Loop-by-loop restatement of SPEC B.2 with this module's conventions: per block, the
    candidate positions, the chunk groups (lists of positions) and their scores."""
    n = -(-len(tokens) // block_size)
    blocks = [list(range(i * block_size, min((i + 1) * block_size, len(tokens)))) for i in range(n)]
    df = Counter(t for b in blocks for t in {tokens[p] for p in b})
    idf = {t: idf_as_computed(df[t], n) for t in df}
    cands = [b[min(sink, len(b)):] if i == 0 else b for i, b in enumerate(blocks)]
    groups = [[c[j:j + chunk] for j in range(0, len(c), chunk)] for c in cands]
    mean_len = sum(len(g) for gs in groups for g in gs) / max(sum(len(gs) for gs in groups), 1)
    weight = reference_novelty_weights(tokens)
    scores = []
    for block, cand, gs in zip(blocks, cands, groups):
        block_scores = []
        for g in gs:
            toks = [tokens[p] for p in g]
            if heuristic == "novelty":
                windows = [range(max(c - chunk // 2, cand[0]), min(c - chunk // 2 + chunk, block[-1] + 1)) for c in g]
                span = max(sum(weight[q] for q in w) for w in windows)
                block_scores.append(span * (2 * chunk + 1) + sum(weight[p] for p in g))
            elif heuristic == "max_idf":
                block_scores.append(max(idf[t] for t in toks))
            elif heuristic == "tfidf":
                block_scores.append(canonical_sum([idf[t] for t in toks]) / len(g))
            elif heuristic == "entropy":
                block_scores.append(len(set(toks)) / len(g))
            else:
                terms = [bm25_term(df[t], tf, n, len(g), mean_len) for t, tf in Counter(toks).items()]
                block_scores.append(canonical_sum(terms))
        scores.append(block_scores)
    return blocks, cands, groups, scores


def reference_budget(block: list[int], ratio: float, chunk: int) -> int:
    return int(Fraction(ratio).limit_denominator(10**6) * len(block)) // chunk


def assert_matches_the_loop_reference(tokens: list[int], block_size: int, heuristic: str, chunk: int,
                                      ratio: float, sink: int, tie_break: str = "position") -> None:
    """Scores bit for bit and summaries exactly (the reference's floats are the module's)."""
    got = select_summaries(torch.tensor(tokens), block_size, heuristic=heuristic, chunk=chunk,
                           ratio=ratio, sink=sink, tie_break=tie_break)
    blocks, cands, groups, scores = reference_groups(tokens, block_size, heuristic, chunk, sink)
    secondary = reference_groups(tokens, block_size, "tfidf", chunk, sink)[3] if tie_break == "tfidf" else None
    if heuristic != "uniform":
        got_scores = score_chunk_groups(torch.tensor(tokens), block_size, heuristic=heuristic, chunk=chunk, sink=sink)
        assert got_scores.score.tolist() == [x for sc in scores for x in sc]
    assert len(got) == len(blocks)
    for b, (summary, block, cand, gs, sc) in enumerate(zip(got, blocks, cands, groups, scores)):
        k = reference_budget(block, ratio, chunk)
        if heuristic == "uniform":
            s = min(k * chunk, len(cand))
            assert summary.tolist() == [cand[(j * (len(cand) - 1)) // max(s - 1, 1)] for j in range(s)]
            continue
        ties = secondary[b] if secondary else [0.0] * len(gs)
        best = sorted(sorted(range(len(gs)), key=lambda i: (-sc[i], -ties[i], i))[:k])
        assert summary.tolist() == [p for i in best for p in gs[i]]


@settings(max_examples=80, deadline=None)
@given(data=st.data(), heuristic=st.sampled_from(HEURISTICS), tie_break=st.sampled_from(TIE_BREAKS))
def test_vectorised_selection_matches_the_loop_reference(data, heuristic, tie_break):
    length = data.draw(st.integers(1, 60))
    tokens = data.draw(st.lists(st.integers(0, 9), min_size=length, max_size=length))
    block_size = data.draw(st.integers(1, 16))
    chunk = data.draw(st.integers(1, 5))
    sink = data.draw(st.integers(0, block_size))
    ratio = data.draw(st.sampled_from([0.125, 0.25, 0.3, 0.5, 1.0]))
    assert_matches_the_loop_reference(tokens, block_size, heuristic, chunk, ratio, sink, tie_break)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), heuristic=st.sampled_from(HEURISTICS), tie_break=st.sampled_from(TIE_BREAKS))
def test_selection_matches_the_loop_reference_on_longer_sequences(data, heuristic, tie_break):
    # many blocks of every kind (block 0 cut by the sink, alike middle blocks, a shorter last
    # block), groups that do or do not divide the block, Zipf-like or nearly constant ids
    length = data.draw(st.integers(100, 400))
    vocabulary = data.draw(st.sampled_from([2, 20, 500]))
    tokens = torch.multinomial(1.0 / torch.arange(1, vocabulary + 1, dtype=torch.float64), length, replacement=True,
                               generator=torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))).tolist()
    block_size = data.draw(st.integers(8, 96))
    chunk = data.draw(st.integers(1, 12))
    sink = data.draw(st.integers(0, block_size))
    ratio = data.draw(st.sampled_from([0.0625, 0.125, 0.29, 0.5, 1.0]))
    assert_matches_the_loop_reference(tokens, block_size, heuristic, chunk, ratio, sink, tie_break)


@pytest.mark.parametrize("tie_break", TIE_BREAKS)
@pytest.mark.parametrize("heuristic", HEURISTICS)
@pytest.mark.parametrize("tokens, block_size, chunk, sink, ratio", [
    ([7] * 490, 10, 3, 4, 0.5),  # one id in all 49 blocks: log(49 / 49) rounds just below 0, clamped
    (list(range(300)), 16, 5, 7, 0.5),  # every id distinct
    ([3, 1, 4, 1, 5, 9, 2, 6] * 5, 64, 4, 6, 0.5),  # one block, longer than the sequence
    ([3, 1, 4, 1, 5, 9, 2, 6] * 5, 8, 16, 2, 1.0),  # groups longer than the blocks
    ([3, 1, 4, 1, 5, 9, 2, 6] * 5, 8, 3, 8, 1.0),  # block 0 is all sink
    ([1, 2] * 20 + [9], 8, 3, 1, 0.5),  # a last block of one token
])
def test_selection_matches_the_loop_reference_on_edge_cases(heuristic, tie_break, tokens, block_size, chunk, sink,
                                                            ratio):
    assert_matches_the_loop_reference(tokens, block_size, heuristic, chunk, ratio, sink, tie_break)


@pytest.mark.parametrize("heuristic", BAG_OF_TOKENS)
def test_groups_with_the_same_tokens_in_another_order_tie_and_the_earlier_wins(heuristic):
    # block 1 holds the same multiset of tokens in four orders; the budget is one group
    other = [7, 8, 9, 9]
    tokens = torch.tensor([1, 2, 3, 4] * 4 + [3, 5, 6, 5, 5, 6, 3, 5, 6, 5, 5, 3, 5, 3, 5, 6])
    tokens = torch.cat([tokens[:16], torch.tensor(other * 4), tokens[16:]])
    scores = score_chunk_groups(tokens, 16, heuristic=heuristic, chunk=4, sink=0).score
    assert torch.unique(scores[8:]).numel() == 1
    summary = select_summaries(tokens, 16, heuristic=heuristic, chunk=4, ratio=0.25, sink=0)[2]
    assert summary.tolist() == [32, 33, 34, 35]


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(heuristic="maxidf"), ValueError, "heuristic"),
    (dict(chunk=0), ValueError, "chunk"),
    (dict(chunk=2.0), TypeError, "chunk"),
    (dict(ratio=0.0), ValueError, "ratio"),
    (dict(ratio=1.5), ValueError, "ratio"),
    (dict(ratio="0.1"), TypeError, "ratio"),
    (dict(sink=-1), ValueError, "sink"),
    (dict(sink=10), ValueError, "sink"),
    (dict(sink=True), TypeError, "sink"),
    (dict(tie_break="random"), ValueError, "tie_break"),
])
def test_select_summaries_rejects_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        select_summaries(FOUR_BLOCKS, 9, **{"sink": 0, **kwargs})


@pytest.mark.parametrize("token_ids, block_size, error, match", [
    ([1, 2, 3], 2, TypeError, "token_ids"),
    (torch.tensor([[1, 2]]), 2, ValueError, "1-D"),
    (torch.tensor([1.0, 2.0]), 2, TypeError, "integer"),
    (torch.tensor([True, False]), 2, TypeError, "integer"),
    (torch.tensor([], dtype=torch.int64), 2, ValueError, "empty"),
    (torch.tensor([1, -2]), 2, ValueError, "non-negative"),
    (torch.tensor([1, 2]), 0, ValueError, "block_size"),
    (torch.tensor([1, 2]), True, TypeError, "block_size"),
])
def test_bad_token_ids_and_block_size_are_rejected(token_ids, block_size, error, match):
    with pytest.raises(error, match=match):
        position_idf(token_ids, block_size)
    with pytest.raises(error, match=match):
        select_summaries(token_ids, block_size)


def test_novelty_weights_by_hand():
    # 5 and 7 occur once; the pair (1, 2) occurs twice, every other pair once
    tokens = torch.tensor([5, 1, 2, 1, 2, 7])
    assert novelty_weights(tokens).tolist() == [1, 1, 0, 1, 0, 2]
    assert novelty_weights(torch.tensor([4])).tolist() == [1]


def test_novelty_scores_by_hand():
    # blocks of 12, chunk 4: the rare run 8 9 at positions 7, 8; the pair (9, 2) occurs once too
    tokens = torch.tensor([1, 2, 3, 1, 2, 3, 1, 8, 9, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1])
    weights = novelty_weights(tokens)
    assert weights[:12].tolist() == [0, 0, 0, 0, 0, 0, 0, 2, 2, 1, 0, 0]
    scores = score_chunk_groups(tokens, 12, heuristic="novelty", chunk=4, sink=0).score
    # score = 9 * (best 4-token window [c-2, c+2) centred in the group) + own weight:
    # [0,4): windows reach position 4 at most, 0; [4,8): [5,9) = 4, own 2; [8,12): [6,10) = 5, own 3
    assert scores[:3].tolist() == [0, 4 * 9 + 2, 5 * 9 + 3]


def test_novelty_keeps_a_rare_span_that_straddles_a_group_boundary():
    # block 1 (positions 32..63, groups of 8): one token found in no other block at 43, and a run
    # of six such tokens at 53..58 across the groups [48,56) and [56,64). Max-IDF ties the three
    # groups at log n and keeps the earliest two; novelty keeps the two groups of the run.
    base = [1, 2, 3, 4, 5, 6, 7, 8]
    block1 = base + [2, 3, 4, 50, 5, 6, 7, 8] + [1, 2, 3, 4, 5, 40, 41, 42] + [43, 44, 45, 6, 7, 8, 1, 2]
    tokens = torch.tensor(base * 4 + block1 + base * 4)
    novelty = select_summaries(tokens, 32, heuristic="novelty", chunk=8, ratio=0.5, sink=0)[1]
    max_idf = select_summaries(tokens, 32, heuristic="max_idf", chunk=8, ratio=0.5, sink=0)[1]
    assert novelty.tolist() == list(range(48, 64))
    assert max_idf.tolist() == list(range(40, 56))


@pytest.mark.parametrize("heuristic", HEURISTICS)
def test_huge_token_ids_cost_no_memory_and_relabelling_changes_nothing(heuristic):
    # ids up to 2**63 - 1: a table indexed by token id (2**63 entries) cannot be allocated, and
    # an id times a group count would overflow int64. Any one-to-one relabelling of the ids leaves
    # every summary unchanged (scores read only equality of ids; ties go by position).
    generator = torch.Generator().manual_seed(0)
    small = torch.randint(0, 40, (300,), generator=generator)
    huge_ids = torch.tensor([2**63 - 1 - 7919 * i for i in range(40)], dtype=torch.int64)
    huge = huge_ids[small]
    for block_size, chunk in ((64, 8), (100, 4)):
        expected = select_summaries(small, block_size, heuristic=heuristic, chunk=chunk, sink=8)
        got = select_summaries(huge, block_size, heuristic=heuristic, chunk=chunk, sink=8)
        assert [g.tolist() for g in got] == [e.tolist() for e in expected]
    assert position_idf(huge, 64).tolist() == position_idf(small, 64).tolist()


def test_pulsar_config_takes_the_novelty_heuristic():
    from runtime.assembly import assemble
    from runtime.pulsar import PulsarConfig

    tokens = torch.randint(0, 30, (96,), generator=torch.Generator().manual_seed(1))
    layout = PulsarConfig(block_size=32, sink=4, chunk=4, heuristic="novelty").layout(tokens)
    expected = assemble(tokens, 32, sink=4, chunk=4, heuristic="novelty", shared_spine=True)
    assert torch.equal(layout.source_index, expected.source_index)
    assert not torch.equal(layout.source_index, assemble(tokens, 32, sink=4, chunk=4, heuristic="max_idf",
                                                         shared_spine=True).source_index)


@pytest.mark.parametrize("heuristic", BAG_OF_TOKENS)
def test_a_chunk_far_longer_than_the_blocks_costs_no_memory(heuristic):
    # every block is one group whatever the chunk beyond the block size: no table is sized by the chunk
    tokens = torch.randint(0, 30, (200,), generator=torch.Generator().manual_seed(2))
    huge = score_chunk_groups(tokens, 8, heuristic=heuristic, chunk=2**40, sink=3)
    small = score_chunk_groups(tokens, 8, heuristic=heuristic, chunk=8, sink=3)
    for field in huge._fields:
        assert torch.equal(getattr(huge, field), getattr(small, field))
