"""The contract of every pass family, and its one error policy.

A family is a :class:`PatternPass`; :func:`run_pattern_pass` drives it in two phases. Match, on the
unmodified graph: ``anchors(graph)`` lists candidate nodes, ``analyse`` computes what every match
shares, ``match(anchor, analysis)`` returns a match (``anchor``, ``interior``, ``operand_nodes``)
or raises ``NotCandidate`` (counted) or ``NearMiss`` (reported with the reason). Rewrite, each match
in turn: ``settings(ctx, match)`` reads the compile-time choices or raises :class:`Declined` (the
stock form is faster there: a near miss); ``rewrite`` inserts the replacement before the anchor
without touching existing nodes; the runner reroutes the anchor's users, erases the dead region and
records ``describe(...)``. Error policy: an unexpected exception while matching or rewriting becomes
a near miss ("unsupported form: ..." / "rewrite failed: ...", inserted nodes erased) and compilation
goes on; errors of ``settings`` (a plan for another model) propagate. Counters per family kind:
``anchors``, ``not_candidate``, ``near_miss``, ``unsupported``, ``declined``, ``rewritten``,
``variant.<name>`` (``report.counters``)."""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Iterable, Protocol

import torch.fx as fx

from compiler.passes.matcher import NearMiss, NotCandidate, erase_dead_pure, module_path

if TYPE_CHECKING:
    from compiler.options import CompileOptions
    from compiler.report import Report

logger = logging.getLogger(__name__)


class Declined(Exception):
    """A safe match the family leaves as it is on purpose (its ``settings`` found that the stock
    form is faster there): reported as a near miss with the reason, counted as ``declined``."""


@dataclasses.dataclass
class PassContext:
    """What a pass sees: the graph module it edits, the validated options, the report it records into."""

    gm: fx.GraphModule
    options: CompileOptions
    report: Report
    cuda_graphs: bool = False
    """The compiled graph will be replayed from CUDA graphs (per-call host costs are paid once)."""


class Match(Protocol):
    """What the runner needs of a match: the anchor the replacement stands in for, the interior
    nodes that die with it, and operand-side nodes (views, casts) that may become dead."""

    anchor: fx.Node
    interior: list[fx.Node]
    operand_nodes: list[fx.Node]


class PatternPass:
    """One pass family (module docstring). Subclasses set ``kind`` and implement the methods."""

    kind: str = ""

    def anchors(self, graph: fx.Graph) -> list[fx.Node]:
        """The candidate nodes, in graph order."""
        raise NotImplementedError

    def analyse(self, graph: fx.Graph, anchors: list[fx.Node]) -> Any:
        """What every match shares, computed once on the unmodified graph (None by default)."""
        return None

    def match(self, anchor: fx.Node, analysis: Any) -> Match:
        """The safe region ending at ``anchor``; raises NotCandidate or NearMiss."""
        raise NotImplementedError

    def settings(self, ctx: PassContext, match: Match) -> Any:
        """Compile-time choices for the replacement (None by default)."""
        return None

    def rewrite(self, ctx: PassContext, match: Match, settings: Any) -> fx.Node:
        """Insert the replacement before ``match.anchor`` and return it; existing nodes stay as they are."""
        raise NotImplementedError

    def describe(self, match: Match, settings: Any, node: fx.Node) -> dict[str, Any]:
        """Keyword arguments of ``report.add_rewrite`` besides kind and module (variant, shapes, path, ...)."""
        raise NotImplementedError


def _unsupported(ctx: PassContext, family: PatternPass, anchor: fx.Node | None, what: str,
                 error: Exception) -> None:
    reason = f"{what}: {type(error).__name__}: {error}"
    logger.debug("%s pass: %s at %s", family.kind, reason, anchor, exc_info=error)
    ctx.report.counters[f"{family.kind}.unsupported"] += 1
    near_miss(ctx, family.kind, anchor, reason)


def near_miss(ctx: PassContext, kind: str, anchor: fx.Node | None, reason: str) -> None:
    """Record a candidate left untouched (``anchor`` None: the whole graph)."""
    module = "" if anchor is None else module_path(anchor)
    logger.info("%s near miss at %s: %s", kind, module or (anchor.name if anchor is not None else "graph"), reason)
    ctx.report.add_near_miss(kind, module, reason, "" if anchor is None else anchor.name)


def erase_dead(graph: fx.Graph, nodes: Iterable[fx.Node]) -> None:
    """Erase every node of ``nodes`` left without users, until none is left to erase (any order)."""
    pending = [n for n in dict.fromkeys(nodes) if isinstance(n, fx.Node) and n.graph is graph]
    while True:
        dead = [n for n in pending if not n.users]
        if not dead:
            return
        for n in dead:
            graph.erase_node(n)
            pending.remove(n)


def _replace(graph: fx.Graph, match: Match, node: fx.Node) -> None:
    """Reroute the anchor's users to ``node``, then erase the region's dead nodes."""
    match.anchor.replace_all_uses_with(node)
    erase_dead(graph, [match.anchor, *match.interior])
    erase_dead_pure(graph, match.operand_nodes)


def run_pattern_pass(ctx: PassContext, family: PatternPass) -> None:
    """Match every anchor of ``ctx.gm``'s graph, then rewrite the matches (module docstring)."""
    graph = ctx.gm.graph
    counters = ctx.report.counters
    try:
        anchors = family.anchors(graph)
        analysis = family.analyse(graph, anchors)
    except Exception as error:  # the error policy: never crash compilation
        _unsupported(ctx, family, None, "unsupported graph", error)
        return
    matches = []
    for anchor in anchors:
        counters[f"{family.kind}.anchors"] += 1
        try:
            matches.append(family.match(anchor, analysis))
        except NotCandidate:
            counters[f"{family.kind}.not_candidate"] += 1
        except NearMiss as miss:
            near_miss(ctx, family.kind, anchor, str(miss))
        except Exception as error:  # the error policy: never crash compilation
            _unsupported(ctx, family, anchor, "unsupported form", error)
    for match in matches:
        try:
            settings = family.settings(ctx, match)
        except Declined as why:
            counters[f"{family.kind}.declined"] += 1
            near_miss(ctx, family.kind, match.anchor, str(why))
            continue
        before = set(graph.nodes)
        try:
            node = family.rewrite(ctx, match, settings)
        except Exception as error:  # the error policy: never crash compilation
            erase_dead(graph, [n for n in graph.nodes if n not in before])
            _unsupported(ctx, family, match.anchor, "rewrite failed", error)
            continue
        module = module_path(match.anchor)
        _replace(graph, match, node)
        logger.info("%s rewrite at %s", family.kind, module or node.name)
        ctx.report.add_rewrite(family.kind, module, **family.describe(match, settings, node))
