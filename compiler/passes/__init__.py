"""The pass list and the pass manager.

A pass family is a :class:`compiler.passes.base.PatternPass` (one module each) that detects its
patterns on the Dynamo (torch-level) graph and rewrites the safe ones; the contract, the error
policy and the counters are in ``compiler/passes/base.py``. Adding a family is one line in
:data:`PASS_FAMILIES` (order = run order). A pass never computes tensors; it only edits the graph.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch.fx as fx

from compiler.passes import attention, dsa_indexer, sparse_attention
from compiler.passes.base import PassContext, PatternPass, run_pattern_pass

if TYPE_CHECKING:  # annotations only: the options module imports this one, not the reverse
    from compiler.options import CompileOptions
    from compiler.report import Report

PASS_FAMILIES: dict[str, PatternPass] = {
    dsa_indexer.KIND: dsa_indexer.IndexerPass(),
    sparse_attention.KIND: sparse_attention.SparseAttentionPass(),
    attention.KIND: attention.AttentionPass(),
}


def run_passes(gm: fx.GraphModule, options: CompileOptions, report: Report,
               cuda_graphs: bool = False) -> fx.GraphModule:
    """Run the enabled families in list order on ``gm`` (in place), time each one, lint and recompile;
    ``cuda_graphs``: the downstream compiler will replay the graph from CUDA graphs."""
    ctx = PassContext(gm, options, report, cuda_graphs)
    for name in options.enabled_passes(tuple(PASS_FAMILIES)):
        start = time.perf_counter()
        run_pattern_pass(ctx, PASS_FAMILIES[name])
        report.add_pass_time(name, time.perf_counter() - start)
    gm.graph.lint()
    gm.recompile()
    return gm
