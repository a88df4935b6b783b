"""A transformers ``DynamicCache`` whose MLA layers keep each token's latent, as DeepSeek's inference does.

    cache = latent_cache(model)                              # or latent_cache(model, indexer_precision="fp8")
    compiled = torch.compile(model, backend="pulsar_dosa")
    compiled(ids, past_key_values=cache, use_cache=True)     # prefill, chunks, decode steps: the same cache
    model.generate(ids, past_key_values=latent_cache(model), ...)

Every MLA attention layer of the model (one with ``kv_b_proj``: DeepSeek-V3.2, GLM-5) gets a
``LatentLayer``: per token it keeps the normalised latent (``kv_lora_rank`` values, the input of
``kv_b_proj``) and the rope key (``qk_rope_head_dim``), shared by all heads, as ``[B, 1, T, Dc]``
and ``[B, 1, T, Dr]`` appended by concatenation, and the indexer keys as transformers'
``DynamicIndexedLayer`` keeps them (E4M3 with ``indexer_precision``, ``compiler.fp8_indexer_cache``).
Memory per token and layer: ``bytes_per_token(config, dtype)`` = (Dc + Dr + D_index) values, where
a cache of expanded rows keeps H·(Dn + Dr + Dv) + D_index (``bytes_per_token(..., expanded=True)``;
DeepSeek-V3.2 in bf16: 1408 against 82176 bytes).

transformers' DSA attention has two conventions, and the layer serves both (told apart by whether
``kv_b_proj`` has run in the current call when ``update`` is called):

- 5.17 expands the latent of the new tokens and hands the expanded keys and values to ``update``.
  The layer takes the latent from ``kv_b_proj``'s input (a forward pre-hook, which ``latent_cache``
  installs once per attention module; a forward hook on the attention drops it when the call
  ends), the rope key from the key's rope columns (the same values, copied per head), appends both
  and returns ``pulsar_dosa::latent_cached_kv`` of the whole cache: compiled with the backend, the
  sparse-attention pass hands the cached latent and rope key to the absorbed op and the expanded
  keys and values of the cached tokens are never computed; anywhere else (uncompiled, a call kept
  stock) the model reads them expanded, as ``kv_b_proj`` expands them.
- Later releases (5.25) hand ``update`` the latent and the rope key and expand what it returns:
  the layer is transformers' own, and the pass reads the latent the expansion reads.

Either way a compiled model's attention reads what it would read over transformers' cache, so
the logits equal those of a run over transformers' cache to rounding. Cropping, beam reordering
and batch repetition act on the latent rows as on any cache rows (token axis -2, batch axis 0);
with FP8 indexer keys they raise, as ``compiler.fp8_indexer_cache``'s layers do.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from transformers.cache_utils import DynamicCache, DynamicIndexedLayer

import compiler.ops  # noqa: F401  (registers pulsar_dosa::latent_cached_kv)
from compiler.fp8_indexer_cache import Fp8IndexedLayer

SLOT_ATTRIBUTE = "_pulsar_dosa_latent"
"""The attribute of an MLA attention module that holds its ``PendingLatent`` (set by ``latent_cache``)."""


class PendingLatent:
    """The latent ``kv_b_proj`` of one attention module receives during the current call (5.17's
    convention, module docstring): set by a forward pre-hook on ``kv_b_proj``, read by the cache
    layer's ``update``, dropped by a forward hook on the attention when the call ends."""

    def __init__(self):
        self.latent: Optional[torch.Tensor] = None
        self.weight: Optional[torch.Tensor] = None

    def record(self, module: torch.nn.Module, args: tuple) -> None:
        self.latent, self.weight = args[0], module.weight

    def drop(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        self.latent, self.weight = None, None


def pending_latent(attention: torch.nn.Module) -> PendingLatent:
    """The attention module's ``PendingLatent``, its hooks installed on the first call."""
    slot = getattr(attention, SLOT_ATTRIBUTE, None)
    if slot is None:
        slot = PendingLatent()
        attention.kv_b_proj.register_forward_pre_hook(slot.record)
        attention.register_forward_hook(slot.drop)
        setattr(attention, SLOT_ATTRIBUTE, slot)
    return slot


class LatentLayer(DynamicIndexedLayer):
    """A ``DynamicIndexedLayer`` whose keys and values are an MLA layer's latent ``[B, 1, T, Dc]`` and
    rope key ``[B, 1, T, Dr]`` (module docstring); ``slot``: its attention's ``PendingLatent``."""

    def __init__(self, slot: PendingLatent, **kwargs):
        super().__init__(**kwargs)
        self.slot = slot

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append the new tokens' latent and rope key; return what the attention reads next (module
        docstring): the latent rows themselves when handed the latent (no latent pending: the
        attention calls ``update`` before ``kv_b_proj``), else ``pulsar_dosa::latent_cached_kv`` of
        them, handed the expanded keys ``[B, H, t, Dn+Dr]`` and values ``[B, H, t, Dv]``."""
        latent, weight = self.slot.latent, self.slot.weight
        if latent is None:
            return super().update(key_states, value_states, *args, **kwargs)
        heads, value_dim = key_states.shape[1], value_states.shape[-1]
        nope_dim = weight.shape[0] // heads - value_dim
        if value_states.shape[1] != heads or not 0 < nope_dim < key_states.shape[-1] \
                or tuple(latent.shape[:3]) != (key_states.shape[0], 1, key_states.shape[2]):
            raise ValueError(f"key_states {tuple(key_states.shape)}, value_states {tuple(value_states.shape)}: "
                             f"expected the expansion of the latent {tuple(latent.shape)} by kv_b_proj "
                             f"{tuple(weight.shape)}, [B, H, t, Dn+Dr] and [B, H, t, Dv]")
        keys, values = super().update(latent, key_states[:, :1, :, nope_dim:], *args, **kwargs)
        return torch.ops.pulsar_dosa.latent_cached_kv(keys[:, 0], values[:, 0], weight, heads, nope_dim)


class LatentFp8Layer(LatentLayer, Fp8IndexedLayer):
    """A ``LatentLayer`` whose indexer keys are kept in FP8 (``compiler.fp8_indexer_cache``)."""


def mla_dims(config) -> dict[str, int]:
    """``heads``, ``nope_dim``, ``latent_dim``, ``rope_dim``, ``value_dim`` of an MLA config."""
    text = config.get_text_config(decoder=True)
    return dict(heads=text.num_attention_heads, nope_dim=text.qk_nope_head_dim, latent_dim=text.kv_lora_rank,
                rope_dim=text.qk_rope_head_dim, value_dim=text.v_head_dim)


def bytes_per_token(config, dtype: torch.dtype = torch.bfloat16, *, expanded: bool = False,
                    indexer_precision: Optional[str] = None) -> int:
    """Bytes one token takes in one MLA layer's cache in ``dtype``: the latent, the rope key and the
    indexer key (Dc + Dr + D_index values; with ``indexer_precision`` "fp8" or "fp8_unrotated" the
    indexer key takes D_index + 4 bytes), or with ``expanded`` the keys and values a cache of
    expanded rows keeps instead of the latent and the rope key (H·(Dn + Dr + Dv) values)."""
    dims = mla_dims(config)
    size = torch.empty((), dtype=dtype).element_size()
    main = dims["heads"] * (dims["nope_dim"] + dims["rope_dim"] + dims["value_dim"]) if expanded \
        else dims["latent_dim"] + dims["rope_dim"]
    index_dim = getattr(config.get_text_config(decoder=True), "index_head_dim", 0) or 0
    return main * size + (index_dim + 4 if indexer_precision else index_dim * size)


def mla_attentions(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """``{layer index: attention module}`` of the model's MLA attentions (those with ``kv_b_proj``)."""
    return {module.layer_idx: module for module in model.modules()
            if hasattr(module, "kv_b_proj") and isinstance(getattr(module, "layer_idx", None), int)}


def latent_cache(model: torch.nn.Module, indexer_precision: Optional[str] = None) -> DynamicCache:
    """A ``DynamicCache`` for ``model`` (a transformers DSA model, compiled or not) whose MLA layers
    keep latent rows (module docstring), their indexer keys in FP8 of ``indexer_precision`` ("fp8",
    "fp8_unrotated") or as transformers keeps them (None). ValueError when the model has no MLA
    attention."""
    model = getattr(model, "_orig_mod", model)
    attentions = mla_attentions(model)
    cache = DynamicCache(config=model.config)
    if not attentions or any(i >= len(cache.layers) for i in attentions):
        raise ValueError(f"model: expected a transformers model with MLA attention layers (kv_b_proj), got "
                         f"{type(model).__name__}")
    for i, attention in attentions.items():
        slot = pending_latent(attention)
        cache.layers[i] = LatentLayer(slot) if indexer_precision is None else \
            LatentFp8Layer(slot, precision=indexer_precision)
    return cache
