"""Phase-1 FLOPs of a decoder, counted analytically from its shape and the assembled inputs
(SPEC B.3).

Matmul FLOPs only: per layer, linear layers 2·tokens·(their weights) and attention
4·heads·head_dim per visible (query, key) pair (q·k and p·v); norms, RoPE, softmax and the LM
head (phase 1 keeps one position's logits) are left out. ``DecoderShape.from_config`` reads a
transformers Llama-style configuration; ``host_lengths`` gives the per-host input lengths of a
layout of independent causal inputs (``runtime.assembly.assemble`` without a shared spine), whose
FLOPs ``causal_input_flops`` counts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.assembly import PackedLayout


@dataclass(frozen=True)
class DecoderShape:
    """What the count depends on: layers, query heads x head dim, linear weights per layer."""

    layers: int
    attention_width: int
    linear_weights_per_layer: int

    @classmethod
    def from_config(cls, config) -> "DecoderShape":
        """From a Llama-style configuration: q, k, v and o projections, a gated MLP."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        hidden, mlp = config.hidden_size, config.intermediate_size
        weights = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * mlp
        return cls(config.num_hidden_layers, heads * head_dim, weights)

    def flops(self, tokens: int, pairs: int) -> int:
        """FLOPs of ``tokens`` tokens whose queries see ``pairs`` (query, key) pairs in all."""
        return self.layers * (2 * tokens * self.linear_weights_per_layer + 4 * self.attention_width * pairs)

    def causal_input_flops(self, tokens: int) -> int:
        """FLOPs of one causal input of ``tokens`` tokens (tokens·(tokens+1)/2 pairs)."""
        return self.flops(tokens, tokens * (tokens + 1) // 2)


def visible_pairs(prefix_end: torch.Tensor, segment_start: torch.Tensor) -> int:
    """Number of (query, key) pairs of the two-interval rule over packed queries 0..T-1."""
    t = prefix_end.numel()
    query = torch.arange(t, device=prefix_end.device)
    prefix = prefix_end.clamp(min=0, max=t)
    segment = (query + 1 - torch.maximum(segment_start, prefix)).clamp(min=0)
    return int((prefix + segment).sum())


def host_lengths(layout: PackedLayout) -> list[int]:
    """Token count of each per-host input of a layout of independent causal inputs; ValueError
    for a layout whose tokens read keys before their segment (a shared spine)."""
    if bool((layout.prefix_end > 0).any()):
        raise ValueError("the layout has a shared spine: its inputs are not independent")
    bounds = layout.cu_seqlens.tolist()
    return [b - a for a, b in zip(bounds[:-1], bounds[1:])]
