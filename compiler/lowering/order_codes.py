"""THE ORDER's int64 codes on the GPU: the one Triton home of their encoding (SPEC C.1), whose
reference is ``runtime.order_codes``.

The code of a key with fp32 score s in a row of T keys is ``c32 · 2**32 + (T - 1 - key)``: c32 an
int32 monotone in s (-0.0 folded into +0.0, every NaN the largest, a hidden key ``INT32_MIN``),
then the key, lower keys larger. ``order_code`` encodes, ``decode_code`` (one element) and
``decode_codes`` (a tensor, one launch) decode. A dense row may be kept as its codes' int32 high
words alone (``word_of_code``): the code at position t of a row of N is ``code_of_word(word, t,
N)`` on the device, ``codes_of_words`` on the host. ``INT64_MIN`` (``runtime.order_codes.PADDING``)
pads rows of codes: no code is below it; xor with it maps the signed order of int64 onto the
unsigned one (radix selection). Kernels read these constants as ``tl.constexpr``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from runtime.order_codes import PADDING
from compiler.lowering.host_ints import cdiv

INT64_MIN = tl.constexpr(PADDING)
"""The smallest int64: the padding of rows of codes, below every code."""
INT32_MIN = tl.constexpr(-(1 << 31))
"""The smallest int32: a hidden key's high word, the lowest; xor with it maps the signed order of
int32 onto the unsigned one."""


@triton.jit
def code_of_word(word, position, N):
    """The int64 code with high word ``word`` (int32) at ``position`` of a row of N."""
    return word.to(tl.int64) * 4294967296 + (N - 1 - position).to(tl.int64)


@triton.jit
def word_of_code(code):
    """The int32 high word of int64 codes (an arithmetic shift: floor(code / 2**32))."""
    return (code >> 32).to(tl.int32)


@triton.jit
def order_code(score, visible, key, T):
    """int64 order code of fp32 ``score`` for ``key`` of T, ``visible`` or hidden."""
    s = score + 0.0
    bits = s.to(tl.int32, bitcast=True)
    c32 = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    c32 = tl.where(s != s, 0x7FFFFFFF, c32)
    c32 = tl.where(visible, c32, INT32_MIN)
    return code_of_word(c32, key, T)


@triton.jit
def decode_code(c, T):
    """(fp32 value, int64 key) of int64 order codes ``c`` (the inverse of ``order_code``; a hidden
    key's value is -inf)."""
    c32 = word_of_code(c)
    key = (T - 1) - (c - (c32.to(tl.int64) << 32))
    bits = tl.where(c32 >= 0, c32, c32 ^ 0x7FFFFFFF)
    value = tl.where(c32 == INT32_MIN, float("-inf"), bits.to(tl.float32, bitcast=True))
    return value, key


@triton.jit
def _decode_codes_kernel(codes_ptr, values_ptr, idx_ptr, n, T, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = off < n
    value, key = decode_code(tl.load(codes_ptr + off, mask=ok, other=0), T)
    tl.store(values_ptr + off, value, mask=ok)
    tl.store(idx_ptr + off, key, mask=ok)


def decode_codes(codes: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values fp32, indices int64) of int64 order codes, same shape; hidden keys decode to -inf.

    The inverse of ``order_code`` (one kernel launch): the high word gives the fp32 value (-0.0
    comes back as +0.0, as it was folded), the low word the key ``T - 1 - low``."""
    c = codes.contiguous()
    values = torch.empty(c.shape, dtype=torch.float32, device=c.device)
    idx = torch.empty(c.shape, dtype=torch.int64, device=c.device)
    if c.numel():
        block = 1024
        _decode_codes_kernel[(cdiv(c.numel(), block),)](c, values, idx, c.numel(), T, BLOCK=block)
    return values, idx


def codes_of_words(words: torch.Tensor) -> torch.Tensor:
    """int64 codes of int32 words ``[..., N]``: ``(word << 32) + N - 1 - position``."""
    N = words.shape[-1]
    return (words.to(torch.int64) << 32) + torch.arange(N - 1, -1, -1, device=words.device)
