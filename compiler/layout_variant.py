"""Graphs for a running Pulsar layout: the attention masks the layout ignores are not computed.

Inside ``runtime.pulsar.generate`` every ``pulsar_dosa::attention`` op ignores its ``attn_mask``
(the layout decides visibility), but a captured graph still builds transformers' [B, 1, Sq, Sk]
mask, O(Sq * Sk) memory traffic per forward. ``without_attention_masks(gm)``: a copy of ``gm`` in
which every attention op gets ``attn_mask=None`` and the nodes that computed nothing else are
removed; None when that removes nothing. ``LayoutDispatch`` runs the copy while a layout is active
and the graph as captured otherwise, so a compiled model outside ``generate`` computes exactly what
it computed before. The backend builds copies only for graphs captured under a layout."""
from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch.fx as fx

from compiler.passes.attention import OP
from runtime.attention_layout import active_layout

MASK_ARG = 3
"""Position of ``attn_mask`` in ``pulsar_dosa::attention``'s schema."""


def _is_attention(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is OP


def without_attention_masks(gm: fx.GraphModule) -> Optional[fx.GraphModule]:
    """A copy of ``gm`` whose attention ops get no mask, the mask computation removed; None when
    the copy would remove no node. ``gm`` is left unchanged; placeholders stay (same signature)."""
    graph = copy.deepcopy(gm.graph)
    changed = False
    for node in graph.nodes:
        if _is_attention(node) and isinstance(node.args[MASK_ARG], fx.Node):
            args = list(node.args)
            args[MASK_ARG] = None
            node.args = tuple(args)
            changed = True
    before = len(graph.nodes)
    if not changed or not graph.eliminate_dead_code() or len(graph.nodes) == before:
        return None
    graph.lint()
    return fx.GraphModule(gm, graph)


class LayoutDispatch:
    """Calls ``under_layout`` while a Pulsar layout is active, ``plain`` otherwise.

    Both are compiled forms of graphs with the same inputs; they must share one calling convention
    (inductor's boxed one, a list of arguments, or positional arguments), which this keeps."""

    def __init__(self, plain: Callable, under_layout: Callable):
        boxed = getattr(plain, "_boxed_call", False)
        if boxed != getattr(under_layout, "_boxed_call", False):
            raise ValueError("plain and under_layout must share one calling convention (_boxed_call)")
        self.plain, self.under_layout = plain, under_layout
        self._boxed_call = boxed

    def __call__(self, *args: Any) -> Any:
        return (self.plain if active_layout() is None else self.under_layout)(*args)
