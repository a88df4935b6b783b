"""After the families: an indexer op whose selection is only read as a set gives it unsorted.

``certified_topk`` returns each row's top-K in THE ORDER; sorting it is a pass over [B, S, kk]
codes. Its readers in a DSA layer do not need that order: the sparse-attention ops (a softmax over
the selected keys) and the index mask's ``scatter`` of a constant at the indices (the same mask
for any order). When the op's values are unused and every reader of its indices (through
elementwise casts; ``new_ones`` and the like read the shape only) is one of those, the op is
called with ``sorted=False``: the same set per row (counted as ``dsa_indexer.unsorted``). The
sparse-attention ops accumulate the selected keys in the order given, so their outputs may differ
from the sorted call's by rounding only, which their contract allows; a scatter is unchanged."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

import compiler.ops.absorbed_sparse_attention  # noqa: F401  (registers the ops read below)
import compiler.ops.certified_topk  # noqa: F401
import compiler.ops.union_sparse_attention  # noqa: F401
from compiler.passes.matcher import op_targets

_ops = torch.ops.pulsar_dosa
_SET_READERS = op_targets(_ops.sparse_attention, _ops.absorbed_sparse_attention)
_CASTS = ("to", "long", "int", "type")
"""Elementwise casts: a permutation of the input permutes the output the same way."""
_SHAPE_READERS = ("new_ones", "new_zeros", "new_full", "new_empty", "size", "dim")
"""Methods that read the tensor's shape, dtype and device only."""
_SCATTERS = (torch.scatter, "scatter", "scatter_")


def _scatters_a_constant(node: fx.Node, indices: fx.Node) -> bool:
    """``node`` is ``scatter(input, dim, indices, value)`` into another tensor, a Python number as the value."""
    if node.op not in ("call_function", "call_method") or node.target not in _SCATTERS or "reduce" in node.kwargs:
        return False
    index = node.kwargs.get("index", node.args[2] if len(node.args) > 2 else None)
    value = node.kwargs.get("value", node.args[3] if len(node.args) > 3 else None)
    return index is indices and node.args[0] is not indices and isinstance(value, (int, float, bool))


def _read_as_set(indices: fx.Node) -> bool:
    pending, seen = [indices], {indices}
    while pending:
        node = pending.pop()
        for user in node.users:
            if user.target in _SET_READERS or _scatters_a_constant(user, node):
                continue
            method = user.target if user.op == "call_method" and user.args[0] is node else None
            if method in _SHAPE_READERS:
                continue
            if method in _CASTS and not user.kwargs.get("memory_format") and user not in seen:
                seen.add(user)
                pending.append(user)
                continue
            return False
    return True


def set_selections_unsorted(graph: fx.Graph) -> int:
    """Give ``sorted=False`` to every ``certified_topk`` whose selection is only read as a set
    (module docstring); returns how many."""
    changed = 0
    for node in graph.nodes:
        if node.target is not _ops.certified_topk.default or node.kwargs.get("sorted") is False:
            continue
        outputs = {user.args[1]: user for user in node.users if user.target is operator.getitem}
        if len(outputs) != len(node.users) or 0 in outputs and outputs[0].users or 1 not in outputs:
            continue
        if _read_as_set(outputs[1]):
            node.kwargs = {**node.kwargs, "sorted": False}
            changed += 1
    return changed
