"""A transformers ``DynamicCache`` whose DSA indexer keys are held in FP8, as DeepSeek-V3.2 keeps them.

    cache = fp8_indexer_cache(model.config)                  # precision "fp8" (rotated) by default
    cache = to_fp8_indexer_cache(filled_cache)               # or an existing cache, converted in place
    model = torch.compile(model, backend="pulsar_dosa", options={"indexer_precision": "fp8"})
    model(ids, past_key_values=cache, use_cache=True)      # prefill, then decode steps with the same cache

Every DSA layer (``indexed_layers``: a ``DynamicIndexedLayer`` in transformers' cache) gets an
``Fp8IndexedLayer``: its indexer keys are E4M3 rows [B, T, D] plus one fp32 scale per key (D + 4
bytes a key where bf16 keys take 2 D), appended by concatenation as transformers'
``DynamicIndexedLayer`` appends, quantised one row at a time by ``pulsar_dosa::fp8_quantize_keys``. ``update_indexer`` returns
``pulsar_dosa::fp8_cached_keys`` of the whole cache: compiled with the same ``indexer_precision``,
the indexer op reads the E4M3 keys and their scales directly (prefill and decode alike) and returns
exactly what it returns for the unquantised keys at that precision; anywhere else (uncompiled, a
call kept stock, another precision) the model reads the dequantised keys. The main attention's
cache is transformers' own. Cropping, beam reordering, batch repetition and offloading of the
indexer keys are not supported (they raise).
"""
from __future__ import annotations

import torch
from transformers import PreTrainedConfig
from transformers.cache_utils import Cache, DynamicCache, DynamicIndexedLayer

import compiler.ops  # noqa: F401  (registers the ops below)
from runtime.fp8_key_cache import check_appended_keys
from runtime.fp8_quant import checked_fp8

def indexed_layers(cache: DynamicCache) -> list[int]:
    """The layers of ``cache`` that keep indexer keys: the ``DynamicIndexedLayer`` transformers gives
    a DSA layer (its layer type is "deepseek_sparse_attention" in 5.17, "indexed_attention" later)."""
    return [i for i, layer in enumerate(cache.layers) if isinstance(layer, DynamicIndexedLayer)]


class Fp8IndexedLayer(DynamicIndexedLayer):
    """``DynamicIndexedLayer`` with its indexer keys in E4M3 and one scale per key (module docstring)."""

    def __init__(self, precision: str = "fp8", **kwargs):
        super().__init__(**kwargs)
        self.precision = checked_fp8(precision, "cached indexer keys")
        self.indexer_key_scales: torch.Tensor | None = None

    def lazy_initialization_indexer(self, indexer_key_states: torch.Tensor) -> None:
        B, _, D = indexer_key_states.shape
        self.indexer_dtype, self.indexer_device = indexer_key_states.dtype, indexer_key_states.device
        self.indexer_keys = indexer_key_states.new_empty((B, 0, D), dtype=torch.float8_e4m3fn)
        self.indexer_key_scales = indexer_key_states.new_empty((B, 0), dtype=torch.float32)
        self.is_indexer_initialized = True

    def update_indexer(self, indexer_key_states: torch.Tensor) -> torch.Tensor:
        """Quantise and append the new keys [B, t, D]; returns the whole cache as
        ``pulsar_dosa::fp8_cached_keys`` (the keys it stands for, in the keys' dtype). Keys of
        another B or D, or on another device, than the cached ones raise an error naming ``k``."""
        check_appended_keys(indexer_key_states, self.indexer_keys if self.is_indexer_initialized else None)
        if not self.is_indexer_initialized:
            self.lazy_initialization_indexer(indexer_key_states)
        keys, scales = torch.ops.pulsar_dosa.fp8_quantize_keys(indexer_key_states, self.precision)
        self.indexer_keys = torch.cat([self.indexer_keys, keys], dim=1)
        self.indexer_key_scales = torch.cat([self.indexer_key_scales, scales], dim=1)
        return torch.ops.pulsar_dosa.fp8_cached_keys(self.indexer_keys, self.indexer_key_scales, self.precision,
                                                     self.indexer_dtype)

    def reset(self) -> None:
        super().reset()
        self.indexer_key_scales = None

    def _unsupported(self, what: str):
        raise NotImplementedError(f"{what}: not supported by an FP8 indexer cache (compiler.fp8_indexer_cache)")

    def crop(self, tokens_to_remove: int) -> None:
        self._unsupported("crop")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._unsupported("reorder_cache (beam search)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._unsupported("batch_repeat_interleave")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._unsupported("batch_select_indices")

    def offload(self):
        self._unsupported("offload")


def fp8_indexer_cache(config, precision: str = "fp8") -> DynamicCache:
    """A ``DynamicCache`` for ``config`` (a DSA model's) whose indexed layers keep FP8 indexer keys
    of ``precision`` ("fp8": Hadamard-rotated, or "fp8_unrotated"). ValueError when the config has
    no indexed layer or ``precision`` is not an fp8 one, TypeError when it is not a configuration."""
    checked_fp8(precision, "cached indexer keys")
    if not isinstance(config, PreTrainedConfig):
        raise TypeError(f"config: expected a transformers configuration (a DSA model's), got {type(config).__name__}")
    cache = DynamicCache(config=config)
    indexed = indexed_layers(cache)
    if not indexed:
        types = getattr(config.get_text_config(decoder=True), "layer_types", None)
        raise ValueError(f"config: expected a DSA model's config (layers with indexer keys), got layer types {types}")
    for i in indexed:
        cache.layers[i] = Fp8IndexedLayer(precision)
    return cache


def to_fp8_indexer_cache(cache: DynamicCache, precision: str = "fp8") -> DynamicCache:
    """``cache`` with each of its ``DynamicIndexedLayer`` replaced, in place, by an ``Fp8IndexedLayer``
    holding the same main keys and values and its indexer keys quantised (``fp8_quantize_keys``:
    the bits those keys would have had if appended to an FP8 cache); returns ``cache``. TypeError
    when ``cache`` is not a transformers cache, ValueError when ``precision`` is not an fp8 one."""
    checked_fp8(precision, "cached indexer keys")
    if not isinstance(cache, Cache):
        raise TypeError(f"cache: expected a transformers cache (e.g. a DynamicCache), got {type(cache).__name__}")
    for i, layer in enumerate(cache.layers):
        if not isinstance(layer, DynamicIndexedLayer) or isinstance(layer, Fp8IndexedLayer):
            continue
        fp8 = Fp8IndexedLayer(precision)
        fp8.__dict__.update({name: v for name, v in vars(layer).items() if name != "indexer_keys"})
        if layer.is_indexer_initialized:
            fp8.indexer_keys, fp8.indexer_key_scales = torch.ops.pulsar_dosa.fp8_quantize_keys(layer.indexer_keys,
                                                                                                precision)
        cache.layers[i] = fp8
    return cache
