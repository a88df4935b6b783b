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


def _lists_reference(redo, slots):
    """[B, rounds, R] row lists (-1 = empty), as the pipeline built them with torch."""
    B, S = redo.shape
    query = torch.arange(S).expand(B, S)
    if slots >= S:
        return torch.where(redo, query, -1)[:, None]
    rounds = triton.cdiv(S, slots)
    rank = torch.where(redo, torch.cumsum(redo.to(torch.int64), dim=1) - 1, rounds * slots)
    lists = torch.full((B, rounds * slots + 1), -1, dtype=torch.int64).scatter(1, rank, torch.where(redo, query, -1))
    return lists[:, :-1].reshape(B, rounds, slots)


@pytest.mark.parametrize("with_shared", [False, True])
def test_row_flags_are_the_torch_flags(with_shared):
    g = torch.Generator().manual_seed(1)
    B, S, kk, cand_cap = 3, 1500, 8, 20  # more rows than one kernel step
    cand_count = torch.randint(0, 25, (B, S), generator=g, dtype=torch.int32)
    tau = torch.randn(B, S, generator=g)
    tau[0, :300] = float("inf")
    tau[1, :300] = float("nan")
    tau[2, :300] = float("-inf")
    shared = torch.where(torch.rand(B, S, generator=g) < 0.5, tau, tau + 1) if with_shared else None
    redo, short = row_flags(cand_count, kk, cand_cap, tau, shared)
    want_redo, want_short = _flags_reference(cand_count, kk, cand_cap, tau, shared)
    assert redo.dtype == short.dtype == torch.bool
    assert torch.equal(redo, want_redo) and torch.equal(short, want_short)
    assert short.any() == with_shared and redo.any() and not redo.all()


@pytest.mark.parametrize("B, S, slots, density", [(2, 12, 8, 0.4), (3, 2100, 512, 0.3), (2, 2100, 4096, 0.3),
                                                  (2, 700, 128, 1.0), (1, 50, 16, 0.0)])
def test_redo_row_lists_are_the_torch_lists(B, S, slots, density):
    g = torch.Generator().manual_seed(S)
    redo = torch.rand(B, S, generator=g) < density
    lists, valid, out_rows = redo_row_lists(redo, slots)
    want = _lists_reference(redo, slots).transpose(0, 1)  # [rounds, B, R]
    assert torch.equal(lists, want)
    assert torch.equal(valid, want >= 0)
    assert torch.equal(out_rows, (torch.arange(B) * S)[None, :, None] + want.clamp(min=0))
    assert all(lists[i].is_contiguous() for i in range(lists.shape[0]))


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
