"""pulsar-dosa compiler: the ``pulsar_dosa`` torch.compile backend, its passes and custom ops.

``import compiler`` registers ``torch.ops.pulsar_dosa.certified_topk`` (also ``compiler.certified_topk``);
``compiler.certified_topk_cp`` is its form over keys sharded across ranks (torch.distributed).
``torch.compile(model, backend="pulsar_dosa")`` works without importing anything (entry point).
Docstrings cite formulas as "SPEC A.3" (section A.3 of ``docs/SPEC.md``); the architecture is in
``docs/DESIGN.md``.
"""
__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

from compiler.ops import certified_topk
from compiler.certified_topk_cp import certified_topk_cp
from compiler.options import CompileOptions
from compiler.report import Report, current_report
from compiler.explain import explain

__all__ = ["__version__", "certified_topk", "certified_topk_cp", "CompileOptions", "Report", "current_report", "explain"]
