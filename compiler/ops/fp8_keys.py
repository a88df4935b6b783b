"""``torch.ops.pulsar_dosa.fp8_quantize_keys`` and ``fp8_cached_keys``: a model's FP8 indexer key
cache in a graph (``compiler.fp8_indexer_cache``).

``fp8_quantize_keys(Tensor k, str precision) -> (Tensor, Tensor)``: keys k [B, T, D] (float) ->
(E4M3 keys [B, T, D], scales [B, T] fp32), ``runtime.fp8_quant.quantize_keys`` by the quantiser
the indexer op uses on k's device (the plain-torch definition, on CUDA the one-pass Triton
quantiser: the same bits), so that a cache holds exactly what the op would quantise.

``fp8_cached_keys(Tensor keys, Tensor scales, str precision, ScalarType dtype) -> Tensor``: the
keys such a cache stands for, [B, T, D] in ``dtype`` (``runtime.fp8_key_cache.dequantize_keys``).
It marks the cache in the graph: the indexer pass hands ``keys`` and ``scales`` to the indexer op
(``k_scale``) when the model is compiled with the same ``indexer_precision``, and the dequantised
keys are then never computed.

Both check their arguments first and name the one that is wrong; the fake kernels keep symbolic sizes.
"""
from __future__ import annotations

import torch

from runtime.fp8_key_cache import dequantize_keys
from runtime.fp8_quant import check_head_dim, checked_fp8, quantize, quantize_keys


def _check_keys(k: torch.Tensor, precision: str) -> None:
    checked_fp8(precision, "cached keys")
    if k.dim() != 3 or not k.is_floating_point():
        raise ValueError(f"k: expected float keys [B, T, D], got {k.dtype} {tuple(k.shape)}")
    check_head_dim("k", k.shape[2], precision)


@torch.library.custom_op("pulsar_dosa::fp8_quantize_keys", mutates_args=(),
                         schema="(Tensor k, str precision) -> (Tensor, Tensor)")
def fp8_quantize_keys(k: torch.Tensor, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 keys, scales) of k (module docstring)."""
    _check_keys(k, precision)
    if k.is_cuda:
        from compiler.lowering.scoring.fp8_quant import quantize_rows

        return quantize_keys(k, precision, quantize_rows)
    return quantize_keys(k, precision, quantize)


@fp8_quantize_keys.register_fake
def _fp8_quantize_keys_fake(k: torch.Tensor, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    _check_keys(k, precision)
    return k.new_empty(k.shape, dtype=torch.float8_e4m3fn), k.new_empty(k.shape[:2], dtype=torch.float32)


def _check_cache(keys: torch.Tensor, scales: torch.Tensor, precision: str, dtype: torch.dtype) -> None:
    checked_fp8(precision, "cached keys")
    if keys.dtype != torch.float8_e4m3fn or keys.dim() != 3:
        raise ValueError(f"keys: expected float8_e4m3fn [B, T, D], got {keys.dtype} {tuple(keys.shape)}")
    if scales.dtype != torch.float32 or tuple(scales.shape) != tuple(keys.shape[:2]):
        raise ValueError(f"scales: expected float32 {list(keys.shape[:2])} (one per key), got {scales.dtype} "
                         f"{list(scales.shape)}")
    if scales.device != keys.device:
        raise ValueError(f"scales: expected keys' device {keys.device}, got {scales.device}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype: expected a floating dtype, got {dtype}")


@torch.library.custom_op("pulsar_dosa::fp8_cached_keys", mutates_args=(),
                         schema="(Tensor keys, Tensor scales, str precision, ScalarType dtype) -> Tensor")
def fp8_cached_keys(keys: torch.Tensor, scales: torch.Tensor, precision: str, dtype: torch.dtype) -> torch.Tensor:
    """The dequantised keys of an FP8 cache (module docstring)."""
    _check_cache(keys, scales, precision, dtype)
    return dequantize_keys(keys, scales, precision, dtype)


@fp8_cached_keys.register_fake
def _fp8_cached_keys_fake(keys, scales, precision, dtype):
    _check_cache(keys, scales, precision, dtype)
    return keys.new_empty(keys.shape, dtype=dtype)
