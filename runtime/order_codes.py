"""THE ORDER as unique int64 codes, in plain torch (any device).

The code of a key with float32 score s is ``c32 * 2**32 + (limit - 1 - key)``: c32 an int32 that
is monotone in s (-0.0 folded into +0.0, every NaN the largest code, a hidden key the smallest),
then the key index, lower keys larger. A descending sort of codes is THE ORDER of
``runtime.dense_scorer`` (values descending, NaN first, visible before hidden, lower key first),
and codes of distinct keys are distinct. The reference of the kernels' encoding
(``compiler/lowering/order_codes.py``, there with limit = the row's key count).

``PADDING`` (the smallest int64) decodes as hidden key ``limit - 1``; callers that pad with it
keep their keys below ``limit - 1``. Decoding loses the payload of a NaN (every NaN decodes to
the NaN with bits 0x7FFFFFFF), as THE ORDER does not tell NaNs apart.
"""
from __future__ import annotations

import torch

__all__ = ["PADDING", "decode_order_codes", "encode_order_codes"]

PADDING = torch.iinfo(torch.int64).min
_WORD = 1 << 32
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def encode_order_codes(values: torch.Tensor, visible: torch.Tensor, keys: torch.Tensor,
                       limit: int) -> torch.Tensor:
    """int64 codes of (values float32, visible bool, keys int64 in [0, limit)), broadcast; limit <= 2**32."""
    s = values.to(torch.float32) + 0.0
    bits = s.view(torch.int32)
    c32 = torch.where(bits >= 0, bits, bits ^ _INT32_MAX)
    c32 = torch.where(s != s, _INT32_MAX, c32)
    c32 = torch.where(visible, c32, _INT32_MIN)
    return c32.to(torch.int64) * _WORD + (limit - 1 - keys)


def decode_order_codes(codes: torch.Tensor, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float32, keys int64) of int64 codes; hidden keys decode to -inf."""
    c32 = codes >> 32  # arithmetic shift: floor(codes / 2**32)
    keys = (limit - 1) - (codes - c32 * _WORD)
    bits = torch.where(c32 >= 0, c32, c32 ^ _INT32_MAX).to(torch.int32).view(torch.float32)
    return torch.where(c32 == _INT32_MIN, float("-inf"), bits), keys
