"""The pass list and the pass manager.

A pass family is one function ``run(ctx: PassContext) -> None`` that detects its patterns on the
Dynamo (torch-level) graph, rewrites the safe ones and records rewrites and near misses in
``ctx.report``. Adding a family is one line in :data:`PASS_FAMILIES` (order = run order).
A pass never computes tensors; it only edits the graph.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import torch.fx as fx

from compiler.options import CompileOptions
from compiler.passes import attention, dsa_indexer, sparse_attention
from compiler.report import Report


@dataclasses.dataclass
class PassContext:
    """What a pass sees: the graph module it edits, the validated options, the report it records into."""

    gm: fx.GraphModule
    options: CompileOptions
    report: Report


PASS_FAMILIES: dict[str, Callable[[PassContext], None]] = {
    dsa_indexer.KIND: dsa_indexer.run,
    sparse_attention.KIND: sparse_attention.run,
    attention.KIND: attention.run,
}


def run_passes(gm: fx.GraphModule, options: CompileOptions, report: Report) -> fx.GraphModule:
    """Run the enabled families in list order on ``gm`` (in place), time each one, lint and recompile."""
    ctx = PassContext(gm, options, report)
    for name in options.enabled_passes(tuple(PASS_FAMILIES)):
        start = time.perf_counter()
        PASS_FAMILIES[name](ctx)
        report.add_pass_time(name, time.perf_counter() - start)
    gm.graph.lint()
    gm.recompile()
    return gm
