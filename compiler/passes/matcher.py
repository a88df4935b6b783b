"""The matchers the pattern passes share, for Dynamo (torch-level) FX graphs; no pass imports another.

:func:`op_kind` names an operation whatever its spelling (``torch.relu``, ``F.relu``, ``x.relu()``
-> "relu"; ``x.float()``, ``x.to(torch.float32)`` -> "cast"). Shapes come from
``node.meta["example_value"]`` and compare with :func:`same_size`, which never adds a guard.
:func:`skip_layout_preserving` walks back through ops that change neither values nor the order of
the non-unit dims. :func:`escaping_nodes` proves a region closed by post-dominators: an interior
node with a path to the graph's end that avoids the anchor would be needed after the rewrite.
Attention chains: :data:`SDPA_TARGETS`, :func:`fold_repeat_kv` (GQA ``repeat_kv``),
:func:`softmax_of`, :func:`single_use`. A step that does not see its pattern raises
:class:`NotCandidate`; one that sees it in a form that must stay untouched, :class:`NearMiss`."""
from __future__ import annotations

import operator
import re
from typing import Any, Iterable

import networkx as nx
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true


class NearMiss(Exception):
    """A candidate that must stay untouched; the message is the reason."""


class NotCandidate(Exception):
    """The anchor does not compute this family's pattern at all (counted, not reported)."""


_FUNCTION_KINDS: dict[Any, str] = {
    torch.matmul: "matmul", torch.bmm: "bmm", torch.einsum: "einsum", torch.functional.einsum: "einsum",
    torch.relu: "relu", torch.nn.functional.relu: "relu", torch.clamp_min: "clamp_min", torch.clamp: "clamp",
    torch.softmax: "softmax", torch.nn.functional.softmax: "softmax", torch.sigmoid: "sigmoid",
    torch.nn.functional.gelu: "gelu", torch.nn.functional.silu: "silu", torch.exp: "exp",
    torch.topk: "topk", torch.sum: "sum", torch.masked_fill: "masked_fill",
    torch.add: "add", operator.add: "add", torch.mul: "mul", operator.mul: "mul",
    torch.div: "div", operator.truediv: "div", operator.invert: "invert", torch.logical_not: "invert",
    operator.getitem: "getitem", torch.squeeze: "squeeze", torch.unsqueeze: "unsqueeze",
    torch.reshape: "reshape", torch.transpose: "transpose", torch.permute: "permute", torch.clone: "clone",
}
_METHOD_KINDS = {
    "matmul": "matmul", "bmm": "bmm", "relu": "relu", "clamp_min": "clamp_min", "clamp": "clamp",
    "softmax": "softmax", "sigmoid": "sigmoid", "exp": "exp", "topk": "topk", "sum": "sum",
    "masked_fill": "masked_fill", "add": "add", "mul": "mul", "div": "div",
    "logical_not": "invert", "bitwise_not": "invert", "squeeze": "squeeze", "unsqueeze": "unsqueeze",
    "view": "reshape", "reshape": "reshape", "transpose": "transpose", "permute": "permute",
    "clone": "clone", "contiguous": "contiguous", "detach": "detach", "expand": "expand",
    "to": "cast", "float": "cast", "double": "cast", "half": "cast", "bfloat16": "cast", "type": "cast",
}


def op_kind(node: fx.Node) -> str | None:
    """Canonical operation name of a call node, or None for anything else."""
    if node.op == "call_function":
        return _FUNCTION_KINDS.get(node.target)
    if node.op == "call_method":
        return _METHOD_KINDS.get(node.target)
    return None


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``name`` of a call, given positionally at ``index`` or by keyword."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def value(node: Any) -> Any:
    """The traced example value of a node (FakeTensor, SymInt, ...), or ``node`` itself for constants."""
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, fx.Node) else node


def tensor_meta(node: Any) -> torch.Tensor | None:
    """The node's example tensor, or None when it is not a tensor-valued node."""
    v = value(node)
    return v if isinstance(v, torch.Tensor) else None


def same_size(a: Any, b: Any) -> bool:
    """Sizes provably equal (ints or SymInts), without adding a guard."""
    return a is b or bool(statically_known_true(a == b))


def is_unit(size: Any) -> bool:
    return same_size(size, 1)


def same_shape(a: Iterable[Any], b: Iterable[Any]) -> bool:
    a, b = tuple(a), tuple(b)
    return len(a) == len(b) and all(same_size(x, y) for x, y in zip(a, b))


def non_unit(shape: Iterable[Any]) -> tuple[Any, ...]:
    """The sizes that are not provably 1, in order."""
    return tuple(s for s in shape if not is_unit(s))


def normalize_dim(dim: int, rank: int) -> int | None:
    """``dim`` in [0, rank), or None when it is out of range."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        return None
    d = dim + rank if dim < 0 else dim
    return d if 0 <= d < rank else None


_WIDENING = {
    torch.float16: {torch.float16, torch.float32, torch.float64},
    torch.bfloat16: {torch.bfloat16, torch.float32, torch.float64},
    torch.float32: {torch.float32, torch.float64},
    torch.float64: {torch.float64},
}


def is_value_preserving_cast(node: fx.Node) -> bool:
    """A dtype cast that represents every input value exactly (a float widening, or same dtype), same device."""
    if op_kind(node) != "cast" or not isinstance(node.args[0], fx.Node):
        return False
    src, dst = tensor_meta(node.args[0]), tensor_meta(node)
    if src is None or dst is None or src.device != dst.device:
        return False
    return dst.dtype in _WIDENING.get(src.dtype, {src.dtype} if src.dtype == dst.dtype else set())


def is_layout_preserving(node: fx.Node) -> bool:
    """Values unchanged and the non-unit dims kept in order (see the module docstring)."""
    kind = op_kind(node)
    if kind in ("clone", "contiguous", "detach"):
        return node.kwargs.get("memory_format") is None and len(node.args) == 1
    if kind == "cast":
        return is_value_preserving_cast(node)
    if kind in ("reshape", "squeeze", "unsqueeze", "expand"):
        src, out = tensor_meta(node.args[0]) if isinstance(node.args[0], fx.Node) else None, tensor_meta(node)
        if src is None or out is None:
            return False
        if kind == "expand":
            return same_shape(src.shape, out.shape)
        return len(non_unit(src.shape)) == len(non_unit(out.shape)) and same_shape(non_unit(src.shape), non_unit(out.shape))
    return False


def skip_layout_preserving(node: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """Walk producers from ``node`` through layout-preserving ops; returns (first other node, the skipped nodes)."""
    skipped = []
    while isinstance(node, fx.Node) and is_layout_preserving(node):
        skipped.append(node)
        node = node.args[0]
    return node, skipped


def is_scalar(x: Any) -> bool:
    """A python number, a symbolic float/int node, or a 0-dim floating tensor node (a possible scale)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return True
    if not isinstance(x, fx.Node):
        return False
    v = value(x)
    if isinstance(v, (torch.SymFloat, torch.SymInt, int, float)) and not isinstance(v, bool):
        return True
    return isinstance(v, torch.Tensor) and v.dim() == 0 and v.is_floating_point()


_SOURCE_PREFIX = re.compile(r"^(?:[LG](?:\[[^\]]*\])+|self)(?:\.|$)")
"""Dynamo's name of the traced object a module path starts from: ``L['self']``, ``L['args'][0]``
(a wrapped ``forward``), ``G['model']``, ``self``."""


def module_path(node: fx.Node) -> str:
    """The innermost module path of a node from ``nn_module_stack`` ("model.layers.0.self_attn.indexer"),
    without Dynamo's source names (``L['args'][0].``, ``._orig_mod``, ``layers[0]`` -> ``layers.0``)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = _SOURCE_PREFIX.sub("", list(stack.values())[-1][0], count=1)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\[['\"]([^'\"\]]+)['\"]\]", r".\1", path)
    path = ".".join(part for part in path.split(".") if part and part != "_orig_mod")
    return path


def graph_digraph(graph: fx.Graph) -> tuple[nx.DiGraph, str]:
    """A networkx digraph of the FX graph: edges producer -> user, plus an exit vertex reached from
    the output node and from every node without users (side effects or dead values)."""
    exit_vertex = "__exit__"
    dg = nx.DiGraph()
    dg.add_node(exit_vertex)
    for n in graph.nodes:
        dg.add_node(n)
        for user in n.users:
            dg.add_edge(n, user)
        if n.op == "output" or not n.users:
            dg.add_edge(n, exit_vertex)
    return dg, exit_vertex


def post_dominators(graph: fx.Graph) -> dict[Any, Any]:
    """Immediate post-dominator of every node (networkx dominators on the reversed digraph,
    rooted at the exit vertex). Nodes that cannot reach the end are absent."""
    dg, exit_vertex = graph_digraph(graph)
    return nx.immediate_dominators(dg.reverse(copy=False), exit_vertex)


def escaping_nodes(pdom: dict[Any, Any], interior: Iterable[fx.Node], anchor: fx.Node) -> list[fx.Node]:
    """Interior nodes not post-dominated by ``anchor``: some path from them to the graph's end
    avoids the anchor, so their value is needed after the region up to ``anchor`` is replaced.
    ``pdom`` comes from :func:`post_dominators` on the unmodified graph."""
    escaping = []
    for n in interior:
        if n is anchor:
            continue
        d = pdom.get(n)
        while d is not None and d is not anchor and pdom.get(d) is not d:
            d = pdom.get(d)
        if d is not anchor:
            escaping.append(n)
    return escaping


def fake_mode_of(graph: fx.Graph):
    """The FakeTensorMode of the graph's example values (None when the graph carries none)."""
    for n in graph.nodes:
        v = value(n)
        if isinstance(v, torch.Tensor) and hasattr(v, "fake_mode"):
            return v.fake_mode
    return None


def insert_call(graph: fx.Graph, op: str, target: Any, args: tuple, kwargs: dict | None = None,
                like: fx.Node | None = None) -> fx.Node:
    """Create a call node at the graph's insertion point with its example value (computed on the
    fake inputs, no guard added) and the module-stack metadata of ``like``."""
    kwargs = kwargs or {}
    node = graph.create_node(op, target, args, kwargs)
    fake_args = fx.node.map_arg(args, value)
    fake_kwargs = fx.node.map_arg(kwargs, value)
    mode = fake_mode_of(graph)
    with mode if mode is not None else torch.no_grad():
        if op == "call_method":
            result = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
        else:
            result = target(*fake_args, **fake_kwargs)
    node.meta["example_value"] = result
    if like is not None:
        for key in ("nn_module_stack", "stack_trace", "source_fn_stack"):
            if key in like.meta:
                node.meta[key] = like.meta[key]
    return node


_PURE_KINDS = {"cast", "reshape", "squeeze", "unsqueeze", "transpose", "permute", "clone", "contiguous",
               "detach", "expand", "invert", "getitem"}


def erase_dead_pure(graph: fx.Graph, nodes: Iterable[Any]) -> None:
    """Erase each of ``nodes`` that has no user and is a pure view/cast-like op, then its producers likewise."""
    work = [n for n in nodes if isinstance(n, fx.Node)]
    while work:
        n = work.pop()
        if n.graph is graph and not n.users and op_kind(n) in _PURE_KINDS and n.op in ("call_function", "call_method"):
            producers = [a for a in n.all_input_nodes]
            graph.erase_node(n)
            work.extend(producers)


# ---------------------------------------------------------------------------------------------
# Attention chains

SDPA_TARGETS = (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)


def repeat_kv_source(node: Any) -> tuple[Any, int, list[fx.Node]]:
    """``(x, n, nodes)`` when ``node`` repeats every head of 4-D ``x`` n times along dim 1, else ``(node, 1, [])``."""
    if not isinstance(node, fx.Node):
        return node, 1, []
    if (node.op == "call_method" and node.target == "repeat_interleave") or \
            (node.op == "call_function" and node.target is torch.repeat_interleave):
        source, repeats = node.args[0], arg(node, 1, "repeats")
        dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else None)
        src = tensor_meta(source)
        if isinstance(repeats, int) and src is not None and src.dim() == 4 and normalize_dim(dim, 4) == 1:
            return source, repeats, [node]
        return node, 1, []
    if op_kind(node) != "reshape" or not isinstance(node.args[0], fx.Node) or op_kind(node.args[0]) != "expand":
        return node, 1, []
    expand = node.args[0]
    index = expand.args[0]
    if not (isinstance(index, fx.Node) and index.op == "call_function" and index.target is operator.getitem):
        return node, 1, []
    source, key = index.args
    full = slice(None, None, None)
    src, wide, out = tensor_meta(source), tensor_meta(expand), tensor_meta(node)
    if key != (full, full, None, full, full) or src is None or wide is None or out is None or src.dim() != 4:
        return node, 1, []
    b, h, s, d = src.shape
    n = wide.shape[2]
    if wide.dim() != 5 or not all(same_size(x, y) for x, y in zip(wide.shape, (b, h, n, s, d))) \
            or out.dim() != 4 or not all(same_size(x, y) for x, y in zip(out.shape, (b, h * n, s, d))) \
            or not isinstance(n, int):
        return node, 1, []
    return source, n, [node, expand, index]


def fold_repeat_kv(k: Any, v: Any) -> tuple[Any, Any, bool, list[fx.Node]]:
    """Strip a matching repeat of k and v: ``(k, v, folded, repeat nodes)``."""
    k_src, k_rep, k_nodes = repeat_kv_source(k)
    v_src, v_rep, v_nodes = repeat_kv_source(v)
    if k_rep > 1 and k_rep == v_rep:
        return k_src, v_src, True, k_nodes + v_nodes
    return k, v, False, []


def single_use(nodes: list[fx.Node]) -> None:
    """Every interior node feeds exactly one user (the next node of the chain)."""
    for node in nodes:
        if len(node.users) != 1:
            raise NearMiss(f"intermediate {node.name} is used outside the attention chain")


def through_inactive_dropout(node: Any, chain: list[fx.Node]) -> Any:
    """Skip ``F.dropout(x, p=0)`` / ``dropout(x, training=False)`` (appending it to ``chain``)."""
    if isinstance(node, fx.Node) and node.op == "call_function" and node.target is F.dropout:
        p, training = arg(node, 1, "p", 0.5), arg(node, 2, "training", True)
        if not (p == 0 or training is False):
            raise NearMiss("dropout on the attention weights may be active")
        chain.append(node)
        return node.args[0]
    return node


def softmax_of(node: Any) -> tuple[fx.Node | None, list[fx.Node]]:
    """The softmax that feeds ``node`` through dropout and casts, with the skipped nodes."""
    chain: list[fx.Node] = []
    while isinstance(node, fx.Node):
        node = through_inactive_dropout(node, chain)
        if op_kind(node) == "softmax":
            return node, chain
        if op_kind(node) in ("cast", "contiguous", "clone"):
            chain.append(node)
            node = node.args[0]
            continue
        return None, chain
    return None, chain
