"""What the backend did: rewrites, near misses, pass times and top-K statistics.

Passes record into :func:`current_report` (one line each: ``report.add_rewrite(...)``,
``report.add_near_miss(...)``). :func:`collecting` makes a fresh report current for a block
(``compiler.explain`` uses it); outside such a block a process-wide report collects everything.
``print(report)`` shows readable tables.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from typing import Any, Iterator, Sequence


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """One replaced subgraph.

    kind: pattern family ("dsa_indexer", "sparse_attention", "attention"); module: module path of the matched code
    (from ``nn_module_stack``, e.g. "model.layers.0.self_attn.indexer"); variant: the pattern variant
    that matched; shapes: operand name -> shape as strings (symbolic sizes kept); path: the execution
    path chosen for the op; r: retained heads (None = the op's default rule); compile_index: which
    backend invocation produced it.
    """

    kind: str
    module: str
    variant: str
    shapes: dict[str, tuple[str, ...]]
    path: str
    r: int | None
    compile_index: int
    details: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class NearMissRecord:
    """A candidate left untouched (a ``compiler.passes.base.NearMiss``, or an unsupported form):
    kind, module path, the reason, and the anchor node's name."""

    kind: str
    module: str
    reason: str
    node: str
    compile_index: int


@dataclasses.dataclass
class Report:
    """Everything recorded while the report was current. ``stats`` maps layer -> statistics summary;
    ``guard`` maps layer -> the runtime guard's state per call-shape bucket (``compiler.ops.guard``);
    ``compiled``/``output`` are set by ``compiler.explain`` (the compiled callable, its output)."""

    rewrites: list[Rewrite] = dataclasses.field(default_factory=list)
    near_misses: list[NearMissRecord] = dataclasses.field(default_factory=list)
    pass_times: list[tuple[int, str, float]] = dataclasses.field(default_factory=list)
    compiles: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    counters: Counter = dataclasses.field(default_factory=Counter)
    stats: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    guard: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    compiled: Any = None
    output: Any = None

    @property
    def compile_index(self) -> int:
        """Index of the backend invocation being recorded (the latest started one)."""
        return len(self.compiles) - 1

    def begin_compile(self, **info: Any) -> None:
        """Start recording one backend invocation; ``info`` (options uuid, downstream, ...) is kept."""
        self.compiles.append(dict(info))

    def add_rewrite(self, kind: str, module: str, *, variant: str, shapes: dict[str, Sequence[Any]],
                    path: str, r: int | None = None, **details: Any) -> Rewrite:
        entry = Rewrite(kind, module, variant, {k: tuple(str(s) for s in v) for k, v in shapes.items()},
                        path, r, self.compile_index, dict(details))
        self.rewrites.append(entry)
        self.counters[f"{kind}.rewritten"] += 1
        self.counters[f"{kind}.variant.{variant}"] += 1
        return entry

    def add_near_miss(self, kind: str, module: str, reason: str, node: str = "") -> NearMissRecord:
        entry = NearMissRecord(kind, module, reason, node, self.compile_index)
        self.near_misses.append(entry)
        self.counters[f"{kind}.near_miss"] += 1
        return entry

    def add_pass_time(self, name: str, seconds: float) -> None:
        self.pass_times.append((self.compile_index, name, seconds))

    def fallback_totals(self) -> dict[str, int]:
        """Fallback reason -> count, summed over layers (from ``stats``)."""
        totals: Counter = Counter()
        for summary in self.stats.values():
            for reason, count in summary.get("fallbacks", {}).items():
                totals[reason] += int(count)
        return dict(totals)

    def _pruned_cell(self, rewrite: Rewrite) -> str:
        """'predicted/measured' pruned fraction of a rewrite's layer ('-' where unknown)."""
        predicted = rewrite.details.get("predicted_pruned_frac")
        layer_stats = self.stats.get(rewrite.module, {})
        measured = layer_stats.get("pruned_frac") if layer_stats.get("keys_screened", 0) > 0 else None
        if predicted is None and measured is None:
            return "-"
        return "/".join("-" if x is None else f"{x:.3f}" for x in (predicted, measured))

    def __str__(self) -> str:
        parts = [f"pulsar_dosa report: {len(self.compiles)} compile(s), {len(self.rewrites)} rewrite(s), "
                 f"{len(self.near_misses)} near miss(es)"]
        if self.rewrites:
            parts.append(format_table(
                ["#", "kind", "module", "variant", "path", "r", "min_keys", "pruned pred/meas", "shapes"],
                [[r.compile_index, r.kind, r.module, r.variant, r.path, "default" if r.r is None else r.r,
                  r.details.get("min_keys", "-"), self._pruned_cell(r),
                  " ".join(f"{k}[{','.join(v)}]" for k, v in r.shapes.items())] for r in self.rewrites]))
        if self.near_misses:
            parts.append(format_table(["#", "kind", "module", "node", "reason"],
                                      [[m.compile_index, m.kind, m.module, m.node, m.reason]
                                       for m in self.near_misses]))
        if self.pass_times:
            parts.append(format_table(["#", "pass", "ms"],
                                      [[i, name, f"{1e3 * s:.2f}"] for i, name, s in self.pass_times]))
        if self.stats:
            keys = sorted({k for s in self.stats.values() for k, v in s.items() if not isinstance(v, dict)})
            parts.append(format_table(["layer", *keys, "fallbacks"],
                                      [[layer, *[_fmt(s.get(k, "")) for k in keys],
                                        ", ".join(f"{r}={n}" for r, n in s.get("fallbacks", {}).items() if n)
                                        or "-"] for layer, s in self.stats.items()]))
            totals = self.fallback_totals()
            parts.append("fallbacks (queries answered densely), all layers: "
                         + (", ".join(f"{r}={n}" for r, n in totals.items() if n) or "none"))
        if self.guard:
            parts.append("runtime guard (measured ms per 1e9 query-key pairs; the faster path is kept):\n" + format_table(
                ["layer", "device", "queries<=", "keys<=", "path", "rung", "certified calls", "dense calls", "retries",
                 "certified ms", "dense ms"],
                [[layer, g["device"], g["queries_bucket"], g["keys_bucket"], g["path"], rung_label(g), g["certified_calls"],
                  g["dense_calls"], g["retries"], _fmt(g["certified_ms_per_Gpair"]), _fmt(g["dense_ms_per_Gpair"])]
                 for layer, states in self.guard.items() for g in states]))
        return "\n\n".join(parts)


def rung_label(state: dict[str, Any]) -> str:
    """A guard bucket's rung (``Guard.summaries()``): "-" on the layer's own settings, else the
    rung's r and list size."""
    return f"r={state['r']} lists of {state['list_queries']}" if state.get("rung") else "-"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with aligned columns."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


_PROCESS_REPORT = Report()
_STACK: list[Report] = []


def current_report() -> Report:
    """The report passes record into: the innermost :func:`collecting` block's, else the process-wide one."""
    return _STACK[-1] if _STACK else _PROCESS_REPORT


@contextlib.contextmanager
def collecting(report: Report | None = None) -> Iterator[Report]:
    """Make ``report`` (a fresh one by default) current inside the block."""
    report = Report() if report is None else report
    _STACK.append(report)
    try:
        yield report
    finally:
        _STACK.pop()
