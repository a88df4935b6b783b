"""How ``anchors.py`` runs one variant of a case: the memory guard, the first call and its check,
the timed calls, the deadline and the anchors' loading.

``run_variant(fn, check, need_bytes, device, reps, warmup)``: skipped with the reason when
``need_bytes`` more than the device has free would be needed; else the first call (its wall time,
which includes compilation), ``check(out)``'s fields (errors against a reference), then
``harness.measure``'s median of ``reps`` calls after ``warmup``; with ``host_and_graph`` also the
host's time to issue one call on an idle device (``issue_ms``) and the call's device time replayed
from a CUDA graph (``graph_ms``; None off CUDA, ``graph_error`` where the call cannot be captured),
which split a host-bound call's time into what the host and what the device spend. An exception in
any of these is recorded in the variant's result (``error``), never raised: one variant's failure
leaves the others.
``run_variants`` runs a case's variants in turn, ``ratios`` divides their times; ``load_anchor``
imports a built anchor from its build folder, or says why it could not.
"""
from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks import harness

FREE_FRACTION = 0.92
"""A variant or case runs only when what it needs is at most this fraction of the free memory."""


class Deadline:
    """Epoch seconds after which no new case starts (None: none)."""

    def __init__(self, budget_s: float | None):
        if budget_s is not None and budget_s <= 0:
            raise ValueError(f"budget_s must be positive or None, got {budget_s!r}")
        self.start = time.time()
        self.at = None if budget_s is None else self.start + budget_s

    def passed(self) -> bool:
        return self.at is not None and time.time() > self.at

    def elapsed(self) -> float:
        return time.time() - self.start


def memory_shortfall(need_bytes: int, device: torch.device | str) -> str | None:
    """Why ``need_bytes`` more would not fit on a CUDA device (None where they fit, and off CUDA)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    if need_bytes <= FREE_FRACTION * free:
        return None
    return f"needs about {need_bytes / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"


def host_and_graph_ms(fn: Callable[[], Any], device: torch.device | str, reps: int) -> dict:
    """``issue_ms`` (median host ms to issue one call of ``fn`` on an idle device) and ``graph_ms``
    (median device ms of one call replayed from a CUDA graph, None off CUDA), or ``graph_error`` with
    the reason where the call cannot be captured."""
    out: dict[str, Any] = {"issue_ms": harness.issue_ms(fn, device, reps)}
    try:
        out["graph_ms"] = harness.graph_ms(fn, device, reps)
    except Exception as exc:  # recorded: a call that does not capture (an anchor's host synchronisation)
        out["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return out


def run_variant(fn: Callable[[], Any], check: Callable[[Any], dict], need_bytes: int, device: torch.device | str,
                reps: int, warmup: int = 1, host_and_graph: bool = False) -> dict:
    """One variant's result (module docstring): ``skipped``, ``error``, or ``first_call_s``, the
    check's fields, ``ms`` (median), ``ms_min``, ``ms_max``, ``reps`` (and with ``host_and_graph``
    ``host_and_graph_ms``'s fields)."""
    shortfall = memory_shortfall(need_bytes, device)
    if shortfall is not None:
        return {"skipped": shortfall}
    out = None
    try:
        harness.synchronize(device)
        start = time.perf_counter()
        out = fn()
        harness.synchronize(device)
        result = {"first_call_s": round(time.perf_counter() - start, 3), **check(out)}
        out = None
        timing = harness.measure(fn, device, reps, warmup=warmup)
        result.update(ms=timing.ms, ms_min=min(timing.times), ms_max=max(timing.times), reps=len(timing.times))
        del timing  # its last output: released before the cache is emptied
        if host_and_graph:
            result.update(host_and_graph_ms(fn, device, reps))
        return result
    except Exception as exc:  # recorded: out of memory, a launch or an anchor's own error
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
    finally:
        out = None
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()


Calls = dict[str, tuple[Callable[[], Any] | None, str, int]]
"""{variant: (call, kind of output, extra bytes it allocates)}; a None call's kind says why it has none."""


def run_variants(calls: Calls, check: Callable[[str, Any], dict], device: torch.device | str, reps: int, warmup: int,
                 flops: float, rate_key: str, before: Callable[[], None] = lambda: None,
                 host_and_graph: bool = False) -> dict:
    """{variant: ``run_variant``'s result} (``check(kind, out)``), a None call ``skipped`` with its
    reason; ``rate_key``: flops / ms / 1e9. ``before()`` runs ahead of each variant."""
    results = {}
    for name, (fn, kind, extra) in calls.items():
        if fn is None:
            results[name] = {"skipped": kind}
            continue
        before()
        result = run_variant(fn, lambda out, k=kind: check(k, out), extra, device, reps, warmup, host_and_graph)
        if "ms" in result:
            result[rate_key] = flops / result["ms"] / 1e9
        results[name] = result
    return results


def ratios(results: dict, pairs: dict[str, tuple[str, str]], field: str = "ms") -> dict:
    """{key: ``field`` of a / ``field`` of b} for each ``key: (a, b)`` of ``pairs`` where both variants
    have it (a time in ms, not None)."""
    ms = {name: r[field] for name, r in results.items() if r.get(field) is not None}
    return {key: ms[a] / ms[b] for key, (a, b) in pairs.items() if a in ms and b in ms}


def load_anchor(build_dir: str | Path | None, folder: str, module: str) -> tuple[Any, str | None]:
    """(the module, None) imported from ``build_dir/folder`` (put first on sys.path), or (None, why not)."""
    if build_dir is None:
        return None, "not loaded (no --anchors-build)"
    path = Path(build_dir) / folder
    if not path.is_dir():
        return None, f"not built: {path} does not exist"
    sys.path.insert(0, str(path))
    try:
        return importlib.import_module(module), None
    except Exception as exc:  # recorded: a build that does not import
        return None, f"import failed: {type(exc).__name__}: {str(exc)[:300]}"


def upstream_commit(build_dir: str | Path | None, folder: str) -> str | None:
    """The anchor's upstream commit (its UPSTREAM_COMMIT file in the build folder), or None."""
    if build_dir is None:
        return None
    path = Path(build_dir) / folder / "UPSTREAM_COMMIT"
    return path.read_text().strip() if path.is_file() else None
