"""Dense scoring in key groups (indexer_scores.score_dense) under TRITON_INTERPRET=1: the same
codes as the key-list kernel for every key, mask kind, split and row list; interleaved chunk maxima
equal to those of the codes; per-row mask bounds; the exact selection that starts from them; and
the int32 words the dense path's long rows are written as."""
import pytest
import torch

from compiler.lowering.scoring import indexer_scores
from compiler.lowering.scoring.indexer_scores import (_mask_bounds_kernel, chunk_multiple, mask_operand,
                                                score_dense, score_keys)
from compiler.lowering.selection.threshold_select import chunk_maxima, kth_largest, top_codes

B, S, H, D, T = 2, 9, 4, 16, 450


def inputs(seed, integer=False):
    """q, k bf16 and w fp32; ``integer``: small integers, whose scores are exact in any summation
    order (for the tl.dot form, which the interpreter computes with numpy's BLAS)."""
    g = torch.Generator().manual_seed(seed)
    draw = ((lambda *shape: torch.randint(-2, 3, shape, generator=g).float()) if integer
            else (lambda *shape: torch.randn(*shape, generator=g)))
    return draw(B, S, H, D).to(torch.bfloat16), draw(B, T, D).to(torch.bfloat16), draw(B, S, H)


def masks():
    """Masks of every kind, with clear runs ending anywhere, hidden rows and visible holes."""
    g = torch.Generator().manual_seed(7)
    causal = torch.ones(S, T, dtype=torch.bool).tril(T - S - 200)
    causal[4] = False  # a row that sees nothing
    causal[6, 420] = True  # a lone visible key after a hidden run
    additive = torch.where(torch.rand(S, T, generator=g) < 0.3, float("-inf"), torch.randn(S, T, generator=g))
    additive[:, :200] = 0.0
    additive[2, 17] = 0.25  # an unclear entry early in one row
    return {"none": None, "bool": causal[None].expand(B, S, T), "short": torch.ones(S, T, dtype=torch.bool).tril(130)[None],
            "few": torch.ones(S, T, dtype=torch.bool).tril(20)[None],  # chunks of hidden keys only
            "additive": additive[None], "additive_bf16": additive.to(torch.bfloat16)[None]}


def listed_codes(q, w, k, mask):
    ids = torch.arange(T, dtype=torch.int32).view(1, 1, T).expand(B, 1, T)
    counts = torch.full((B, 1), T, dtype=torch.int32)
    return score_keys(q, w, k, ids, counts, cap=T, tiles_per_list=1 << 30, mask=mask)


@pytest.mark.parametrize("mask_name,splits,gpu_form", [
    ("none", 1, False), ("bool", 3, False), ("short", 1, False), ("few", 3, False), ("additive", 1, False),
    ("additive_bf16", 3, False), ("none", 3, True), ("bool", 1, True)])
def test_dense_codes_and_chunk_maxima_equal_the_key_list_kernel(mask_name, splits, gpu_form, monkeypatch):
    if gpu_form:  # the tl.dot / tl.sum form, on integer inputs (exact whatever the BLAS)
        monkeypatch.setattr(indexer_scores, "SEQUENTIAL", False)
    q, k, w = inputs(splits, integer=gpu_form)
    mask = masks()[mask_name]
    want = listed_codes(q, w, k, mask)
    n = 3 * chunk_multiple(q.dtype)  # does not divide T: the last chunks are one key shorter
    maxima = torch.empty(B, S, n, dtype=torch.int64)
    got = score_dense(q, w, k, mask=mask, splits=splits, maxima=maxima)
    assert torch.equal(got, want)
    assert torch.equal(maxima, chunk_maxima(want.view(-1, T), n).view(B, S, n))
    assert torch.equal(score_dense(q, w, k, mask=mask, splits=splits), want)


@pytest.mark.parametrize("mask_name", ["none", "bool", "additive"])
def test_row_lists_score_their_rows_and_leave_empty_slots(mask_name):
    q, k, w = inputs(3)
    mask = masks()[mask_name]
    full = listed_codes(q, w, k, mask)
    rows = torch.tensor([[3, -1, 0, 8, 5], [7, 7, -1, -1, 2]])
    n = chunk_multiple(q.dtype)
    maxima = torch.full((B, 5, n), 11, dtype=torch.int64)
    got = score_dense(q, w, k, mask=mask, rows=rows, maxima=maxima)
    for b in range(B):
        for j, row in enumerate(rows[b].tolist()):
            if row >= 0:
                assert torch.equal(got[b, j], full[b, row])
                assert torch.equal(maxima[b, j], chunk_maxima(full[b, row][None], n)[0])
            else:
                assert torch.equal(maxima[b, j], torch.full((n,), 11))  # nothing written


def bounds_reference(mask, rows):
    """(first key not clear or T, one past the last visible key or 0) per listed row."""
    kind, m, _ = mask_operand(mask, B, S, T)
    visible = m != 0 if kind == indexer_scores.MASK_BOOL else m != float("-inf")
    clear = visible & ((m == 0) if kind != indexer_scores.MASK_BOOL else visible)
    keys = torch.arange(T)
    first = torch.where(~clear, keys, T).amin(-1)
    end = torch.where(visible, keys + 1, 0).amax(-1)
    out = torch.stack((first, end), -1).to(torch.int32)
    return torch.stack([torch.stack([out[b, r] if r >= 0 else torch.tensor([T, 0], dtype=torch.int32)
                                     for r in rows[b].tolist()]) for b in range(B)])


@pytest.mark.parametrize("mask_name", ["bool", "short", "additive", "additive_bf16"])
@pytest.mark.parametrize("block", [64, 512])
def test_mask_bounds_are_the_first_unclear_and_last_visible_keys(mask_name, block):
    mask = masks()[mask_name]
    kind, m, (msb, mss, mst) = mask_operand(mask, B, S, T)
    rows = torch.tensor([[0, 4, -1, 6, 2], [8, 1, 2, -1, 4]])
    for per_program in (1, 4):  # the last program's block of slots runs past the 5 slots
        out = torch.empty((B, 5, 2), dtype=torch.int32)
        n_blocks = -(-5 // per_program)
        _mask_bounds_kernel[(B * n_blocks,)](m, rows, out, S, T, 5, n_blocks, msb, mss, mst, rows.stride(0),
                                             MASK_KIND=kind, ROWS=True, R=per_program, BLOCK=block)
        assert torch.equal(out, bounds_reference(mask, rows))


def test_maxima_of_the_wrong_form_are_refused_by_name():
    q, k, w = inputs(0)
    for bad in (torch.empty(B, S, 100, dtype=torch.int64), torch.empty(B, S, 64, dtype=torch.int32),
                torch.empty(B, S + 1, 64, dtype=torch.int64), torch.empty(B, S, 768, dtype=torch.int64)):
        with pytest.raises(ValueError, match="maxima"):
            score_dense(q, w, k, maxima=bad)


def test_threshold_is_the_kth_largest_for_any_int64():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-2**63, 2**63 - 1, (6, 300), generator=g, dtype=torch.int64)
    x[1] = 5  # all equal
    x[2, :10] = torch.iinfo(torch.int64).max
    x[3] = torch.iinfo(torch.int64).min
    x[4, ::2] = -1
    for kk in (1, 7, 150, 300):
        assert torch.equal(kth_largest(x, kk), torch.topk(x, kk, dim=-1).values[:, -1])


def test_top_codes_from_given_maxima_is_exact_and_checks_them():
    q, k, w = inputs(5)
    mask = masks()["bool"]
    maxima = torch.empty(B, S, 64, dtype=torch.int64)
    codes = score_dense(q, w, k, mask=mask, maxima=maxima)
    for kk in (8, 40):  # 64 chunks >= kk; rows of 450 > 8 kk codes take the threshold path
        assert torch.equal(top_codes(codes, kk, maxima), torch.topk(codes, kk, dim=-1).values)
    with pytest.raises(ValueError, match="maxima"):
        top_codes(codes, 40, maxima[..., :32])  # fewer chunks than kk
    with pytest.raises(ValueError, match="maxima"):
        top_codes(codes, 8, maxima[:, :3])


@pytest.mark.parametrize("mask_name", ["bool", "additive"])
def test_words_are_the_codes_high_words_and_select_as_the_codes(mask_name):
    """``score_dense(words=True)``: int32 [B,S,T], each code's high word, the same chunk maxima;
    ``top_codes`` of the words equals ``torch.topk`` of the codes."""
    q, k, w = inputs(3)
    mask = masks()[mask_name]
    maxima, word_maxima = (torch.empty(B, S, 64, dtype=torch.int64) for _ in range(2))
    codes = score_dense(q, w, k, mask=mask, maxima=maxima)
    words = score_dense(q, w, k, mask=mask, maxima=word_maxima, words=True)
    assert words.dtype == torch.int32 and torch.equal(words, (codes >> 32).to(torch.int32))
    assert torch.equal(word_maxima, maxima)
    assert torch.equal(top_codes(words, 8, word_maxima), torch.topk(codes, 8, dim=-1).values)


def test_the_dense_path_selects_long_rows_from_words(monkeypatch):
    """``dense_codes_topk`` has the scorer write words (and maxima) for rows that take the threshold
    path, codes for short ones, and hands the scorer the mask's bounds, whose visible extents also
    stop the compaction; its result is the codes' top-kk either way: on the threshold path under
    every mask kind (rows that see nothing, a lone visible key after a hidden run, chunks of hidden
    keys only), on the codes' path with and without a mask (the scorer's codes under every mask
    kind: test_dense_codes_and_chunk_maxima_equal_the_key_list_kernel)."""
    from compiler.lowering import topk_pipeline
    q, k, w = inputs(4)
    calls = []
    real = topk_pipeline.score_dense
    monkeypatch.setattr(topk_pipeline, "score_dense",
                        lambda *a, **kw: calls.append((kw.get("words"), kw.get("maxima") is not None,
                                                       kw.get("bounds") is not None)) or real(*a, **kw))
    for name, mask in masks().items():
        codes = score_dense(q, w, k, mask=mask)
        for kk, form in ((8, (True, True)), (100, (False, False))):  # 450 > 8 x 8 keys: threshold; 450 < 8 x 100: not
            if kk == 100 and name not in ("none", "bool"):
                continue
            calls.clear()
            got = topk_pipeline.dense_codes_topk(q, w.float(), k, mask, kk)
            assert calls == [(*form, mask is not None)], name
            assert torch.equal(got, torch.topk(codes, kk, dim=-1).values), (name, kk)
