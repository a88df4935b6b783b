"""The matchers the pattern passes share, for Dynamo (torch-level) FX graphs; no pass imports another.

:func:`op_kind` names an operation whatever its spelling (``torch.relu``, ``F.relu``, ``x.relu()``
-> "relu"; ``x.float()``, ``x.to(torch.float32)`` -> "cast"). Shapes come from
``node.meta["example_value"]`` and compare with :func:`same_size`, which never adds a guard.
:func:`skip_layout_preserving` walks back through ops that change neither values nor the order of
the non-unit dims. :func:`escaping_nodes` proves a region closed by post-dominators: an interior
node with a path to the graph's end that avoids the anchor would be needed after the rewrite.
Attention chains: :data:`SDPA_TARGETS`, :func:`fold_repeat_kv` (GQA ``repeat_kv``),
:func:`softmax_of`, :func:`single_use`; :func:`latent_form` recognises MLA's key/value expansion of a
latent (``kv = linear(c, W)`` split into k_nope and v, k = k_nope with the rope key; through a
cache's first append, or a latent cache's read), the operands of an absorbed attention, or raises
:class:`NotLatent`. A step that does not see its pattern raises
:class:`NotCandidate`; one that sees it in a form that must stay untouched, :class:`NearMiss`."""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import networkx as nx
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

import compiler.ops.fp8_keys  # noqa: F401  (registers pulsar_dosa::fp8_cached_keys, a kind below)
import compiler.ops.latent_kv  # noqa: F401  (registers pulsar_dosa::latent_cached_kv, a kind below)


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
    torch.ops.pulsar_dosa.fp8_cached_keys: "fp8_cached_keys", torch.ops.pulsar_dosa.fp8_cached_keys.default: "fp8_cached_keys",
    torch.ops.pulsar_dosa.latent_cached_kv: "latent_cached_kv",
    torch.ops.pulsar_dosa.latent_cached_kv.default: "latent_cached_kv",
    operator.and_: "and", torch.logical_and: "and", torch.bitwise_and: "and",
}
_METHOD_KINDS = {
    "matmul": "matmul", "bmm": "bmm", "relu": "relu", "clamp_min": "clamp_min", "clamp": "clamp",
    "softmax": "softmax", "sigmoid": "sigmoid", "exp": "exp", "topk": "topk", "sum": "sum",
    "masked_fill": "masked_fill", "add": "add", "mul": "mul", "div": "div",
    "logical_not": "invert", "bitwise_not": "invert", "squeeze": "squeeze", "unsqueeze": "unsqueeze",
    "view": "reshape", "reshape": "reshape", "transpose": "transpose", "permute": "permute",
    "clone": "clone", "contiguous": "contiguous", "detach": "detach", "expand": "expand",
    "to": "cast", "float": "cast", "double": "cast", "half": "cast", "bfloat16": "cast", "type": "cast",
    "__and__": "and", "logical_and": "and", "bitwise_and": "and",
}
COMPARISONS = ("le", "lt", "ge", "gt", "eq", "ne")
"""The kinds of the six comparisons (``operator.le``, ``torch.le``, ``Tensor.le`` / ``__le__``, ...)."""
for _name in COMPARISONS:
    _FUNCTION_KINDS[getattr(operator, _name)] = _FUNCTION_KINDS[getattr(torch, _name)] = _name
    _METHOD_KINDS[_name] = _METHOD_KINDS[f"__{_name}__"] = _name
del _name


def op_targets(*packets: Any) -> tuple[Any, ...]:
    """The call targets of custom ops in a graph: each op's packet (what Dynamo records for
    ``torch.ops.ns.op(...)``) and its default overload (what the passes insert)."""
    return tuple(target for op in packets for target in (op, op.default))


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


def may_be_equal(a: Any, b: Any) -> bool:
    """Sizes not provably different (ints or SymInts), without adding a guard: for two sizes the
    matched graph itself combines (a contraction, or a broadcast of sizes that are not 1), equal
    whenever it runs, however Dynamo named them; the op that replaces it checks them again."""
    return not statically_known_true(a != b)


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


def scale_value(factor: Any) -> float | fx.Node:
    """A score scale the op can take: a finite non-zero Python number, or a node of a symbolic float
    (``dynamic=True`` traces module float attributes as inputs); NearMiss otherwise (a tensor)."""
    if isinstance(factor, (int, float)) and not isinstance(factor, bool):
        if factor == 0 or not math.isfinite(factor):
            raise NearMiss(f"score scale {factor} is zero or not finite")
        return float(factor)
    if isinstance(factor, fx.Node) and isinstance(value(factor), (torch.SymFloat, torch.SymInt)):
        return factor
    raise NearMiss("the score scale is not a Python number or a symbolic float")


def scaled_scores(scores: fx.Node) -> tuple[fx.Node, float | fx.Node, bool]:
    """Attention scores as (the product under an optional ``* c`` or ``/ c``, c by ``scale_value``
    (1.0 without one), whether c divides)."""
    if op_kind(scores) not in ("mul", "div"):
        return scores, 1.0, False
    left, right = scores.args[:2]
    divides = op_kind(scores) == "div"
    factor, product = (right, left) if divides or tensor_meta(right) is None else (left, right)
    return product, scale_value(factor), divides


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
               "detach", "expand", "invert", "getitem", "fp8_cached_keys", "latent_cached_kv"}


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


def score_operands(scores: fx.Node, v: Any, chain: list[fx.Node], pattern: str):
    """The operands of attention scores ``matmul(q, k.transpose(-2, -1))`` under an optional scale
    (``scaled_scores``), a matching repeat of k and v folded (``fold_repeat_kv``): ``(q, k, v, scale,
    divides, folded, repeats)``. Appends the walked nodes to ``chain`` and checks that ``chain`` and
    the repeats feed only the next node (``single_use``); ``pattern`` names the form a NearMiss expected."""
    product, scale, divides = scaled_scores(scores)
    if product is not scores:
        chain.append(scores)
        scores = product
    if op_kind(scores) != "matmul":
        raise NearMiss(f"the softmax input is not {pattern}")
    chain.append(scores)
    q, kt = scores.args[:2]
    if op_kind(kt) != "transpose" or {normalize_dim(kt.args[1], 4), normalize_dim(kt.args[2], 4)} != {2, 3}:
        raise NearMiss("the key operand is not k.transpose(-2, -1)")
    chain.append(kt)
    k, v, folded, repeats = fold_repeat_kv(kt.args[0], v)
    single_use(chain + repeats)
    return q, k, v, scale, divides, folded, repeats


def softmax_dtype(softmax: fx.Node) -> Any:
    """The ``dtype`` argument of a softmax node (None when not given)."""
    return softmax.kwargs.get("dtype", softmax.args[2] if len(softmax.args) > 2 else None)


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


# MLA: keys and values expanded from a latent (the operands of an absorbed attention)

_LINEAR_TARGETS = (torch._C._nn.linear, torch.nn.functional.linear)
_SPLIT_TARGETS = (torch.split, torch.functional.split)
_SIZE_TARGETS = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_size)


class NotLatent(Exception):
    """k and v are not recognised as an MLA expansion of a latent; the message says why."""


@dataclass
class LatentKV:
    """What an absorbed attention reads instead of the expanded k and v."""

    latent: fx.Node
    """The linear's input, ``[B, 1, T, Dc]`` or ``[B, T, Dc]``."""
    rope_key: fx.Node
    """The rope key before its head expand, ``[B, 1, T, Dr]`` (or a latent cache's ``[B, T, Dr]``)."""
    weight: fx.Node
    """kv_b_proj's weight ``[H·(Dn+Dv), Dc]``, the node the linear reads."""
    nope_dim: int
    nodes: list[fx.Node]
    """The expansion's nodes (they die with the attention when nothing else reads them)."""


def _last_dim_part(node: Any) -> Optional[tuple[fx.Node, Any, Any, list[fx.Node]]]:
    """``(x, start, stop, nodes)`` when ``node`` is ``split(x, sizes, -1)[i]`` or ``x[..., start:stop]``
    (stop None: to the end), else None."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is operator.getitem):
        return None
    base, index = node.args
    if not isinstance(base, fx.Node):
        return None
    is_split = (base.op == "call_function" and base.target in _SPLIT_TARGETS) or \
        (base.op == "call_method" and base.target == "split")
    if is_split and isinstance(index, int):
        source, dim = base.args[0], arg(base, 2, "dim", 0)
        sizes = arg(base, 1, "split_size" if base.op == "call_method" else "split_size_or_sections")
        meta = tensor_meta(source)
        if not isinstance(sizes, (list, tuple)) or meta is None or normalize_dim(dim, meta.dim()) != meta.dim() - 1:
            return None
        start = sum(sizes[:index])
        return source, start, start + sizes[index], [node, base]
    if isinstance(index, tuple) and len(index) == 2 and index[0] is Ellipsis and isinstance(index[1], slice) \
            and index[1].step in (None, 1):
        return base, index[1].start or 0, index[1].stop, [node]
    return None


def _expanded_kv(kv: Any, batch: Any, heads: int, keys: Any) -> tuple[fx.Node, fx.Node, int, list[fx.Node]]:
    """``(latent, W, Dn+Dv, nodes)`` for ``kv = linear(latent, W).view(B, T, H, Dn+Dv).transpose(1, 2)``."""
    if not (isinstance(kv, fx.Node) and op_kind(kv) == "transpose"
            and {normalize_dim(kv.args[1], 4), normalize_dim(kv.args[2], 4)} == {1, 2}):
        raise NotLatent("the expanded key/value is not a transpose(1, 2) of per-head rows")
    view = kv.args[0]
    if not (isinstance(view, fx.Node) and op_kind(view) == "reshape"):
        raise NotLatent("the per-head rows are not a view of a projection")
    linear = view.args[0]
    if not (isinstance(linear, fx.Node) and linear.op == "call_function" and linear.target in _LINEAR_TARGETS):
        raise NotLatent("the per-head rows do not come from a linear projection (kv_b_proj)")
    latent, weight, bias = arg(linear, 0, "input"), arg(linear, 1, "weight"), arg(linear, 2, "bias")
    if bias is not None:
        raise NotLatent("kv_b_proj has a bias")
    ml, mw, mp, mv = (tensor_meta(x) for x in (latent, weight, linear, view))
    if any(m is None for m in (ml, mw, mp, mv)) or mw.dim() != 2 or mv.dim() != 4 or ml.dim() not in (3, 4):
        raise NotLatent("the projection's input, weight or output is not a tensor of the expected rank")
    if ml.dim() == 4 and not is_unit(ml.shape[1]):
        raise NotLatent(f"the latent {tuple(ml.shape)} is not [B, 1, T, Dc]")
    width = mv.shape[3]
    if not (isinstance(width, int) and same_size(mv.shape[2], heads) and same_size(mp.shape[-1], heads * width)
            and same_size(mv.shape[0], batch) and same_size(mv.shape[1], keys)
            and same_shape(non_unit(mp.shape[:-1]), non_unit(mv.shape[:2]))):
        raise NotLatent(f"the projection's output {tuple(mp.shape)} is not viewed as [B, T={keys}, H={heads}, "
                        f"Dn+Dv] ({tuple(mv.shape)})")
    return latent, weight, width, [kv, view, linear]


def _rope_source(node: Any, batch: Any, keys: Any) -> tuple[fx.Node, list[fx.Node]]:
    """``(kr, nodes)`` for ``kr.expand(B, H, T, Dr)`` (or ``kr`` itself) with kr ``[B, 1, T, Dr]``."""
    nodes = []
    if isinstance(node, fx.Node) and op_kind(node) == "expand":
        nodes, node = [node], node.args[0]
    meta = tensor_meta(node)
    if meta is None or meta.dim() != 4 or not is_unit(meta.shape[1]) or not same_size(meta.shape[0], batch) \
            or not same_size(meta.shape[2], keys):
        raise NotLatent("the rope part of the key is not one [B, 1, T, Dr] rope key expanded over the heads")
    return node, nodes


def _is_size_query(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target in _SIZE_TARGETS) or \
        (node.op == "call_method" and node.target == "size")


def _key_parts(k: fx.Node, nope_dim: int, readers: set[fx.Node]) -> tuple[Any, Any, list[fx.Node]]:
    """``(k_nope, rope, nodes)``: the two last-dim parts k is assembled from (cat or new_empty +
    copies); ``readers``: the attention's nodes that may read k."""
    if k.op == "call_function" and k.target is torch.cat:
        parts, dim = arg(k, 0, "tensors"), arg(k, 1, "dim", 0)
        if normalize_dim(dim, 4) != 3 or not isinstance(parts, (list, tuple)) or len(parts) != 2:
            raise NotLatent("the key is a concatenation, but not of two parts along the last dim")
        return parts[0], parts[1], [k]
    if not (k.op == "call_method" and k.target == "new_empty"):
        raise NotLatent("the key is neither cat((k_nope, k_rope), -1) nor a new_empty buffer filled by copies")
    filled: dict[tuple[Any, Any], Any] = {}
    nodes = [k]
    for user in k.users:
        if user in readers or _is_size_query(user):
            continue
        part = _last_dim_part(user)
        writers = list(user.users)
        if part is None or len(writers) != 1 or not (writers[0].op == "call_method" and writers[0].target == "copy_"
                                                      and writers[0].args[0] is user and not writers[0].users):
            raise NotLatent(f"the key buffer is read or written by {user.name} besides its two copies")
        filled[(part[1], part[2])] = writers[0].args[1]
        nodes += [user, writers[0]]
    total = tensor_meta(k).shape[3]
    nope = filled.pop((0, nope_dim), None)
    rope = filled.pop((nope_dim, None), None)
    rope = filled.pop((nope_dim, total), None) if rope is None else rope
    if nope is None or rope is None or filled:
        raise NotLatent(f"the key buffer is not filled by exactly [..., :{nope_dim}] and [..., {nope_dim}:]")
    return nope, rope, nodes


CACHED_EXPANSION = ("the keys and values are read from a cache of expanded rows (transformers' cache in this "
                    "version keeps kv_b_proj's output): the cached tokens' latent is not in the graph "
                    "(compiler.latent_cache keeps it)")
"""The near miss of an MLA attention over transformers' cache of expanded keys and values."""


def _appended_rows(node: Any) -> tuple[Any, list[fx.Node]]:
    """``(x, [cat])`` for a cache's append ``cat([past, x], dim=-2)`` of 4-D rows whose past is provably
    empty (transformers' ``DynamicLayer`` starts from ``torch.tensor([])``, which ``cat`` skips): the
    rows it returns are x's. NotLatent (``CACHED_EXPANSION``) when the past may hold rows; ``(node, [])``
    for anything else."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is torch.cat):
        return node, []
    parts, dim, meta = arg(node, 0, "tensors"), arg(node, 1, "dim", 0), tensor_meta(node)
    if meta is None or meta.dim() != 4 or normalize_dim(dim, 4) != 2 or not isinstance(parts, (list, tuple)) \
            or len(parts) != 2:
        return node, []
    past = tensor_meta(parts[0])
    if past is not None and ((past.dim() == 1 and same_size(past.shape[0], 0))
                             or (past.dim() == 4 and same_size(past.shape[2], 0))):
        return parts[1], [node]
    raise NotLatent(CACHED_EXPANSION)


def _cached_latent(k: Any, v: Any, heads: int) -> Optional[LatentKV]:
    """The latent form of k, v = ``pulsar_dosa::latent_cached_kv(latent, rope_key, W, H, Dn)``'s outputs
    (``compiler.latent_cache``), or None when they are not that op's keys and values."""
    if not all(isinstance(x, fx.Node) and x.op == "call_function" and x.target is operator.getitem
               for x in (k, v)) or k.args[0] is not v.args[0] or (k.args[1], v.args[1]) != (0, 1) \
            or not isinstance(k.args[0], fx.Node) or op_kind(k.args[0]) != "latent_cached_kv":
        return None
    read = k.args[0]
    latent, rope_key, weight = (arg(read, i, name) for i, name in enumerate(("latent", "rope_key", "kv_b_weight")))
    if arg(read, 3, "heads") != heads:
        raise NotLatent(f"the latent cache expands {arg(read, 3, 'heads')} heads, the attention has {heads}")
    return LatentKV(latent, rope_key, weight, arg(read, 4, "nope_dim"), [k, v, read])


def latent_form(k: Any, v: Any, heads: int, readers: set[fx.Node]) -> LatentKV:
    """The latent form of the attention's k ``[B, H, T, Dn+Dr]`` and v ``[B, H, T, Dv]``; NotLatent
    with the reason when they are not transformers' expansion of one latent (module docstring).
    ``readers``: the attention's nodes that read k (the SDPA call, the eager chain's transpose).

    Through a cache: a latent cache's read (``_cached_latent``) gives its rows; transformers' cache of
    the latent (5.25) is appended to before the expansion, the latent the linear reads; its cache of
    expanded rows (5.17) is appended to after it: the rows of an empty cache's first append are the
    expansion's (``_appended_rows``), and with cached rows the absorbed form has no latent to read."""
    cached = _cached_latent(k, v, heads)
    if cached is not None:
        return cached
    k, k_cat = _appended_rows(k)
    v, v_cat = _appended_rows(v)
    readers = readers | set(k_cat)
    mk = tensor_meta(k)
    if mk is None or mk.dim() != 4 or not isinstance(k, fx.Node):
        raise NotLatent("the key is not a 4-D tensor node")
    batch = mk.shape[0]
    found = _last_dim_part(v)
    if found is None:
        raise NotLatent("the value is not the last-dim part of an expanded projection (split or slice)")
    kv, v_start, v_stop, v_nodes = found
    latent, weight, width, kv_nodes = _expanded_kv(kv, batch, heads, mk.shape[2])
    if not isinstance(v_start, int) or v_stop not in (None, width) or not 0 < v_start < width:
        raise NotLatent(f"the value is columns [{v_start}, {v_stop}) of the {width} per-head rows, not their tail")
    nope_dim = v_start
    k_nope, rope, k_nodes = _key_parts(k, nope_dim, readers)
    nope_part = _last_dim_part(k_nope)
    if nope_part is None or nope_part[0] is not kv or nope_part[1] != 0 or nope_part[2] != nope_dim:
        raise NotLatent(f"the key's first {nope_dim} columns are not the head of the value's projection")
    rope_key, rope_nodes = _rope_source(rope, batch, mk.shape[2])
    mr = tensor_meta(rope_key)
    if not same_size(mk.shape[3], nope_dim + mr.shape[3]):
        raise NotLatent(f"the key's last dim {mk.shape[3]} is not {nope_dim} + the rope key's {mr.shape[3]}")
    if len({tensor_meta(x).dtype for x in (k, v, latent, rope_key, weight)}) != 1:
        raise NotLatent("the latent, the rope key, kv_b_proj's weight and the expanded key/value differ in dtype")
    if k_cat:  # the cache keeps the key buffer: its copies (writes, without users) must stay
        k_nodes = []
    nodes = list(dict.fromkeys(v_cat + k_cat + v_nodes + nope_part[3] + k_nodes + rope_nodes + kv_nodes))
    return LatentKV(latent, rope_key, weight, nope_dim, nodes)
