"""The Pulsar driver: phase 1 (packed context encoding), KV drop, phase 2 (query) and greedy decode
(SPEC B.3, B.4).

``generate(model, context_ids, query_ids, config, *, max_new_tokens, stop_ids=None)`` runs a
Hugging Face causal LM (batch 1) on one device: phase 1 packs the inputs (``runtime.assembly``;
pulsar: the spine encoded once, then every block) and runs one forward under a ``PackedPhase``;
every layer's cache then keeps the KV of the block tokens only, in context order; the query and
each generated token attend to all kept KV and to the new tokens causally (``QueryPhase``).
Attention follows the layout through the ``pulsar_dosa::attention`` op of a model compiled with
``backend="pulsar_dosa"``, or, uncompiled, through the transformers attention function registered
here as ``"pulsar_dosa"`` for the duration of the call; every forward is checked to have routed
each attention layer through the layout. Bad arguments raise an error naming them before any model
work; the result is the generated ids, 1-D int64 on the CPU. ``transformers`` is imported when a
model is first run."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, Union

import torch
from torch._dynamo.eval_frame import OptimizedModule

from runtime.assembly import MODES, POSITIONS, PackedLayout, assemble
from runtime.attention_layout import Layout, MergeFn, PackedPhase, QueryPhase, active_layout, use_layout
from runtime.dsa_config import PULSAR_UNSUPPORTED, indexer_heads
from runtime.summaries import DEFAULT_HEURISTIC, HEURISTICS, check_positive_int

if TYPE_CHECKING:
    from transformers import DynamicCache

ATTENTION_IMPLEMENTATION = "pulsar_dosa"
KeptKV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer ``(keys, values)`` of the kept tokens, each [1, Hkv, kept, D], in context order."""
StopIds = Union[int, Iterable[int], torch.Tensor, None]
"""A stop id, any iterable of them, an integer tensor of them, or None (the model's eos ids)."""


@dataclass(frozen=True)
class PulsarConfig:
    """Phase-1 assembly settings (``runtime.assembly.assemble``); pulsar mode uses the shared spine.

    ``sink``, ``chunk``, ``ratio``, ``heuristic`` set the pulsar summaries (ignored in star and
    dense modes). Checked at construction: ValueError/TypeError naming the field.
    """

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
        if self.mode == "pulsar" and self.sink > self.block_size:
            raise ValueError(f"sink must not exceed block_size={self.block_size} in pulsar mode (the sink is the "
                             f"start of the first block), got {self.sink}")

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


@functools.cache
def register_layout_attention() -> None:
    """Register ``layout_attention`` with transformers as ``ATTENTION_IMPLEMENTATION`` (once)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_IMPLEMENTATION, layout_attention)


def model_device(model: torch.nn.Module) -> torch.device:
    """Device of the model's first parameter."""
    return next(model.parameters()).device


def is_compiled(model: torch.nn.Module) -> bool:
    """True for a ``torch.compile``d module (its attention ops read the layout themselves)."""
    return isinstance(model, OptimizedModule)


@contextlib.contextmanager
def routed_attention(model: torch.nn.Module) -> Iterator[None]:
    """Route an uncompiled model's attention to ``layout_attention`` for the block; inside a block
    that routes it already the implementation is left alone (the outer block restores it)."""
    if is_compiled(model):
        yield
        return
    register_layout_attention()
    config = model.config
    previous = config._attn_implementation
    switch = previous != ATTENTION_IMPLEMENTATION
    if switch:
        config._attn_implementation = ATTENTION_IMPLEMENTATION
    try:
        yield
    finally:
        if switch:
            config._attn_implementation = previous


def new_cache(model: torch.nn.Module, kept: Optional[KeptKV] = None) -> "DynamicCache":
    """A fresh transformers cache for ``model``, holding ``kept`` (per-layer keys and values) if given."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for layer, (keys, values) in enumerate(kept or ()):
        cache.update(keys, values, layer)
    return cache


@functools.lru_cache(maxsize=None)
def cache_keyword(model_type: type) -> str:
    """The name of the cache argument of ``model_type.forward`` (``cache`` or ``past_key_values``)."""
    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"


def run_forward(model: torch.nn.Module, layout: Layout, input_ids: torch.Tensor,
                position_ids: torch.Tensor, cache: "DynamicCache") -> torch.Tensor:
    """One forward of ``input_ids`` [1, S] under ``layout``; returns the last position's logits [V]."""
    inner = model._orig_mod if is_compiled(model) else model
    with torch.no_grad(), routed_attention(model), use_layout(layout):
        out = model(input_ids=input_ids, position_ids=position_ids, use_cache=True, logits_to_keep=1,
                    **{cache_keyword(type(inner)): cache})
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
    cache = new_cache(model)
    check_full_attention(cache)
    phase = PackedPhase(layout.prefix_end.to(device), layout.segment_start.to(device))
    run_forward(model, phase, ids, positions, cache)
    kept = torch.nonzero(layout.keep).flatten()
    kept = kept[torch.argsort(layout.source_index[kept])].to(device)
    return [(layer.keys[:, :, kept], layer.values[:, :, kept]) for layer in cache.layers]


def check_full_attention(cache: "DynamicCache") -> None:
    """ValueError naming the model when its ``cache`` has a sliding-window layer (Pulsar keeps
    every block's KV: it needs full-attention layers)."""
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        raise ValueError("model has a sliding-window cache layer: Pulsar needs full-attention layers")


def decode(model: torch.nn.Module, kept: KeptKV, query_ids: torch.Tensor, *, query_position_start: int,
           max_new_tokens: int, stop_ids: Iterable[int] = (), owner: bool = True,
           merge: Optional[MergeFn] = None,
           agree: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
           make_phase: Optional[Callable[[], QueryPhase]] = None) -> torch.Tensor:
    """Phase 2 and greedy decode over the kept KV; returns the generated ids (1-D int64).

    ``query_ids``: 1-D; ``owner``: this rank keeps the new tokens' KV (elsewhere they are dropped
    after each forward); ``merge``: combines per-rank partials (None on one device); ``agree``:
    makes every rank use the same next token (None on one device); ``make_phase``: builds the
    layout of each forward (default ``QueryPhase(kept tokens, owner, merge)``). Stops after a
    token in ``stop_ids`` (included) or ``max_new_tokens`` tokens. A token is read back to the host
    only to test it against ``stop_ids`` (with none, the device is not waited on between steps).
    """
    device = model_device(model)
    num_kept = kept[0][0].shape[2]
    stops = set(int(s) for s in stop_ids)
    cache = new_cache(model, kept)
    tokens = query_ids.to(device).unsqueeze(0)
    position = query_position_start
    generated: list[torch.Tensor] = []
    with routed_attention(model):
        while len(generated) < max_new_tokens:
            positions = torch.arange(position, position + tokens.shape[1], device=device).unsqueeze(0)
            phase = QueryPhase(num_kept, owner, merge) if make_phase is None else make_phase()
            logits = run_forward(model, phase, tokens, positions, cache)
            next_token = logits.argmax().reshape(1)
            if agree is not None:
                next_token = agree(next_token)
            generated.append(next_token)
            # Read the token back only to test it against the stop ids.
            if len(generated) == max_new_tokens or (stops and int(next_token) in stops):
                break
            position += tokens.shape[1]
            tokens = next_token.unsqueeze(0)
            if not owner:
                cache = new_cache(model, kept)
    return torch.cat(generated).cpu() if generated else torch.zeros(0, dtype=torch.int64)


def vocabulary_size(model: torch.nn.Module) -> Optional[int]:
    """Rows of the model's input embedding (else ``config.vocab_size``); None when neither exists."""
    embeddings = getattr(model, "get_input_embeddings", None)
    table = embeddings() if callable(embeddings) else None
    if isinstance(table, torch.nn.Embedding):
        return table.num_embeddings
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return size if isinstance(size, int) else None


def check_model(model: object) -> None:
    """TypeError/ValueError naming ``model`` unless it is a module that ``generate`` can run: with
    parameters, none of them on the meta device (a model built without its weights), no DSA
    indexer in its configuration (``runtime.dsa_config``: DSA attention ignores Pulsar layouts) and
    no sliding-window layer in its cache (``check_full_attention``)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers causal LM), got {type(model).__name__}")
    inner = model._orig_mod if is_compiled(model) else model
    devices = {p.device for p in inner.parameters()}
    if not devices:
        raise ValueError(f"model must have parameters (a transformers causal LM), {type(inner).__name__} has none")
    if torch.device("meta") in devices:
        raise ValueError(f"model has parameters on the meta device (built without its weights): load or "
                         f"materialise {type(inner).__name__}'s weights before generate")
    heads = indexer_heads(getattr(inner, "config", None))
    if heads is not None:
        raise ValueError(f"model {type(inner).__name__} has DSA indexers (index_n_heads={heads} in its "
                         f"configuration): {PULSAR_UNSUPPORTED}")
    if getattr(inner, "config", None) is not None:
        check_full_attention(new_cache(inner))


def token_ids_1d(name: str, ids: object, vocabulary: Optional[int]) -> torch.Tensor:
    """``ids`` ([L] or [1, L], integer, non-empty, every id in ``[0, vocabulary)``, not on the meta
    device) as 1-D int64 on the CPU; TypeError/ValueError naming ``name`` otherwise."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.is_meta:
        raise ValueError(f"{name} must hold token ids, got a tensor on the meta device (shapes only, no values)")
    if ids.dtype == torch.bool or ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise TypeError(f"{name} must have an integer dtype, got {ids.dtype}")
    if not (ids.dim() == 1 or (ids.dim() == 2 and ids.shape[0] == 1)):
        raise ValueError(f"{name} must be [L] or [1, L] (batch size 1), got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError(f"{name} must hold at least one token, got shape {tuple(ids.shape)}")
    flat = ids.reshape(-1).to("cpu", torch.int64)
    low, high = int(flat.min()), int(flat.max())
    if low < 0 or (vocabulary is not None and high >= vocabulary):
        bad = low if low < 0 else high
        limit = "" if vocabulary is None else f", {vocabulary}"
        raise ValueError(f"{name} holds token id {bad} outside the model's vocabulary [0{limit})")
    return flat


def stop_id_tuple(model: torch.nn.Module, stop_ids: StopIds, vocabulary: Optional[int]) -> tuple[int, ...]:
    """``stop_ids`` read once into a tuple of ints; None gives ``model.generation_config.eos_token_id``
    (an int, a list or None). TypeError/ValueError naming ``stop_ids`` for anything else."""
    if stop_ids is None:
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        stop_ids = () if eos is None else eos
    if isinstance(stop_ids, torch.Tensor):
        if stop_ids.dtype == torch.bool or stop_ids.dtype.is_floating_point or stop_ids.dtype.is_complex:
            raise TypeError(f"stop_ids must hold integer token ids, got a {stop_ids.dtype} tensor")
        if stop_ids.is_meta:
            raise ValueError("stop_ids must hold token ids, got a tensor on the meta device (shapes only, no values)")
        stop_ids = stop_ids.reshape(-1).tolist()
    elif isinstance(stop_ids, numbers.Integral) and not isinstance(stop_ids, bool):
        stop_ids = (stop_ids,)
    elif isinstance(stop_ids, (str, bytes)) or not isinstance(stop_ids, Iterable):
        raise TypeError(f"stop_ids must be a token id, an iterable of token ids or None, got {stop_ids!r}")
    stops = tuple(stop_ids)
    for stop in stops:
        if isinstance(stop, bool) or not isinstance(stop, numbers.Integral):
            raise TypeError(f"stop_ids must hold int token ids, got {stop!r} in {stops!r}")
        if stop < 0 or (vocabulary is not None and stop >= vocabulary):
            raise ValueError(f"stop_ids holds token id {stop} outside the model's vocabulary "
                             f"[0{'' if vocabulary is None else f', {vocabulary}'})")
    return tuple(int(stop) for stop in stops)


@dataclass(frozen=True)
class GenerateArgs:
    """``generate``'s arguments, checked and normalised: 1-D int64 CPU ids and a tuple of stop ids."""

    context_ids: torch.Tensor
    query_ids: torch.Tensor
    config: "PulsarConfig"
    max_new_tokens: int
    stop_ids: tuple[int, ...]

    def fingerprint(self) -> dict[str, str]:
        """A digest of every argument (equal arguments give equal digests on every host)."""
        def digest(data: bytes) -> str:
            return hashlib.sha256(data).hexdigest()

        return {"context_ids": digest(self.context_ids.numpy().tobytes()),
                "query_ids": digest(self.query_ids.numpy().tobytes()),
                "config": digest(repr(self.config).encode()),
                "max_new_tokens": str(self.max_new_tokens),
                "stop_ids": digest(repr(self.stop_ids).encode())}


def prepare_generate_args(model: torch.nn.Module, context_ids: object, query_ids: object, config: object,
                          max_new_tokens: object, stop_ids: StopIds) -> GenerateArgs:
    """Check ``generate``'s arguments before any model work (TypeError/ValueError naming the
    argument) and normalise them (``GenerateArgs``)."""
    check_model(model)
    vocabulary = vocabulary_size(model)
    context = token_ids_1d("context_ids", context_ids, vocabulary)
    query = token_ids_1d("query_ids", query_ids, vocabulary)
    if not isinstance(config, PulsarConfig):
        raise TypeError(f"config must be a PulsarConfig, got {type(config).__name__}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    return GenerateArgs(context, query, config, max_new_tokens, stop_id_tuple(model, stop_ids, vocabulary))


def generate(model: torch.nn.Module, context_ids: torch.Tensor, query_ids: torch.Tensor,
             config: PulsarConfig, *, max_new_tokens: int, stop_ids: StopIds = None) -> torch.Tensor:
    """Pulsar (or star/dense) long-context generation on one device; returns the generated ids
    (1-D int64, CPU), the last one a stop id unless ``max_new_tokens`` ran out.

    ``context_ids``, ``query_ids``: token ids, [L] or [1, L] (batch size 1), on any device.
    ``stop_ids``: a stop id or any iterable of them (read once); None (default) uses the model's
    ``generation_config.eos_token_id``. Arguments are checked before any model work (the model
    too: ``check_model`` refuses one without weights or with DSA indexers).
    """
    args = prepare_generate_args(model, context_ids, query_ids, config, max_new_tokens, stop_ids)
    context_ids = args.context_ids.to(model_device(model))  # the layout (summaries too) is built there
    layout = config.layout(context_ids)
    kept = encode_context(model, context_ids, layout)
    return decode(model, kept, args.query_ids, query_position_start=layout.query_position_start,
                  max_new_tokens=args.max_new_tokens, stop_ids=args.stop_ids)
