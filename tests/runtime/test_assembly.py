"""Packed phase-1 layouts of pulsar, star and dense (runtime.assembly)."""
import pytest
import torch

from runtime.assembly import PackedLayout, assemble
from runtime.summaries import select_summaries

# Blocks of 4: B0 = [5 1 1 2], B1 = [1 3 4 1], B2 = [1 1 7 1], B3 = [1 2] (shorter last block).
# Document frequencies over the 4 blocks: token 1 -> 4, token 2 -> 2, others -> 1.
TOKENS = torch.tensor([5, 1, 1, 2, 1, 3, 4, 1, 1, 1, 7, 1, 1, 2])
# With sink=1, chunk=2, ratio=0.5 (one group of 2 per full block), Max-IDF picks:
#   B0: candidates 1..3, groups [1,2] (max IDF 0) and [3] (log 2)      -> Σ0 = [3]
#   B1: groups [4,5] and [6,7] tie at log 4, the earlier group wins     -> Σ1 = [4, 5]
#   B2: groups [8,9] (0) and [10,11] (log 4)                            -> Σ2 = [10, 11]
PULSAR = dict(mode="pulsar", sink=1, chunk=2, ratio=0.5)


def fields(layout: PackedLayout) -> dict:
    names = ("source_index", "position_ids", "keep", "segment_start", "prefix_end", "cu_seqlens", "block_of")
    out = {name: getattr(layout, name).tolist() for name in names}
    out["query_position_start"] = layout.query_position_start
    return out


def test_dense_layout_is_one_causal_segment_of_the_whole_context():
    got = fields(assemble(TOKENS, 4, mode="dense"))
    assert got == {
        "source_index": list(range(14)), "position_ids": list(range(14)), "keep": [True] * 14,
        "segment_start": [0] * 14, "prefix_end": [0] * 14, "cu_seqlens": [0, 14],
        "block_of": [0] * 4 + [1] * 4 + [2] * 4 + [3] * 2, "query_position_start": 14,
    }


def test_star_layout_prefixes_every_later_block_with_the_anchor_prefix():
    layout = assemble(TOKENS, 4, mode="star", anchor=2)
    assert layout.source_index.tolist() == [0, 1, 2, 3, 0, 1, 4, 5, 6, 7, 0, 1, 8, 9, 10, 11, 0, 1, 12, 13]
    assert layout.position_ids.tolist() == layout.source_index.tolist()
    assert layout.keep.tolist() == [True] * 4 + ([False] * 2 + [True] * 4) * 2 + [False] * 2 + [True] * 2
    assert layout.segment_start.tolist() == [0] * 4 + [4] * 6 + [10] * 6 + [16] * 4
    assert layout.prefix_end.tolist() == [0] * 20
    assert layout.cu_seqlens.tolist() == [0, 4, 10, 16, 20]
    assert layout.cu_seqlens.dtype == torch.int32
    assert layout.block_of.tolist() == [0] * 6 + [1] * 4 + [0] * 2 + [2] * 4 + [0] * 2 + [3] * 2
    assert layout.query_position_start == 14


def test_star_default_anchor_is_the_whole_first_block():
    layout = assemble(TOKENS, 4, mode="star")
    anchor = [0, 1, 2, 3]
    assert layout.source_index.tolist() == (anchor + anchor + [4, 5, 6, 7] + anchor + [8, 9, 10, 11]
                                            + anchor + [12, 13])


def test_star_contiguous_positions_restart_per_input_and_queries_follow_the_longest():
    layout = assemble(TOKENS, 4, mode="star", anchor=2, positions="contiguous")
    assert layout.position_ids.tolist() == [0, 1, 2, 3] + list(range(6)) * 2 + [0, 1, 2, 3]
    assert layout.query_position_start == 6


def test_pulsar_layout_prefixes_sink_and_preceding_summaries():
    got = fields(assemble(TOKENS, 4, **PULSAR))
    inputs = [[0, 1, 2, 3], [0, 3, 4, 5, 6, 7], [0, 3, 4, 5, 8, 9, 10, 11], [0, 3, 4, 5, 10, 11, 12, 13]]
    assert got["source_index"] == sum(inputs, [])
    assert got["position_ids"] == got["source_index"]
    assert got["keep"] == ([True] * 4 + [False] * 2 + [True] * 4 + [False] * 4 + [True] * 4
                           + [False] * 6 + [True] * 2)
    assert got["segment_start"] == [0] * 4 + [4] * 6 + [10] * 8 + [18] * 8
    assert got["prefix_end"] == [0] * 26
    assert got["cu_seqlens"] == [0, 4, 10, 18, 26]
    assert got["block_of"] == [0] * 6 + [1] * 4 + [0, 0, 1, 1] + [2] * 4 + [0, 0, 1, 1, 2, 2, 3, 3]
    assert got["query_position_start"] == 14


def test_pulsar_contiguous_positions_restart_per_input():
    layout = assemble(TOKENS, 4, positions="contiguous", **PULSAR)
    assert layout.position_ids.tolist() == list(range(4)) + list(range(6)) + list(range(8)) * 2
    assert layout.query_position_start == 8


def test_pulsar_summaries_follow_the_tie_break():
    # B1 = [1 3 9 8]: groups [4,5] = (1, 3) and [6,7] = (9, 8) tie at Max-IDF log 4; TF-IDF prefers [6,7]
    tokens = torch.tensor([5, 1, 1, 2, 1, 3, 9, 8, 1, 1, 7, 1, 1, 2])
    by_position = assemble(tokens, 4, **PULSAR)
    by_tfidf = assemble(tokens, 4, tie_break="tfidf", **PULSAR)
    assert by_position.source_index[10:14].tolist() == [0, 3, 4, 5]  # Input_2 = [sink, Σ0, Σ1, ...]
    assert by_tfidf.source_index[10:14].tolist() == [0, 3, 6, 7]


def test_shared_spine_layout_encodes_sink_and_summaries_once_before_the_blocks():
    got = fields(assemble(TOKENS, 4, shared_spine=True, **PULSAR))
    assert got == {
        "source_index": [0, 3, 4, 5, 10, 11] + list(range(14)),
        "position_ids": [0, 3, 4, 5, 10, 11] + list(range(14)),
        "keep": [False] * 6 + [True] * 14,
        "segment_start": [0] * 6 + [6] * 4 + [10] * 4 + [14] * 4 + [18] * 2,
        "prefix_end": [0] * 10 + [2] * 4 + [4] * 4 + [6] * 2,
        "cu_seqlens": [0, 6, 10, 14, 18, 20],
        "block_of": [0, 0, 1, 1, 2, 2] + [0] * 4 + [1] * 4 + [2] * 4 + [3] * 2,
        "query_position_start": 14,
    }


def test_shared_spine_contiguous_positions_continue_the_spine_prefix():
    layout = assemble(TOKENS, 4, shared_spine=True, positions="contiguous", **PULSAR)
    assert layout.position_ids.tolist() == list(range(6)) + [0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7]
    assert layout.query_position_start == 8


@pytest.mark.parametrize("positions", ["sparse", "contiguous"])
@pytest.mark.parametrize("shared_spine", [False, True])
def test_one_block_pulsar_equals_dense(positions, shared_spine):
    tokens = torch.randint(0, 50, (37,), generator=torch.Generator().manual_seed(0))
    pulsar = assemble(tokens, 64, sink=8, chunk=4, positions=positions, shared_spine=shared_spine)
    dense = assemble(tokens, 64, mode="dense", positions=positions)
    assert fields(pulsar) == fields(dense)


INPUT_CONFIGS = [
    dict(length=53, block_size=8, sink=3, chunk=2, ratio=0.25, heuristic="entropy", anchor=5),
    dict(length=64, block_size=16, sink=0, chunk=4, ratio=0.5, heuristic="max_idf", anchor=16),
]


@pytest.mark.parametrize("config", INPUT_CONFIGS, ids=["L53-B8", "L64-B16"])
def test_inputs_are_the_spec_concatenations(config):
    cfg = dict(config)
    length, block_size, anchor = cfg.pop("length"), cfg.pop("block_size"), cfg.pop("anchor")
    tokens = torch.randint(0, 9, (length,), generator=torch.Generator().manual_seed(3))
    blocks = [list(range(s, min(s + block_size, length))) for s in range(0, length, block_size)]
    sigma = [x.tolist() for x in select_summaries(tokens, block_size, **cfg)]
    sink = blocks[0][: cfg["sink"]]
    pulsar = [blocks[0]] + [sink + sum(sigma[:i], []) + blocks[i] for i in range(1, len(blocks))]
    star = [blocks[0]] + [blocks[0][:anchor] + b for b in blocks[1:]]
    for mode, want, extra in (("pulsar", pulsar, cfg), ("star", star, dict(anchor=anchor))):
        layout = assemble(tokens, block_size, mode=mode, **extra)
        bounds = layout.cu_seqlens.tolist()
        got = [layout.source_index[a:b].tolist() for a, b in zip(bounds, bounds[1:])]
        assert got == want


def _visible_keys(layout: PackedLayout, visibility: torch.Tensor, query: int) -> list[tuple[int, int]]:
    keys = torch.nonzero(visibility[query]).flatten()
    return list(zip(layout.source_index[keys].tolist(), layout.position_ids[keys].tolist()))


CONFIGS = [
    dict(length=37, block_size=8, sink=2, chunk=2, ratio=0.25, heuristic="max_idf"),
    dict(length=40, block_size=10, sink=0, chunk=3, ratio=0.5, heuristic="tfidf"),
    dict(length=29, block_size=6, sink=6, chunk=2, ratio=0.4, heuristic="bm25"),
    dict(length=50, block_size=12, sink=4, chunk=4, ratio=0.34, heuristic="uniform"),
]


@pytest.mark.parametrize("positions", ["sparse", "contiguous"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"L{c['length']}-B{c['block_size']}-{c['heuristic']}")
def test_shared_spine_visibility_of_each_block_equals_its_own_input(config, positions):
    cfg = dict(config)
    length, block_size = cfg.pop("length"), cfg.pop("block_size")
    tokens = torch.randint(0, 12, (length,), generator=torch.Generator().manual_seed(length))
    unshared = assemble(tokens, block_size, positions=positions, **cfg)
    shared = assemble(tokens, block_size, positions=positions, shared_spine=True, **cfg)
    vis_u, vis_s = unshared.visibility(), shared.visibility()
    bounds = unshared.cu_seqlens.tolist()
    n = len(bounds) - 1
    for block in range(n):
        in_input = torch.arange(bounds[block], bounds[block + 1])
        queries_u = in_input[unshared.keep[in_input]]
        queries_s = torch.nonzero(shared.keep & (shared.block_of == block)).flatten()
        assert shared.source_index[queries_s].tolist() == unshared.source_index[queries_u].tolist()
        assert shared.position_ids[queries_s].tolist() == unshared.position_ids[queries_u].tolist()
        for qu, qs in zip(queries_u.tolist(), queries_s.tolist()):
            assert _visible_keys(shared, vis_s, qs) == _visible_keys(unshared, vis_u, qu)
    assert shared.query_position_start == unshared.query_position_start


@pytest.mark.parametrize("mode, shared_spine", [("pulsar", False), ("pulsar", True), ("star", False),
                                                ("dense", False)])
def test_kept_tokens_are_the_context_once_in_order(mode, shared_spine):
    tokens = torch.randint(0, 30, (45,), generator=torch.Generator().manual_seed(1))
    layout = assemble(tokens, 10, mode=mode, sink=3, chunk=2, shared_spine=shared_spine)
    assert layout.source_index[layout.keep].tolist() == list(range(45))
    assert torch.equal(layout.block_of, layout.source_index // 10)
    assert (layout.prefix_end <= layout.segment_start).all()
    assert (layout.segment_start <= torch.arange(layout.keep.numel())).all()


def test_visibility_expands_the_two_interval_rule():
    layout = assemble(TOKENS, 4, shared_spine=True, **PULSAR)
    vis = layout.visibility()
    # packed 10 is the first token of B1: spine prefix [sink, Σ0] = packed 0..1, then itself
    assert torch.nonzero(vis[10]).flatten().tolist() == [0, 1, 10]
    # packed 3 is in the spine (Σ1): causal on the spine
    assert torch.nonzero(vis[3]).flatten().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(mode="star", shared_spine=True), ValueError, "shared_spine"),
    (dict(mode="pulsar", anchor=2), ValueError, "anchor"),
    (dict(mode="star", anchor=5), ValueError, "anchor"),
    (dict(mode="star", anchor=0), ValueError, "anchor"),
    (dict(mode="ring"), ValueError, "mode"),
    (dict(positions="absolute"), ValueError, "positions"),
    (dict(shared_spine=1), TypeError, "shared_spine"),
    (dict(sink=5), ValueError, "sink"),
    (dict(sink=1, tie_break="random"), ValueError, "tie_break"),
])
def test_assemble_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        assemble(TOKENS, 4, **kwargs)


def test_assemble_rejects_non_integer_tokens_and_bad_block_size():
    with pytest.raises(TypeError, match="token_ids"):
        assemble(TOKENS.float(), 4)
    with pytest.raises(ValueError, match="block_size"):
        assemble(TOKENS, 0)
