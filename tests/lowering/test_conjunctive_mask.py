"""The conjunctive-mask Triton kernel (compiler/lowering/conjunctive_mask.py) against the definition,
under TRITON_INTERPRET=1 (integer comparisons only: bitwise on any CPU)."""
import pytest
import torch

from compiler.lowering import defaults
from compiler.lowering.conjunctive_mask import conjunctive_mask_triton
from runtime.conjunctive_mask import CODES, conjunctive_mask
from tests.runtime.test_conjunctive_mask import _factors


@pytest.mark.parametrize("B,S,T", [(1, 16, 512), (2, 37, 53), (3, 5, 700)])
def test_every_code_in_one_mask_equals_the_definition(B, S, T, monkeypatch):
    """Block-sized and ragged tiles, factors of batch 1 and B, int64 / int32 / bool, a 0-dim bool."""
    monkeypatch.setattr(defaults, "MASK_BLOCK_T", 256)
    pos, kpos, seq, kseq, pad = _factors(seed=S + T, B=B, S=S, T=T)
    first = pos < S // 2 + T - S
    rows, cols = [pos, seq, first, torch.tensor(True)], [kpos, kseq, pad]
    terms = []
    for code in CODES:
        i = {"row": 2, "col": -1}.get(code, 0 if code in ("le", "lt", "ge", "gt") else 1)
        j = {"row": -1, "col": 2}.get(code, 0 if code in ("le", "lt", "ge", "gt") else 1)
        terms += [CODES.index(code), i, j]
    for n in range(0, len(terms), 3):  # each term alone, then all of them
        one = terms[n:n + 3]
        assert torch.equal(conjunctive_mask_triton(rows, cols, one), conjunctive_mask(rows, cols, one))
    assert torch.equal(conjunctive_mask_triton(rows, cols, terms + [6, 3, -1]),
                       conjunctive_mask(rows, cols, terms + [6, 3, -1]))


def test_causal_mask_of_a_cache_step():
    """Decode-shaped: 1 query at position 99 against 100 keys."""
    rows, cols = [torch.tensor([[[[99]]]])], [torch.arange(100).view(1, 1, 1, 100)]
    got = conjunctive_mask_triton(rows, cols, [CODES.index("ge"), 0, 0])
    assert got.shape == (1, 1, 1, 100) and bool(got.all())


def test_empty_mask_and_bad_arguments():
    empty = conjunctive_mask_triton([torch.zeros(0, 1, dtype=torch.long)], [torch.zeros(1, 4, dtype=torch.long)],
                                    [0, 0, 0])
    assert empty.shape == (0, 4)
    with pytest.raises(TypeError, match=r"cols\[0\]: expected an integer or bool tensor"):
        conjunctive_mask_triton([torch.zeros(3, 1, dtype=torch.long)], [torch.zeros(1, 4)], [0, 0, 0])


_SM90_BUILD = r"""
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from compiler.lowering import conjunctive_mask as M
from compiler.lowering import defaults

kernel = M._conjunctive_mask_kernel
for codes, terms in ((2, 1), (6 | 2 << 3 | 4 << 6 | 7 << 9, 4), (0 | 1 << 3 | 3 << 6 | 5 << 9, 4)):
    consts = dict(CODES=codes, BITS=M._BITS, TERMS=terms, BLOCK_S=defaults.MASK_BLOCK_S, BLOCK_T=defaults.MASK_BLOCK_T)
    signature = {n: "constexpr" if n in consts else "*i64" if n in ("r_ptr", "c_ptr") else "*i1" if n == "out_ptr"
                 else "i32" for n in kernel.arg_names}
    built = triton.compile(ASTSource(kernel, signature, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4})
    print(json.dumps({"codes": codes, "cubin": len(built.asm["cubin"])}), flush=True)
"""


def test_kernel_builds_for_sm90(tmp_path):
    """Triton's compiler runs on the CPU: every code reaches a Hopper binary (the interpreter alone
    accepts forms the compiler rejects)."""
    from tests.lowering.attention.test_absorbed_sm90_build import build_rows

    rows = build_rows(_SM90_BUILD, tmp_path)
    assert len(rows) == 3 and all(r["cubin"] > 0 for r in rows)
