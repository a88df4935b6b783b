"""E4M3 quantisation of the indexer's q, k and weights, as DeepSeek-V3.2 scores its indexer (SPEC A.10).

``PRECISIONS``: what the indexer top-K scores, ``"bf16"`` THE SCORER on the inputs as given,
``"fp8"`` the FP8 scorer on E4M3 inputs made from a Hadamard rotation of q and k (DeepSeek-V3.2's
reference), ``"fp8_unrotated"`` the same without the rotation. A row x [D] (a key, or one head of
a query) is quantised in float32: ``x <- hadamard(x)`` (rotated precisions), ``scale =
fl32(max(max_d |x_d|, AMAX_FLOOR) / E4M3_MAX)``, ``x8 = e4m3(clamp(fl32(x_d / scale), +-E4M3_MAX))``
(nearest even). Keys keep their scale (``k_scale`` [B,T] fp32, applied by the scorer after the
head sum); a query head's scale is folded into its weight, ``w'_h = fl32(w_h * scale_h)``. Every
step is elementwise or an exact maximum: the same bits on every device, and a key's quantisation
does not depend on the other keys (a cache grown by appending equals quantising the whole). A
non-finite row gives a non-finite scale or NaN values (its queries are then scored densely)."""
from __future__ import annotations

import math
from typing import Callable

import torch

from runtime.workspace import check_workspace

__all__ = ["PRECISIONS", "E4M3_MAX", "AMAX_FLOOR", "check_head_dim", "check_precision", "checked_fp8", "rotates", "hadamard_scale", "hadamard",
           "quantize_rows", "quantize", "quantize_keys", "quantize_queries", "quantize_indexer_inputs"]

PRECISIONS = ("bf16", "fp8", "fp8_unrotated")
"""What the indexer top-K scores (module docstring); "bf16" is the default everywhere."""
E4M3_MAX = 448.0
"""The largest finite float8_e4m3fn value."""
AMAX_FLOOR = 2.0**-64
"""Smallest row maximum a scale is made from: an all-zero or tiny row still gets a normal, positive
scale (its values quantise to 0 or to small E4M3 values)."""


def check_precision(name: str, value: object) -> str:
    """``value`` if it is one of PRECISIONS, else ValueError naming ``name``."""
    if not isinstance(value, str) or value not in PRECISIONS:
        raise ValueError(f"{name}: expected one of {list(PRECISIONS)}, got {type(value).__name__} {value!r}")
    return value


def rotates(precision: str) -> bool:
    """True for the precisions that rotate q and k by ``hadamard`` before quantising."""
    return precision == "fp8"


def hadamard_scale(D: int) -> float:
    """fl32(D^-1/2), the rotation's last factor, as a Python float."""
    return float(torch.tensor(1.0 / math.sqrt(D), dtype=torch.float32))


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """x H / sqrt(D) over the last dimension (D a power of two), float32: the fast Walsh-Hadamard
    butterflies (a + b, a - b) in log2(D) elementwise stages, then one multiply by fl32(D^-1/2).
    Each stage writes its sums and differences straight into the next buffer (two float32 buffers
    in turn), so a stage reads and writes the rows once."""
    D = x.shape[-1]
    if D < 1 or D & (D - 1):
        raise ValueError(f"hadamard: the last dimension must be a power of two, got {D}")
    y = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    lead = y.shape[:-1]
    spare = torch.empty_like(y) if D > 1 else y
    h = 1
    while h < D:
        pairs = y.view(*lead, D // (2 * h), 2, h)
        out = spare.view(*lead, D // (2 * h), 2, h)
        torch.add(pairs[..., 0, :], pairs[..., 1, :], out=out[..., 0, :])
        torch.sub(pairs[..., 0, :], pairs[..., 1, :], out=out[..., 1, :])
        y, spare = spare, y
        h *= 2
    return y.mul_(torch.tensor(hadamard_scale(D), dtype=torch.float32, device=y.device))


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8 [..., D] float8_e4m3fn, scale [...] float32) of float rows x [..., D] (module docstring)."""
    return _quantize_rows(x.to(torch.float32, memory_format=torch.contiguous_format, copy=True))


def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` of float32 rows x that may be overwritten (one pass for the maximum, one
    for the quotient and its clamp in place, one for the cast)."""
    if x.shape[-1]:
        low, high = torch.aminmax(x, dim=-1)
        amax = torch.maximum(high, -low)  # max |x_d| exactly, NaN kept
    else:
        amax = x.new_zeros(x.shape[:-1])
    # NaN and inf stay. The divisor is a tensor: CUDA torch divides by a Python number as a
    # multiply by its reciprocal, which is not the quotient rounded once.
    scale = torch.clamp(amax, min=AMAX_FLOOR) / torch.full_like(amax, E4M3_MAX)
    x8 = x.div_(scale[..., None]).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return x8, scale


def quantize(x: torch.Tensor, rotate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` of x, rotated by ``hadamard`` first when ``rotate`` (the rotation's own
    buffer is quantised in place). The definition; ``compiler.lowering.scoring.fp8_quant.quantize_rows``
    computes the same bits on the GPU in one pass."""
    return _quantize_rows(hadamard(x)) if rotate else quantize_rows(x)


Quantizer = Callable[[torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor]]
"""(x [..., D], rotate) -> (x8 [..., D] float8_e4m3fn, scale [...] fp32): ``quantize`` or a kernel
that gives its bits."""


def checked_fp8(precision: str, what: str) -> str:
    """``precision`` if it is an fp8 one, else ValueError naming it (``what``: what is quantised or kept)."""
    check_precision("precision", precision)
    if precision == "bf16":
        raise ValueError(f"precision: expected an fp8 precision to quantise {what}, got 'bf16'")
    return precision


def check_head_dim(name: str, D: int, precision: str) -> None:
    """ValueError naming ``name`` when ``precision`` rotates and the head dimension D is not a
    power of two (``hadamard``'s)."""
    if rotates(precision) and (D < 1 or D & (D - 1)):
        raise ValueError(f"{name}: precision {precision!r} rotates q and k by a Hadamard transform, which needs a "
                         f"head dimension D that is a power of two, got D={D}")


QUANTIZE_BYTES = (9, 16)
"""Bytes ``quantize`` allocates at most per element (a float32 copy, the rotation's second buffer,
the E4M3 values) and per row (its extremes, maximum and scale): above either quantizer's."""


def _checked_rows(name: str, x: torch.Tensor, precision: str, what: str) -> bool:
    """Whether rows of ``x`` are rotated at ``precision``, after ValueErrors naming ``name`` for a
    precision that is not an fp8 one, a head dimension the rotation cannot take, or rows whose
    quantisation cannot fit in the device's memory."""
    rotate = rotates(checked_fp8(precision, what))
    check_head_dim(name, x.shape[-1], precision)
    per_element, per_row = QUANTIZE_BYTES
    check_workspace(per_element * x.numel() + per_row * (x.numel() // max(1, x.shape[-1])), x.device, name,
                    f"shape {tuple(x.shape)}")
    return rotate


def quantize_keys(k: torch.Tensor, precision: str = "fp8",
                  quantizer: Quantizer = quantize) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys k [B,T,D] (float) -> (k8 [B,T,D] float8_e4m3fn, k_scale [B,T] float32); ValueError
    naming k or precision first (``check_head_dim``, the device's memory)."""
    return quantizer(k, _checked_rows("k", k, precision, "keys"))


def quantize_queries(q: torch.Tensor, weights: torch.Tensor, precision: str = "fp8",
                     quantizer: Quantizer = quantize) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries q [B,S,H,D] and weights [B,S,H] (float) -> (q8 [B,S,H,D] float8_e4m3fn, w' [B,S,H]
    float32): one scale per (query, head), folded into that head's weight, w' = fl32(w * scale).
    ValueError naming q or precision first, as ``quantize_keys``."""
    q8, scale = quantizer(q, _checked_rows("q", q, precision, "queries"))
    return q8, weights.to(torch.float32) * scale


def quantize_indexer_inputs(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, precision: str = "fp8",
                            quantizer: Quantizer = quantize
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q8, k8, w', k_scale): the FP8 scorer's inputs (``quantize_queries`` and ``quantize_keys``)
    for ``dense_topk`` / ``certified_topk`` with ``key_scale=k_scale``."""
    q8, w8 = quantize_queries(q, weights, precision, quantizer)
    k8, k_scale = quantize_keys(k, precision, quantizer)
    return q8, k8, w8, k_scale
