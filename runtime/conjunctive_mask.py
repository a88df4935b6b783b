"""A boolean mask that is a conjunction of comparisons between a row vector and a column vector.

``conjunctive_mask(rows, cols, terms)``: rows[i] broadcasts to ``[..., S, 1]``, cols[j] to ``[...,
1, T]`` (integer or bool tensors, one device); ``terms`` is a flat list of triples (code, i, j)
over :data:`CODES`: a comparison ``rows[i] <op> cols[j]``, or the truth of a bool ``rows[i]``
("row", j = -1) or ``cols[j]`` ("col", i = -1). The result is the AND of every term, a bool tensor
of the broadcast shape of all rows and cols, bitwise what the same torch comparisons and ``&``
compute (this definition applies them). Causal, padding, packed-sequence and sliding-window masks
of transformers are of this form: their factors are [S] and [T] vectors, the mask is [S, T]."""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

CODES = ("le", "lt", "ge", "gt", "eq", "ne", "row", "col")
"""A term's code is its index here: the six comparisons rows[i] <op> cols[j], then a bool row or column."""
COMPARE = {"le": torch.le, "lt": torch.lt, "ge": torch.ge, "gt": torch.gt, "eq": torch.eq, "ne": torch.ne}
MAX_TERMS = 21
"""Most terms of one mask (the CUDA kernel packs their codes into one int64)."""
MIRRORED = {"le": "ge", "lt": "gt", "ge": "le", "gt": "lt", "eq": "eq", "ne": "ne"}
"""The comparison with its operands swapped: ``a <op> b`` is ``b <MIRRORED[op]> a``."""


def _name(i: int) -> str:
    return CODES[i] if 0 <= i < len(CODES) else f"code {i}"


def _broadcast(shapes: list[torch.Size]) -> torch.Size:
    """The broadcast of ``shapes`` (symbolic sizes kept, no guard added); ValueError if they clash."""
    out = []
    for d in range(1, max(len(s) for s in shapes) + 1):
        sizes = [s[-d] for s in shapes if len(s) >= d and not statically_known_true(s[-d] == 1)]
        if any(statically_known_true(x != sizes[0]) for x in sizes):
            raise ValueError(f"rows, cols: shapes {[tuple(s) for s in shapes]} do not broadcast (dim {-d})")
        out.append(sizes[0] if sizes else 1)
    return torch.Size(out[::-1])


def mask_shape(rows: Sequence[torch.Tensor], cols: Sequence[torch.Tensor], terms: Sequence[int]) -> torch.Size:
    """The result's shape, after checking every argument (ValueError / TypeError naming it); reads no data."""
    for name, xs, unit in (("rows", rows, -1), ("cols", cols, -2)):
        if not isinstance(xs, (list, tuple)) or not all(isinstance(x, torch.Tensor) for x in xs):
            raise TypeError(f"{name}: expected a list of tensors, got {type(xs).__name__}")
        for n, x in enumerate(xs):
            if x.is_floating_point() or x.is_complex():
                raise TypeError(f"{name}[{n}]: expected an integer or bool tensor, got {x.dtype}")
            if x.dim() >= -unit and not statically_known_true(x.shape[unit] == 1):
                raise ValueError(f"{name}[{n}]: expected size 1 in dim {unit} ({'a row' if unit == -1 else 'a column'}"
                                 f" vector broadcast over the other axis), got shape {tuple(x.shape)}")
    devices = {x.device for x in (*rows, *cols)}
    if len(devices) > 1:
        raise ValueError(f"rows, cols: expected one device, got {sorted(map(str, devices))}")
    if len(terms) == 0 or len(terms) % 3 or len(terms) > 3 * MAX_TERMS:
        raise ValueError(f"terms: expected 1 to {MAX_TERMS} (code, row, col) triples, got {len(terms)} integers")
    for t in range(0, len(terms), 3):
        code, i, j = terms[t:t + 3]
        name = _name(code)
        if name.startswith("code"):
            raise ValueError(f"terms[{t}]: expected a code in 0..{len(CODES) - 1} ({', '.join(CODES)}), got {code}")
        want_row, want_col = name != "col", name != "row"
        if (0 <= i < len(rows)) != want_row or (not want_row and i != -1):
            raise ValueError(f"terms[{t + 1}]: a {name!r} term expected {'a row index' if want_row else '-1'}, got {i}")
        if (0 <= j < len(cols)) != want_col or (not want_col and j != -1):
            raise ValueError(f"terms[{t + 2}]: a {name!r} term expected {'a column index' if want_col else '-1'}, "
                             f"got {j}")
        if name in ("row", "col"):
            which, x = (f"rows[{i}]", rows[i]) if name == "row" else (f"cols[{j}]", cols[j])
            if x.dtype != torch.bool:
                raise TypeError(f"{which}: a {name!r} term takes a bool tensor, got {x.dtype}")
    shape = _broadcast([x.shape for x in (*rows, *cols)])
    if len(shape) < 2:
        raise ValueError(f"rows, cols: expected a broadcast shape [..., S, T] of rank >= 2, got {tuple(shape)}")
    return shape


def conjunctive_mask(rows: Sequence[torch.Tensor], cols: Sequence[torch.Tensor], terms: Sequence[int]) -> torch.Tensor:
    """The mask of the module docstring, by the torch ops it stands for."""
    shape = mask_shape(rows, cols, terms)
    out = torch.ones(shape, dtype=torch.bool, device=(rows or cols)[0].device)
    for t in range(0, len(terms), 3):
        code, i, j = terms[t:t + 3]
        name = CODES[code]
        if name == "row":
            out &= rows[i]
        elif name == "col":
            out &= cols[j]
        else:
            out &= COMPARE[name](rows[i], cols[j])
    return out


def leading_size(shape: Sequence[int]) -> int:
    """The number of [S, T] planes of a mask of ``shape``."""
    return math.prod(shape[:-2])
