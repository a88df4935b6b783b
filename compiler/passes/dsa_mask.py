"""The DSA mask pass: a mask read only by DSA ops, built as an AND of row-vs-column comparisons =>
``pulsar_dosa.conjunctive_mask``.

transformers builds a layer's causal mask as ``M[b, 0, i, j] = pos[b, j] <= pos[b, i] & seq[b, i]
== seq[b, j] & ...`` from [S] and [T] vectors (``runtime.conjunctive_mask``). Read by an ordinary
op, Inductor fuses that into its reader; read by the DSA ops (the indexer's top-K, the sparse
attention: extern kernels), it is materialised by a pointwise kernel whose index arithmetic, under
dynamic shapes a division by a runtime size per element, costs far more than the mask's own bytes.
The pass replaces the tree by one op whose kernel writes the mask tile by tile.

Matched: a bool node of rank >= 2 that is an AND or a comparison, every reader of which (through
views: expand, basic getitem, unsqueeze, reshape, squeeze, same-dtype casts) is a DSA op. Its tree
of ANDs, same-device bool casts and comparisons is walked down to factors: a node that is a row
vector (size 1 in its last dim) or a column vector (size 1 in the one before) ends the walk; a
comparison of a row and a column of integer or bool dtype becomes a term, a bool row or column a
term of its own. Anything else in the tree (an OR, a float factor, a factor of the full [S, T]
shape) is a near miss and the graph keeps its mask. Exact: the op applies the same comparisons to
the same values (bitwise the same mask)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

import compiler.ops.absorbed_sparse_attention  # noqa: F401  (registers the ops read below)
import compiler.ops.capture_topk  # noqa: F401
import compiler.ops.certified_topk  # noqa: F401
import compiler.ops.conjunctive_mask  # noqa: F401
import compiler.ops.union_sparse_attention  # noqa: F401
from compiler.passes.base import PatternPass
from compiler.passes.matcher import COMPARISONS, NearMiss, NotCandidate, insert_call, is_unit, \
    is_value_preserving_cast, op_kind, op_targets, tensor_meta
from runtime.conjunctive_mask import CODES, MIRRORED

KIND = "dsa_mask"

_ops = torch.ops.pulsar_dosa
DSA_READERS = op_targets(_ops.certified_topk, _ops.capture_topk, _ops.sparse_attention, _ops.absorbed_sparse_attention)
"""The extern DSA ops that read a materialised mask."""
_VIEWS = ("expand", "unsqueeze", "reshape", "squeeze", "contiguous", "clone", "detach")


def _basic_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)


def _is_view(node: fx.Node) -> bool:
    kind = op_kind(node)
    if kind == "getitem":
        return isinstance(node.args[0], fx.Node) and tensor_meta(node) is not None and _basic_index(node.args[1])
    if kind == "cast":
        return is_value_preserving_cast(node)
    return kind in _VIEWS


def _viewed(node: fx.Node) -> set[fx.Node]:
    """``node`` and every view of it."""
    seen, pending = {node}, [node]
    while pending:
        for user in pending.pop().users:
            if user not in seen and _is_view(user) and user.args[0] in seen:
                seen.add(user)
                pending.append(user)
    return seen


def readers(node: fx.Node) -> list[fx.Node]:
    """The users of ``node``'s value that are not views of it."""
    views = _viewed(node)
    return [user for view in views for user in view.users if user not in views]


def _vector(x: Any) -> str | None:
    """"row" (size 1 in the last dim; a 0-dim tensor too), "col" (size 1 in the one before), or None."""
    t = tensor_meta(x)
    if t is None:
        return None
    if t.dim() == 0 or is_unit(t.shape[-1]):
        return "row"
    if t.dim() < 2 or is_unit(t.shape[-2]):
        return "col"
    return None


@dataclass
class MaskMatch:
    """A matched mask: its top node, the op's arguments (row and column factors, (code, row, col)
    triples over ``runtime.conjunctive_mask.CODES``) and the tree's nodes that die with it."""

    anchor: fx.Node
    rows: list[fx.Node] = field(default_factory=list)
    cols: list[fx.Node] = field(default_factory=list)
    terms: list[int] = field(default_factory=list)
    interior: list[fx.Node] = field(default_factory=list)
    operand_nodes: list[fx.Node] = field(default_factory=list)

    def slot(self, side: list[fx.Node], x: fx.Node) -> int:
        if x not in side:
            side.append(x)
        return side.index(x)

    def add(self, code: str, row: fx.Node | None, col: fx.Node | None) -> None:
        self.terms += [CODES.index(code), -1 if row is None else self.slot(self.rows, row),
                       -1 if col is None else self.slot(self.cols, col)]

    def variant(self) -> str:
        return "+".join(CODES[c] for c in self.terms[::3])


def _factor(x: Any, device: torch.device, bool_only: bool) -> fx.Node:
    t = tensor_meta(x)
    if not isinstance(x, fx.Node) or t is None:
        raise NearMiss(f"mask factor {x!r} is not a tensor")
    if t.is_floating_point() or t.is_complex() or (bool_only and t.dtype != torch.bool):
        raise NearMiss(f"mask factor {x.name} is {t.dtype}, expected {'bool' if bool_only else 'an integer or bool'}")
    if t.device != device:
        raise NearMiss(f"mask factor {x.name} is on {t.device}, the mask on {device}")
    return x


def _walk(node: Any, m: MaskMatch, device: torch.device) -> None:
    """Add the terms of the tree under ``node`` to ``m`` (module docstring); NearMiss on another form."""
    if node is True:
        return
    if not isinstance(node, fx.Node) or tensor_meta(node) is None:
        raise NearMiss(f"mask operand {node!r} is not a tensor node")
    kind = _vector(node)
    if kind is not None:
        leaf = _factor(node, device, True)
        m.add(kind, leaf if kind == "row" else None, leaf if kind == "col" else None)
        return
    m.interior.append(node)
    cmp = op_kind(node)
    if cmp == "cast" and is_value_preserving_cast(node):
        return _walk(node.args[0], m, device)
    if cmp == "and" and len(node.args) == 2 and not node.kwargs:
        for side in node.args:
            _walk(side, m, device)
        return
    if cmp in COMPARISONS and len(node.args) == 2 and not node.kwargs:
        a, b = node.args
        sides = (_vector(a), _vector(b))
        if sides == ("row", "col"):
            return m.add(cmp, _factor(a, device, False), _factor(b, device, False))
        if sides == ("col", "row"):
            return m.add(MIRRORED[cmp], _factor(b, device, False), _factor(a, device, False))
        raise NearMiss(f"comparison {node.name} is not of a row and a column vector")
    raise NearMiss(f"mask node {node.name} ({op_kind(node) or node.target}) is neither an AND, a comparison nor "
                   f"a row or column vector")


def match_mask(anchor: fx.Node) -> MaskMatch:
    t = tensor_meta(anchor)
    if t is None or t.dtype != torch.bool or t.dim() < 2 or _vector(anchor) is not None:
        raise NotCandidate("not a bool [..., S, T] tensor")
    if op_kind(anchor) != "and" and op_kind(anchor) not in COMPARISONS:
        raise NotCandidate("not an AND or a comparison")
    found = readers(anchor)
    if not found or any(r.target not in DSA_READERS for r in found):
        raise NotCandidate("read by an op other than the DSA ops")
    m = MaskMatch(anchor)
    _walk(anchor, m, t.device)
    return m


class MaskPass(PatternPass):
    """Anchors: the ANDs and comparisons of the graph; the tops of DSA masks match."""

    kind = KIND

    def anchors(self, graph):
        return [n for n in graph.nodes if op_kind(n) == "and" or op_kind(n) in COMPARISONS]

    def match(self, anchor, analysis):
        return match_mask(anchor)

    def rewrite(self, ctx, match, settings):
        graph = ctx.gm.graph
        with graph.inserting_before(match.anchor):
            return insert_call(graph, "call_function", _ops.conjunctive_mask.default,
                               (list(match.rows), list(match.cols), list(match.terms)), like=match.anchor)

    def describe(self, match, settings, node):
        return dict(variant=match.variant(), shapes={"mask": tensor_meta(match.anchor).shape}, path="conjunctive_mask")
