"""The pipeline's row bookkeeping kernels (compiler.lowering.selection.redo_rows) against the torch
forms they replace: the short and redo flags, the redo's ranked or per-row row lists, and the call's
statistics counters."""
import pytest
import torch
import triton

from compiler.lowering.selection.redo_rows import call_counts, redo_row_lists, row_flags
from runtime.certified_topk import TopkStats

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def _flags_reference(cand_count, kk, cand_cap, tau, shared):
    short = torch.zeros_like(cand_count, dtype=torch.bool)
    if shared is not None:
        short = (cand_count < kk) & (tau == shared) & torch.isfinite(tau)
    return (cand_count > cand_cap) | ((cand_count < kk) & ~short), short


def _lists_reference(redo, slots, head=0):
    """(head [B, H'], rounds [rounds, B, R]) row lists (-1 = empty), built with torch."""
    B, S = redo.shape
    query = torch.arange(S).expand(B, S)
    if not head and slots >= S:
        return torch.empty(B, 0, dtype=torch.int64), torch.where(redo, query, -1)[None]
    head = min(head, S)
    width = min(slots, S - head) if head else slots
    rounds = triton.cdiv(S - head, width) if width else 0
    n = head + rounds * width
    rank = torch.where(redo, torch.cumsum(redo.to(torch.int64), dim=1) - 1, n)
    lists = torch.full((B, n + 1), -1, dtype=torch.int64).scatter(1, rank, torch.where(redo, query, -1))[:, :-1]
    return lists[:, :head], lists[:, head:].reshape(B, rounds, width).transpose(0, 1)


@pytest.mark.parametrize("B, S, slots, head, density", [
    (2, 12, 8, 0, 0.4), (3, 2100, 512, 0, 0.3), (2, 2100, 4096, 0, 0.3), (2, 700, 128, 0, 1.0), (1, 50, 16, 0, 0.0),
    (3, 2100, 512, 32, 0.3), (2, 2100, 4096, 16, 0.01), (2, 12, 8, 32, 0.5), (2, 40, 16, 8, 1.0)])
def test_redo_row_lists_are_the_torch_lists(B, S, slots, head, density):
    """Without a head: own slots (one round) or ranked rounds; with one: the head, then ranked rounds of
    the rest (none when the head holds every row)."""
    g = torch.Generator().manual_seed(S + head)
    redo = torch.rand(B, S, generator=g) < density
    got_head, got_rounds = redo_row_lists(redo, slots, head)
    want_head, want_rounds = _lists_reference(redo, slots, head)
    for (lists, valid, out_rows), want in ((got_head, want_head), (got_rounds, want_rounds)):
        assert torch.equal(lists, want)
        assert torch.equal(valid, want >= 0)
        assert torch.equal(out_rows, (torch.arange(B) * S).view(B, 1) + want.clamp(min=0))
    assert all(got_rounds[0][i].is_contiguous() for i in range(got_rounds[0].shape[0]))
    assert got_head[0].is_contiguous()


@pytest.mark.parametrize("B, S, G", [(1, 1, 1), (2, 1500, 2), (3, 2049, 4)])
def test_call_counts_are_the_torch_sums(B, S, G):
    """Several kernel steps of rows and lists, lists past the cap and rows past the buffer, short rows;
    T * queries past 2^31."""
    g = torch.Generator().manual_seed(B * S + G)
    T, cap, kk = 3 << 20, 5000, 2048
    cand_cap = 4096
    lists = torch.randint(0, 2 * cap, (B, triton.cdiv(S, G)), generator=g, dtype=torch.int32)
    counts = torch.randint(0, 2 * cand_cap, (B, S), generator=g, dtype=torch.int32)
    short = torch.rand(B, S, generator=g) < 0.3
    got = dict(zip(TopkStats.NAMES, call_counts(lists, counts, short, T, cap, G, kk, cand_cap).tolist()))
    want = {"queries": B * S, "keys_screened": B * S * T, "written": int(counts.sum()),
            "survivors": int(torch.where(lists > cap, T, lists).to(torch.int64).sum()) * G,
            "overflow": int((counts > cand_cap).sum()), "threshold_miss": int(((counts < kk) & ~short).sum())}
    assert got == {name: want.get(name, 0) for name in TopkStats.NAMES}
