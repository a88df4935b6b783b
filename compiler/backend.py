"""The ``pulsar_dosa`` torch.compile backend (entry point group ``torch_dynamo_backends``).

``torch.compile(model, backend="pulsar_dosa", options={...})`` calls
``pulsar_dosa(gm, example_inputs, options={...})`` for every graph Dynamo captures (and again on
each recompilation, e.g. with ``dynamic=True`` when a new shape needs one). The backend validates
the options, runs the enabled passes on the torch-level graph, records what it did in
``compiler.report.current_report()`` and hands the graph to the downstream compiler. A graph captured while
a Pulsar layout is active (inside ``runtime.pulsar.generate``) whose attention ops are fed a mask
computed in the graph is compiled a second time without that mask, for the calls made under a
layout (``compiler.layout_variant``); graphs captured elsewhere are compiled once, as before.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.fx as fx

from compiler.layout_variant import LayoutDispatch, without_attention_masks
from compiler.options import CompileOptions
from compiler.passes import run_passes
from compiler.report import current_report
from runtime.attention_layout import active_layout

logger = logging.getLogger(__name__)


def pulsar_dosa(gm: fx.GraphModule, example_inputs: Sequence[Any],
                options: CompileOptions | Mapping[str, Any] | None = None, mode: str | None = None) -> Callable:
    """Rewrite ``gm`` with the enabled passes, then compile it with ``options['downstream']``.

    ``mode`` is torch.compile's ``mode``. torch.compile passes it only when no ``options`` are given
    (it refuses both at once), so it always reaches the default downstream, inductor; the eager and
    tensorrt downstreams, reachable only through ``options``, never see one.
    """
    opts = CompileOptions.from_user(options)
    report = current_report()
    report.begin_compile(options_uuid=opts.uuid(), downstream=opts.downstream,
                         nodes=len(gm.graph.nodes))
    logger.debug("compile %d: %d nodes, downstream %s, options %s", report.compile_index, len(gm.graph.nodes),
                 opts.downstream, opts.uuid()[:12])
    run_passes(gm, opts, report, cuda_graphs=replays_cuda_graphs(opts.downstream, mode))
    plain = compile_downstream(gm, example_inputs, opts.downstream, mode)
    variant = without_attention_masks(gm) if opts.downstream != "tensorrt" and active_layout() is not None else None
    if variant is None:
        return plain
    report.compiles[-1]["layout_variant_nodes"] = len(variant.graph.nodes)
    return LayoutDispatch(plain, compile_downstream(variant, example_inputs, opts.downstream, mode))


def _mode_patches(mode: str | None) -> dict:
    """Inductor's config patches of torch.compile's ``mode`` (none for the default mode)."""
    return torch._inductor.list_mode_options(mode) if mode not in (None, "default") else {}


def replays_cuda_graphs(downstream: str, mode: str | None) -> bool:
    """Whether the compiled graph is replayed from CUDA graphs: inductor with a mode that turns
    them on ("reduce-overhead", "max-autotune") or with ``torch._inductor.config.triton.cudagraphs``."""
    if downstream != "inductor":
        return False
    from torch._inductor import config

    return bool(_mode_patches(mode).get("triton.cudagraphs", config.triton.cudagraphs))


def compile_downstream(gm: fx.GraphModule, example_inputs: Sequence[Any], downstream: str,
                       mode: str | None = None) -> Callable:
    """Compile the rewritten graph with inductor, run it as is (eager), or hand it to torch-tensorrt."""
    if downstream == "eager":
        return gm.forward
    if downstream == "inductor":
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs, config_patches=_mode_patches(mode))
    if downstream == "tensorrt":
        import torch_tensorrt  # noqa: F401  (registers the "tensorrt" Dynamo backend)

        return torch._dynamo.lookup_backend("tensorrt")(gm, example_inputs)
    raise ValueError(f"downstream: expected 'inductor', 'eager' or 'tensorrt', got {downstream!r}")
