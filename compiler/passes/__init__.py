"""The pass list and the pass manager.

A pass family is a :class:`compiler.passes.base.PatternPass` (one module each) that detects its
patterns on the Dynamo (torch-level) graph and rewrites the safe ones; the contract, the error
policy and the counters are in ``compiler/passes/base.py``, the matchers they share in
``compiler/passes/matcher.py``. No pass imports another. A family is named in
``compiler.options.PASS_FAMILIES`` (the names a user may give, in run order) and listed in
:data:`PASSES`. A pass never computes tensors; it only edits the graph.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch.fx as fx

from compiler.passes.attention import AttentionPass
from compiler.passes.base import PassContext, PatternPass, run_pattern_pass
from compiler.passes.dsa_indexer import IndexerPass
from compiler.passes.dsa_mask import MaskPass
from compiler.passes.selection_order import set_selections_unsorted
from compiler.passes.dsa_sparse_attention import SparseAttentionPass

if TYPE_CHECKING:
    from compiler.options import CompileOptions
    from compiler.report import Report

PASSES: dict[str, PatternPass] = {p.kind: p for p in (IndexerPass(), SparseAttentionPass(), AttentionPass(), MaskPass())}
"""Every pass family by its kind (the names of ``compiler.options.PASS_FAMILIES``)."""


def run_passes(gm: fx.GraphModule, options: CompileOptions, report: Report,
               cuda_graphs: bool = False) -> fx.GraphModule:
    """Run the enabled families in list order on ``gm`` (in place), time each one, then let indexer
    ops whose selection is read as a set skip its sort (``selection_order``), lint and recompile;
    ``cuda_graphs``: the downstream compiler will replay the graph from CUDA graphs."""
    ctx = PassContext(gm, options, report, cuda_graphs)
    for name in options.enabled_passes():
        start = time.perf_counter()
        run_pattern_pass(ctx, PASSES[name])
        report.add_pass_time(name, time.perf_counter() - start)
    report.counters["dsa_indexer.unsorted"] += set_selections_unsorted(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return gm
