"""runtime.conjunctive_mask: the definition against explicit broadcasting, and its argument checks."""
import pytest
import torch

from runtime.conjunctive_mask import CODES, MIRRORED, conjunctive_mask


def _factors(seed=0, B=2, S=9, T=13):
    g = torch.Generator().manual_seed(seed)
    pos = torch.arange(S).view(1, 1, S, 1) + T - S
    kpos = torch.arange(T).view(1, 1, 1, T)
    seq = (torch.rand(B, 1, S, 1, generator=g) < 0.3).cumsum(2)
    kseq = (torch.rand(B, 1, 1, T, generator=g) < 0.3).cumsum(3).to(torch.int32)
    pad = torch.rand(B, 1, 1, T, generator=g) < 0.8
    return pos, kpos, seq, kseq, pad


def test_causal_packed_padding_mask_equals_broadcasting():
    pos, kpos, seq, kseq, pad = _factors()
    terms = [CODES.index("ge"), 0, 0, CODES.index("eq"), 1, 1, CODES.index("col"), -1, 2]
    got = conjunctive_mask([pos, seq], [kpos, kseq, pad], terms)
    assert torch.equal(got, (pos >= kpos) & (seq == kseq) & pad)
    assert got.shape == (2, 1, 9, 13) and got.dtype == torch.bool


@pytest.mark.parametrize("code", [c for c in CODES if c in MIRRORED])
def test_each_comparison_is_torch_s(code):
    pos, kpos, *_ = _factors(seed=3)
    want = getattr(torch, code)(pos, kpos)
    assert torch.equal(conjunctive_mask([pos], [kpos], [CODES.index(code), 0, 0]), want)
    mirrored = getattr(torch, MIRRORED[code])(kpos, pos)
    assert torch.equal(want, mirrored)


@pytest.mark.parametrize("rows,cols,terms,error,match", [
    ([torch.zeros(4, 1, dtype=torch.long)], [torch.zeros(1, 5, dtype=torch.long)], [9, 0, 0], ValueError,
     r"terms\[0\]: expected a code"),
    ([torch.zeros(4, 1, dtype=torch.long)], [torch.zeros(1, 5, dtype=torch.long)], [0, 0], ValueError, "triples"),
    ([torch.zeros(4, 1, dtype=torch.long)], [torch.zeros(1, 5, dtype=torch.long)], [0, 0, 0] * 22, ValueError, "1 to 21"),
    ([torch.zeros(4, 1)], [torch.zeros(1, 5, dtype=torch.long)], [0, 0, 0], TypeError, r"rows\[0\]: expected an integer"),
    ([torch.zeros(4, 2, dtype=torch.long)], [torch.zeros(1, 5, dtype=torch.long)], [0, 0, 0], ValueError, r"rows\[0\]"),
    ([torch.zeros(4, 1, dtype=torch.long)], [torch.zeros(2, 5, dtype=torch.long)], [0, 0, 0], ValueError, r"cols\[0\]"),
    ([torch.zeros(4, 1, dtype=torch.long)], [torch.zeros(1, 5, dtype=torch.long)], [0, 1, 0], ValueError, r"terms\[1\]"),
    ([torch.zeros(4, 1, dtype=torch.long)], [torch.zeros(1, 5, dtype=torch.long)], [7, -1, 0], TypeError, "bool"),
    ([torch.zeros(3, 4, 1, dtype=torch.long)], [torch.zeros(2, 1, 5, dtype=torch.long)], [0, 0, 0], ValueError,
     "do not broadcast"),
])
def test_bad_arguments_are_named(rows, cols, terms, error, match):
    with pytest.raises(error, match=match):
        conjunctive_mask(rows, cols, terms)
