"""The Triton scorer under TRITON_INTERPRET=1 scores a (query, key) pair to the same bits in every
tile shape, row list and key list, on any CPU: it is exactly THE SCORER of runtime.dense_scorer.

Under the interpreter ``tl.dot`` would be a numpy matmul whose rounding depends on the matrix shape,
the operands' layout and the machine's BLAS kernel; the scorer instead runs the sequential
arithmetic of compiler/lowering/scoring/tile_arith.py there. These tests use general (non-integer,
wide-range) inputs, so any reassociation of a dot or of the head sum would show in the last bits.
"""
import pytest
import torch

from compiler.lowering import defaults
from compiler.lowering.scoring import indexer_scores
from compiler.lowering.order_codes import decode_codes
from compiler.lowering.scoring.indexer_scores import score_keys, score_tile_shape
from runtime.dense_scorer import exact_scores


def general_inputs(S, T, H, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(1, 1, 1, D, generator=g) * 2)  # columns of very different size
    q = (torch.randn(1, S, H, D, generator=g) * scale).to(dtype)
    k = (torch.randn(1, T, D, generator=g) * scale[0]).to(dtype)
    w = torch.randn(1, S, H, generator=g)
    return q, k, w


def reference_scores(q, w, k, keys):
    """THE SCORER (runtime) of every query against ``keys``: [1, S, len(keys)] fp32."""
    kf = k.float()[:, keys]
    return exact_scores(q.float()[0], w[0], kf[0][None].expand(q.shape[1], -1, -1))[None]


def triton_scores(q, w, k, keys, rows=None, mask=None, with_keys=False):
    """The Triton scorer's values for ``keys`` (one list) and the query ``rows`` (None = all)."""
    ids = torch.tensor(keys, dtype=torch.int32).view(1, 1, -1)
    counts = torch.tensor([[len(keys)]], dtype=torch.int32)
    codes = score_keys(q, w, k, ids, counts, cap=len(keys), tiles_per_list=1 << 30, rows=rows, mask=mask)
    values, indices = decode_codes(codes, k.shape[1])
    return (values, indices) if with_keys else values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H", [1, 3, 16])
@pytest.mark.parametrize("columns", ["one_query", 32, 128])
def test_scores_equal_the_runtime_scorer_bitwise_for_every_tile_shape(dtype, H, columns, monkeypatch):
    hp = score_tile_shape(H)[1]
    monkeypatch.setattr(defaults, "PRODUCT_COLUMNS", hp if columns == "one_query" else columns)
    S, T, D = 5, 150, 32
    q, k, w = general_inputs(S, T, H, D, dtype, seed=H)
    keys = list(range(T - 1, -1, -2)) + list(range(0, T, 2))  # every key, out of order
    got = triton_scores(q, w, k, keys)
    want = reference_scores(q, w, k, keys)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("n_rows", [1, 3, 16, 128])
def test_a_pair_scores_the_same_in_row_lists_of_any_length_and_in_any_key_list(n_rows):
    S, T, H, D = 130, 40, 4, 16
    q, k, w = general_inputs(S, T, H, D, torch.bfloat16, seed=n_rows)
    g = torch.Generator().manual_seed(n_rows + 100)
    listed = torch.randperm(S, generator=g)[:n_rows]
    rows = torch.cat((listed, torch.full((3,), -1)))[None]  # plus empty slots
    dense = triton_scores(q, w, k, list(range(T)))[0]
    keys = torch.randperm(T, generator=g)[:7].tolist()
    got = triton_scores(q, w, k, keys, rows=rows)[0]
    want = dense[listed][:, keys]
    assert torch.equal(got[:n_rows].view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_the_gpu_tile_form_computes_the_scores(dtype, masked, monkeypatch):
    """The GPU branch of the scorer (tl.dot with keys on the product's rows, fp32 as tf32), run here
    with the interpreter's numpy dot (fp32 products): the scores of THE SCORER within the rounding
    of a reassociated fp32 dot (the tf32 rounding itself is the GPU runs' to measure). With a
    causal mask the trimmed tail (only hidden keys) gets the hidden keys' codes."""
    monkeypatch.setattr(indexer_scores, "SEQUENTIAL", False)
    S, T, H, D = 6, 150, 16, 32
    q, k, w = general_inputs(S, T, H, D, dtype, seed=7)
    keys = list(range(T))
    mask = torch.ones(S, T, dtype=torch.bool).tril(40)[None] if masked else None  # keys > 45 hidden
    got, got_keys = triton_scores(q, w, k, keys, mask=mask, with_keys=True)
    want = reference_scores(q, w, k, keys)
    if masked:
        want = want.masked_fill(~mask, float("-inf"))
    assert torch.equal(got_keys[0], torch.arange(T).expand(S, T))
    assert torch.equal(got[0].isinf(), want[0].isinf())
    bound = (w.abs()[0, :, :, None] * torch.einsum("shd,td->sht", q[0].float().abs(), k[0].float().abs())).sum(1)
    finite = want[0].isfinite()
    assert ((got[0] - want[0]).abs()[finite] <= 1e-4 * bound[finite]).all()


@pytest.mark.parametrize("kind,anomaly", [("bool", None), ("bool", "hidden"), ("additive", None),
                                           ("additive", "hidden"), ("additive", "bias"),
                                           ("additive", "negative_zero")])
def test_masks_with_clear_runs_broken_anywhere_score_exactly(kind, anomaly):
    """Key tiles a program's mask shows whole with bias 0 skip the mask read; one hidden key, one
    finite nonzero bias or -0.0 biases inside a clear run (one row of the program) still count."""
    S, T, H, D = 6, 300, 3, 16
    q, k, w = general_inputs(S, T, H, D, torch.bfloat16, seed=11)
    keys = list(range(T))
    visible = torch.ones(S, T, dtype=torch.bool).tril(T - S)  # a causal chunk: early tiles clear
    bias = torch.zeros(S, T)
    if anomaly == "hidden":
        visible[2, 70] = False
    elif anomaly == "bias":
        bias[1, 130] = 0.75
    elif anomaly == "negative_zero":
        bias[0, 10:20] = -0.0
    mask = bias.masked_fill(~visible, float("-inf"))[None] if kind == "additive" else visible[None]
    got = triton_scores(q, w, k, keys, mask=mask)
    want = (reference_scores(q, w, k, keys) + bias).masked_fill(~visible, float("-inf")) + 0.0
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("order", ["ascending", "shuffled"])
@pytest.mark.parametrize("last_visible,unclear,offset", [(2, 1, 17), (1, 0, 17), (0, 2, 17), (2, 0, 63)])
def test_mask_bounds_pick_the_tiles_that_read_the_mask(last_visible, unclear, offset, order):
    """A mask whose first unclear entry and last visible key lie in given key tiles: tiles below
    every row's first unclear key read no mask, the others do, in a list of keys in any order
    (``shuffled``: clear and unclear keys mixed in one tile; offset 63: the first unclear key is
    its tile's last). Every code is still the runtime scorer's, hidden keys after the last visible
    one included."""
    S, H, D = 3, 2, 8
    step = 64  # the scorer's key tile
    T = 3 * step + 40
    q, k, w = general_inputs(S, T, H, D, torch.bfloat16, seed=5)
    visible = torch.ones(S, T, dtype=torch.bool)
    visible[:, last_visible * step + 10:] = False
    visible[1, unclear * step + offset] = False
    keys = list(range(T)) if order == "ascending" else torch.randperm(T, generator=torch.Generator().manual_seed(1)).tolist()
    got, got_keys = triton_scores(q, w, k, keys, mask=visible[None], with_keys=True)
    want = reference_scores(q, w, k, keys).masked_fill(~visible[:, keys], float("-inf")) + 0.0
    assert torch.equal(got_keys[0], torch.tensor(keys).expand(S, T))
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_an_overflowed_list_keeps_every_visible_key_and_no_hidden_one():
    """An overflowed list (count past cap: every key, position = key) under a causal mask, compact
    with tau = -inf: every visible key kept with the runtime scorer's value, the keys past every
    row's last visible one (not multiplied) never."""
    S, T, H, D = 4, 300, 2, 8
    q, k, w = general_inputs(S, T, H, D, torch.bfloat16, seed=7)
    visible = torch.ones(S, T, dtype=torch.bool).tril(253)  # keys from 257 on hidden for all: 256 starts a tile
    ids = torch.zeros(1, 1, 8, dtype=torch.int32)
    counts = torch.tensor([[9]], dtype=torch.int32)  # > cap = 8: overflowed
    want = reference_scores(q, w, k, list(range(T))).masked_fill(~visible, float("-inf")) + 0.0
    out = torch.empty(1, S, T, dtype=torch.int64)
    n = torch.zeros(1, S, dtype=torch.int32)
    score_keys(q, w, k, ids, counts, cap=8, tiles_per_list=1 << 30, mask=visible[None],
               tau=torch.full((1, S), float("-inf")), out=out, out_count=n)
    assert n[0].tolist() == visible.sum(-1).tolist()
    for s in range(S):
        values, keys = decode_codes(out[:, s, :n[0, s]], T)
        assert keys[0].tolist() == visible[s].nonzero().flatten().tolist()
        assert torch.equal(values[0].view(torch.int32), want[0, s, visible[s]].view(torch.int32))


@pytest.mark.parametrize("splits", [2, 5])
def test_key_splits_score_a_masked_list_the_same(splits):
    """Programs sharing a key list (GPU key splits) each scan their own range of it: codes equal
    one program's, non-compact and compacted (the compacted set: its order follows the atomics)."""
    S, T, H, D = 5, 700, 2, 8
    q, k, w = general_inputs(S, T, H, D, torch.bfloat16, seed=splits)
    visible = torch.ones(S, T, dtype=torch.bool).tril(T - S)
    visible[2, 300] = False
    bias = torch.zeros(S, T)
    bias[3, 450] = 0.5
    mask = bias.masked_fill(~visible, float("-inf"))[None]
    ids = torch.arange(T, dtype=torch.int32).view(1, 1, T)
    counts = torch.tensor([[T]], dtype=torch.int32)
    one = score_keys(q, w, k, ids, counts, cap=T, tiles_per_list=1 << 30, mask=mask)
    split = score_keys(q, w, k, ids, counts, cap=T, tiles_per_list=1 << 30, mask=mask, splits=splits)
    assert torch.equal(split, one)
    tau = torch.full((1, S), -1.0)

    def compacted(n):
        out = torch.full((1, S, T), torch.iinfo(torch.int64).min, dtype=torch.int64)
        count = torch.zeros((1, S), dtype=torch.int32)
        score_keys(q, w, k, ids, counts, cap=T, tiles_per_list=1 << 30, mask=mask, tau=tau, out=out,
                   out_count=count, splits=n)
        return out.sort(dim=-1).values, count

    got, want = compacted(splits), compacted(1)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
