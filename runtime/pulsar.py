"""The Pulsar driver: phase 1 (packed context encoding), KV drop, phase 2 (query) and greedy decode.

``generate(model, context_ids, query_ids, config, *, max_new_tokens, stop_ids=())`` runs a
Hugging Face causal LM (batch 1) on one device:

1. Phase 1: ``runtime.assembly.assemble`` packs the phase-1 inputs (pulsar: the spine
   ``[sink ‖ Σ_0 … Σ_{n-2}]`` encoded once, then every block attending to its spine prefix and
   itself); one forward over the packed tokens with their position ids under a ``PackedPhase``.
2. KV drop: every layer's cache keeps the KV of the block tokens B_i only, in context order.
3. Phase 2 and decode: the query tokens (position ids from ``query_position_start``) and then
   each generated token attend to all kept KV and to the new tokens causally (``QueryPhase``).

How attention follows the layout: a model compiled with ``torch.compile(model,
backend="pulsar_dosa")`` has its attention rewritten into the ``pulsar_dosa::attention`` op,
which reads the active layout. An uncompiled transformers model has its attention implementation
switched to the transformers attention function registered here as ``"pulsar_dosa"`` for the
duration of the call (no attention mask is built: the layout decides visibility), then restored.
Either way every forward is checked to have routed each attention layer through the layout.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence

import torch
from torch._dynamo.eval_frame import OptimizedModule
from transformers import AttentionInterface, DynamicCache

from runtime.assembly import MODES, POSITIONS, PackedLayout, assemble
from runtime.attention_layout import Layout, MergeFn, PackedPhase, QueryPhase, active_layout, use_layout
from runtime.summaries import DEFAULT_HEURISTIC, HEURISTICS, check_positive_int

ATTENTION_IMPLEMENTATION = "pulsar_dosa"
KeptKV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer ``(keys, values)`` of the kept tokens, each [1, Hkv, kept, D], in context order."""


@dataclass(frozen=True)
class PulsarConfig:
    """Phase-1 assembly settings (``runtime.assembly.assemble``); pulsar mode uses the shared spine."""

    block_size: int
    mode: str = "pulsar"
    sink: int = 64
    chunk: int = 32
    ratio: float = 0.125
    heuristic: str = DEFAULT_HEURISTIC
    positions: str = "sparse"

    def __post_init__(self) -> None:
        check_positive_int("block_size", self.block_size)
        check_positive_int("chunk", self.chunk)
        if isinstance(self.sink, bool) or not isinstance(self.sink, int) or self.sink < 0:
            raise ValueError(f"sink must be an int >= 0, got {self.sink!r}")
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)) or not 0 < self.ratio <= 1:
            raise ValueError(f"ratio must be a float in (0, 1], got {self.ratio!r}")
        for name, allowed in (("mode", MODES), ("heuristic", HEURISTICS), ("positions", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

    def layout(self, context_ids: torch.Tensor) -> PackedLayout:
        """The packed phase-1 layout of ``context_ids`` under this configuration."""
        return assemble(context_ids, self.block_size, mode=self.mode, sink=self.sink, chunk=self.chunk,
                        ratio=self.ratio, heuristic=self.heuristic, positions=self.positions,
                        shared_spine=self.mode == "pulsar")


def layout_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: attention under the active layout, [B, S, Hq, D] out."""
    layout = active_layout()
    if layout is None:
        raise RuntimeError(f"attention implementation {ATTENTION_IMPLEMENTATION!r} runs only inside "
                           "runtime.pulsar.generate (no Pulsar layout is active)")
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    return layout.attend(query, key, value, scale=scale).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION_IMPLEMENTATION, layout_attention)


def model_device(model: torch.nn.Module) -> torch.device:
    """Device of the model's first parameter."""
    return next(model.parameters()).device


def is_compiled(model: torch.nn.Module) -> bool:
    """True for a ``torch.compile``d module (its attention ops read the layout themselves)."""
    return isinstance(model, OptimizedModule)


@contextlib.contextmanager
def routed_attention(model: torch.nn.Module) -> Iterator[None]:
    """Route an uncompiled model's attention to ``layout_attention`` for the block."""
    if is_compiled(model):
        yield
        return
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_IMPLEMENTATION
    try:
        yield
    finally:
        config._attn_implementation = previous


def cache_from(model: torch.nn.Module, kept: KeptKV) -> DynamicCache:
    """A fresh cache for ``model`` holding ``kept`` (per-layer keys and values)."""
    cache = DynamicCache(config=model.config)
    for layer, (keys, values) in enumerate(kept):
        cache.update(keys, values, layer)
    return cache


def run_forward(model: torch.nn.Module, layout: Layout, input_ids: torch.Tensor,
                position_ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """One forward of ``input_ids`` [1, S] under ``layout``; returns the last position's logits [V]."""
    inner = model._orig_mod if is_compiled(model) else model
    cache_arg = "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"
    with torch.no_grad(), routed_attention(model), use_layout(layout):
        out = model(input_ids=input_ids, position_ids=position_ids, use_cache=True, logits_to_keep=1,
                    **{cache_arg: cache})
    layers = len(cache.layers)
    if layout.calls != layers:
        raise RuntimeError(
            f"{layout.calls} of the model's {layers} attention layers followed the Pulsar layout: "
            "pass an uncompiled transformers model or one compiled with backend='pulsar_dosa'")
    return out.logits[0, -1]


def encode_context(model: torch.nn.Module, context_ids: torch.Tensor, layout: PackedLayout) -> KeptKV:
    """Phase 1 over the packed ``layout`` of ``context_ids``, then the KV drop.

    Returns the kept KV per layer: the tokens with ``layout.keep``, ordered by context position.
    """
    device = model_device(model)
    ids = context_ids.to(device)[layout.source_index.to(device)].unsqueeze(0)
    positions = layout.position_ids.to(device).unsqueeze(0)
    cache = DynamicCache(config=model.config)
    run_forward(model, PackedPhase(layout.prefix_end, layout.segment_start), ids, positions, cache)
    kept = torch.nonzero(layout.keep).flatten()
    kept = kept[torch.argsort(layout.source_index[kept])].to(device)
    result = []
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            raise ValueError("model has a sliding-window cache layer: Pulsar needs full-attention layers")
        result.append((layer.keys[:, :, kept], layer.values[:, :, kept]))
    return result


def decode(model: torch.nn.Module, kept: KeptKV, query_ids: torch.Tensor, *, query_position_start: int,
           max_new_tokens: int, stop_ids: Sequence[int] = (), owner: bool = True,
           merge: Optional[MergeFn] = None,
           agree: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
           make_phase: Optional[Callable[[], QueryPhase]] = None) -> torch.Tensor:
    """Phase 2 and greedy decode over the kept KV; returns the generated ids (1-D int64).

    ``owner``: this rank keeps the new tokens' KV (elsewhere they are dropped after each forward);
    ``merge``: combines per-rank partials (None on one device); ``agree``: makes every rank use
    the same next token (None on one device); ``make_phase``: builds the layout of each forward
    (default ``QueryPhase(kept tokens, owner, merge)``). Stops after a token in ``stop_ids``
    (included) or ``max_new_tokens`` tokens.
    """
    device = model_device(model)
    num_kept = kept[0][0].shape[2]
    stops = set(int(s) for s in stop_ids)
    cache = cache_from(model, kept)
    tokens = query_ids.to(device).unsqueeze(0)
    position = query_position_start
    generated: list[int] = []
    while len(generated) < max_new_tokens:
        positions = torch.arange(position, position + tokens.shape[1], device=device).unsqueeze(0)
        phase = QueryPhase(num_kept, owner, merge) if make_phase is None else make_phase()
        logits = run_forward(model, phase, tokens, positions, cache)
        next_token = logits.argmax().reshape(1)
        if agree is not None:
            next_token = agree(next_token)
        generated.append(int(next_token))
        position += tokens.shape[1]
        tokens = next_token.unsqueeze(0)
        if not owner:
            cache = cache_from(model, kept)
        if generated[-1] in stops:
            break
    return torch.tensor(generated, dtype=torch.int64)


def check_generate_args(context_ids, query_ids, config, max_new_tokens, stop_ids) -> None:
    """Raise TypeError/ValueError naming the bad argument of ``generate``."""
    for name, ids in (("context_ids", context_ids), ("query_ids", query_ids)):
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.numel() == 0:
            raise ValueError(f"{name} must be a non-empty 1-D tensor of token ids")
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise TypeError(f"{name} must have an integer dtype, got {ids.dtype}")
    if not isinstance(config, PulsarConfig):
        raise TypeError(f"config must be a PulsarConfig, got {type(config).__name__}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in stop_ids):
        raise TypeError(f"stop_ids must be ints, got {list(stop_ids)!r}")


def generate(model: torch.nn.Module, context_ids: torch.Tensor, query_ids: torch.Tensor,
             config: PulsarConfig, *, max_new_tokens: int, stop_ids: Sequence[int] = ()) -> torch.Tensor:
    """Pulsar (or star/dense) long-context generation on one device; returns generated ids (1-D int64)."""
    check_generate_args(context_ids, query_ids, config, max_new_tokens, stop_ids)
    layout = config.layout(context_ids)
    kept = encode_context(model, context_ids, layout)
    return decode(model, kept, query_ids, query_position_start=layout.query_position_start,
                  max_new_tokens=max_new_tokens, stop_ids=stop_ids)
