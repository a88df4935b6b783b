"""``torch.ops.pulsar_dosa.conjunctive_mask(Tensor[] rows, Tensor[] cols, int[] terms) -> Tensor``:
the bool mask of ``runtime.conjunctive_mask`` (an AND of row-vs-column comparisons), bitwise.

The CPU runs the definition; CUDA one Triton launch that writes the mask once
(``compiler/lowering/conjunctive_mask.py``). Arguments are checked first (``mask_shape``: a clear
error naming the argument); the fake kernel reads no data and keeps symbolic sizes."""
from __future__ import annotations

import torch

from runtime.conjunctive_mask import conjunctive_mask as reference_mask
from runtime.conjunctive_mask import mask_shape

SCHEMA = "(Tensor[] rows, Tensor[] cols, int[] terms) -> Tensor"

conjunctive_mask = torch.library.custom_op("pulsar_dosa::conjunctive_mask", reference_mask, mutates_args=(),
                                           schema=SCHEMA)


@conjunctive_mask.register_kernel("cuda")
def _conjunctive_mask_cuda(rows, cols, terms):
    from compiler.lowering.conjunctive_mask import conjunctive_mask_triton

    return conjunctive_mask_triton(rows, cols, terms)


@conjunctive_mask.register_fake
def _conjunctive_mask_fake(rows, cols, terms):
    shape = mask_shape(rows, cols, terms)
    return (rows or cols)[0].new_empty(shape, dtype=torch.bool)
