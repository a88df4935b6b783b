"""``compiler.explain``: compile a model with the backend, run it once, return what was done."""
from __future__ import annotations

import logging
from typing import Any, Mapping

import torch

from compiler.backend import pulsar_dosa
from compiler.ops.stats import TOPK_STATS
from compiler.options import CompileOptions
from compiler.ops.guard import GUARD
from compiler.report import Report, collecting

logger = logging.getLogger(__name__)


def explain(model: torch.nn.Module, *args: Any, options: Mapping[str, Any] | None = None,
            dynamic: bool | None = None, **kwargs: Any) -> Report:
    """Compile ``model`` with ``backend="pulsar_dosa"`` and ``options``, call it once on ``args``/``kwargs``
    (under ``torch.no_grad``) and return the :class:`~compiler.report.Report`: ``rewrites``,
    ``near_misses``, pass times, per-layer top-K statistics of this run (``stats``) and the runtime
    guard's path per layer and call shape (``guard``; the guard starts afresh).

    ``dynamic`` is torch.compile's. The compiled callable is ``report.compiled``, its output
    ``report.output``.

    Process-wide effects: it calls ``torch._dynamo.reset()`` first, so that the graph is captured
    afresh; that drops Dynamo's compiled code of *every* function in the process (each
    recompiles on its next call), and it resets the top-K statistics (``TOPK_STATS``).

    ``model`` (any callable torch.compile takes), ``options`` and ``dynamic`` (None or a bool) are
    checked first, before any of that: TypeError/ValueError naming the argument.
    """
    if not callable(model):
        raise TypeError(f"model: expected a torch.nn.Module or another callable, got {type(model).__name__}")
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"dynamic: expected None, True or False (torch.compile's), got {dynamic!r}")
    opts = CompileOptions.from_user(options)

    def backend(gm, example_inputs):
        return pulsar_dosa(gm, example_inputs, options=opts)

    torch._dynamo.reset()
    TOPK_STATS.reset()
    GUARD.reset()
    with collecting() as report:
        compiled = torch.compile(model, backend=backend, dynamic=dynamic)
        with torch.no_grad():
            output = compiled(*args, **kwargs)
    report.stats = TOPK_STATS.summaries() if opts.record_stats else {}
    report.guard = GUARD.summaries()
    for reason, count in report.fallback_totals().items():
        if count:
            logger.info("%d queries fell back to dense scoring (%s)", count, reason)
    report.compiled = compiled
    report.output = output
    return report
