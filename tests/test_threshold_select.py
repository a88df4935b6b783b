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
@pytest.mark.parametrize("N,kk", [(1000, 7), (333, 41), (97, 1)])
@pytest.mark.parametrize("step", [64, threshold_select.COMPACT_BLOCK])
def test_equals_torch_topk(kind, N, kk, step, monkeypatch):
    """Compaction steps shorter than a row (several steps) and the default."""
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
