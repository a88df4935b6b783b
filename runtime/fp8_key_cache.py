"""An FP8 indexer key cache: E4M3 rows and one fp32 scale per key, grown by appending (SPEC A.10).

Keys are quantised one row at a time (``runtime.fp8_quant.quantize_keys``), so the cache after
appending keys in any number of steps holds exactly the quantisation of all of them at once. The
indexer op reads it through its ``k_scale`` argument,

    torch.ops.pulsar_dosa.certified_topk(q, cache.keys, w, topk, mask, precision=cache.precision,
                                         k_scale=cache.scales)

and returns what it returns for the same keys unquantised with that ``precision``. A key costs
D + 4 bytes per batch row (bf16 keys: 2 D). Storage grows by doubling (from
``defaults.FP8_CACHE_MIN_KEYS``); ``keys`` and ``scales`` are views of the first ``length`` keys
(unit stride along D and along keys)."""
from __future__ import annotations

import torch

from runtime import defaults
from runtime.fp8_quant import checked_fp8, hadamard, quantize_keys, rotates

__all__ = ["Fp8KeyCache", "check_appended_keys", "dequantize_keys"]


def dequantize_keys(keys: torch.Tensor, scales: torch.Tensor, precision: str, dtype: torch.dtype) -> torch.Tensor:
    """The keys an FP8 cache stands for, [B, T, D] in ``dtype``: fl32(keys · scale) per row, rotated
    back by ``runtime.fp8_quant.hadamard`` (its own inverse) for a rotating ``precision``. Within
    E4M3's rounding of the keys that were quantised; what a model reads where the indexer op does
    not take the cache itself (uncompiled, or a call kept stock)."""
    checked_fp8(precision, "cached keys")
    x = keys.to(torch.float32) * scales.unsqueeze(-1)
    return (hadamard(x) if rotates(precision) else x).to(dtype)


def check_appended_keys(k: object, cached: torch.Tensor | None) -> None:
    """TypeError/ValueError naming ``k`` unless it is a float tensor [B, t, D] that can follow the
    ``cached`` keys [B, T, D] (the same B and D, on their device; None: no keys yet)."""
    if not isinstance(k, torch.Tensor) or k.dim() != 3 or not k.is_floating_point():
        raise TypeError(f"k: expected a float tensor [B,t,D], got {getattr(k, 'dtype', type(k))} "
                        f"{tuple(getattr(k, 'shape', ()))}")
    if cached is not None and (k.shape[0] != cached.shape[0] or k.shape[2] != cached.shape[2]
                               or k.device != cached.device):
        raise ValueError(f"k: expected [B={cached.shape[0]}, t, D={cached.shape[2]}] on "
                         f"{cached.device} (the cache's), got {tuple(k.shape)} on {k.device}")


class Fp8KeyCache:
    """E4M3 keys [B, length, D] and their scales [B, length] fp32, appended along the key axis."""

    def __init__(self, precision: str = "fp8") -> None:
        self.precision = checked_fp8(precision, "cached keys")
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._scales: torch.Tensor | None = None

    def append(self, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantise the new keys k [B, t, D] (float) and append them; returns (keys, scales)."""
        check_appended_keys(k, self._keys)
        k8, scale = quantize_keys(k, self.precision)
        B, t, D = k8.shape
        end = self.length + t
        if self._keys is None or end > self._keys.shape[1]:
            capacity = max(end, 2 * (0 if self._keys is None else self._keys.shape[1]), defaults.FP8_CACHE_MIN_KEYS)
            keys = torch.empty((B, capacity, D), dtype=k8.dtype, device=k8.device)
            scales = torch.empty((B, capacity), dtype=torch.float32, device=k8.device)
            if self.length:
                keys[:, :self.length] = self.keys
                scales[:, :self.length] = self.scales
            self._keys, self._scales = keys, scales
        self._keys[:, self.length:end] = k8
        self._scales[:, self.length:end] = scale
        self.length = end
        return self.keys, self.scales

    @property
    def keys(self) -> torch.Tensor:
        """The cached E4M3 keys [B, length, D] (a view)."""
        if self._keys is None:
            raise ValueError("keys: the cache is empty (append keys first)")
        return self._keys[:, :self.length]

    @property
    def scales(self) -> torch.Tensor:
        """The cached key scales [B, length] float32 (a view)."""
        if self._scales is None:
            raise ValueError("scales: the cache is empty (append keys first)")
        return self._scales[:, :self.length]
