"""What every benchmark shares: timing, the correctness check, the results header, the table.

``measure(fn, device, reps)`` times ``reps`` calls after ``warmup`` calls: by default the device
time of each call by CUDA events around it (the work it queues), with ``host_paced`` the wall time
of each synchronised call (host work included); off CUDA the host clock (``clock``). It returns the
median, every call's time, the peak extra CUDA memory and the last result. ``loop_ms`` (calls back
to back) and ``graph_ms`` (a CUDA-graph replay) bracket a call's host and device time;
``ceilings`` measures the device's limits. ``identical`` is the bitwise check of results.
``header(device, **fields)`` starts a results document: the device's name and the software
versions. ``markdown_table`` / ``rows_table`` render the readable table, ``write_results`` writes
the JSON with its table beside it as ``.md`` and prints the table.
"""
from __future__ import annotations

import importlib.metadata
import json
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch


@dataclass
class Timing:
    """``ms``: the median of ``times`` (ms per call); ``peak_gib``: peak CUDA memory above what was
    allocated before the timed calls (None off CUDA); ``out``: the last call's result."""

    ms: float
    times: list[float]
    peak_gib: float | None
    out: Any


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (nothing to wait for off CUDA)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


GUARD_SETTLE_CALLS = 16
"""Most untimed calls ``settle_guard`` makes before giving up on a verdict."""


def settle_guard(fn: Callable[[], Any], device: torch.device | str, at_least: int = 1,
                 layer: str | None = None) -> int:
    """Call ``fn`` (synchronising after each call, so that the runtime guard reads every verdict on
    the next) at least ``at_least`` times and until every bucket of ``compiler.ops.guard.GUARD``
    (of ``layer`` only, when given) has decided its path (its warm-ups, trials and rungs), at most
    GUARD_SETTLE_CALLS times; returns the calls made."""
    from compiler.ops.guard import GUARD

    for calls in range(1, GUARD_SETTLE_CALLS + 1):
        fn()
        synchronize(device)
        states = GUARD.summaries()
        buckets = [b for name, bs in states.items() if layer is None or name == layer for b in bs]
        if calls >= at_least and all(b["path"] != "undecided" for b in buckets):
            return calls
    return GUARD_SETTLE_CALLS


def measure(fn: Callable[[], Any], device: torch.device | str = "cuda", reps: int = 5, *, warmup: int = 1,
            host_paced: bool = False, budget_s: float | None = None, min_reps: int = 2,
            before: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Time ``reps`` calls of ``fn`` after ``warmup`` untimed ones (module docstring). ``budget_s``:
    stop once ``min_reps`` calls are timed and the budget is spent; ``before()`` runs untimed ahead
    of every timed call (e.g. a barrier)."""
    cuda = torch.device(device).type == "cuda"
    out = None
    for _ in range(warmup):
        out = fn()
    synchronize(device)
    if cuda:
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    times: list[float] = []
    stop = None if budget_s is None else time.perf_counter() + budget_s
    while len(times) < reps and (stop is None or len(times) < min_reps or time.perf_counter() < stop):
        before()
        out = None
        if cuda and not host_paced:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            tick = time.perf_counter if cuda else clock
            synchronize(device)
            t0 = tick()
            out = fn()
            synchronize(device)
            times.append((tick() - t0) * 1e3)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else None
    return Timing(statistics.median(times), times, peak, out)


def median_ms(fn: Callable[[], Any], reps: int, device: torch.device | str = "cuda") -> float:
    """``measure(fn, device, reps, warmup=0).ms``: the median device time of ``reps`` calls."""
    return measure(fn, device, reps, warmup=0).ms


def loop_ms(fn: Callable[[], Any], device: torch.device | str = "cuda", calls: int = 100) -> float:
    """Wall ms per call of ``calls`` calls back to back after one warm-up call, one synchronisation at
    the end: the pace of a loop without CUDA graphs when the host, not the device, sets it."""
    fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3 / calls


def host_profile(fn: Callable[[], Any], device: torch.device | str = "cuda", calls: int = 50,
                 top: int = 10) -> dict[str, Any]:
    """Where the host's time to issue a call of ``fn`` goes: ``calls`` calls under cProfile (after
    one warm-up call, the device synchronised before and after), ``us_per_call`` the profiled host
    µs a call, and ``functions`` the ``top`` functions by their own time, each {"function":
    "file:line(name)" (paths from the package root or site-packages), "own_us", "cum_us" (µs a
    call), "per_call" (times it runs a call)}. The profiler's own cost inflates every figure alike."""
    import cProfile
    import pstats

    fn()
    synchronize(device)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    elapsed = time.perf_counter() - start
    synchronize(device)
    root = str(Path(__file__).resolve().parents[1]) + "/"
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (primitive calls, calls, own s, cum s, callers)}
    ranked = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    return {"us_per_call": round(elapsed / calls * 1e6, 1),
            "functions": [{"function": f"{file.replace(root, '').split('site-packages/')[-1]}:{line}({name})",
                           "own_us": round(own / calls * 1e6, 1), "cum_us": round(cum / calls * 1e6, 1),
                           "per_call": round(n / calls, 2)}
                          for (file, line, name), (_, n, own, cum, _) in ranked]}


def issue_ms(fn: Callable[[], Any], device: torch.device | str = "cuda", reps: int = 5) -> float:
    """Host ms to issue one call of ``fn`` (the median of ``reps``, each started on an idle device
    and not waited for): above the call's device time, the host sets its pace."""
    times = []
    for _ in range(reps):
        synchronize(device)
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    synchronize(device)
    return statistics.median(times)


def graph_ms(fn: Callable[[], Any], device: torch.device | str = "cuda", reps: int = 20) -> float | None:
    """Device ms of one call replayed from a CUDA graph (captured after a warm-up call): no host
    time. None off CUDA."""
    if torch.device(device).type != "cuda":
        return None
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return median_ms(graph.replay, reps)


def kernel_breakdown(fn: Callable[[], Any], top: int = 12) -> dict[str, Any]:
    """GPU time per kernel name (ms) of one call of fn, from torch.profiler, largest first."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    per = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0)
        if t > 0:
            per[e.key[:80]] = per.get(e.key[:80], 0.0) + t / 1e3
    items = sorted(per.items(), key=lambda kv: -kv[1])
    return {"total_ms": sum(per.values()), "kernels": items[:top]}


def ceilings(device: torch.device | str = "cuda") -> dict[str, float]:
    """The device's limits measured in the same run: copy bandwidth (read + write of 2 GiB) and the
    bf16 matmul rate (8192^3, random data); empty off CUDA."""
    if torch.device(device).type != "cuda":
        return {}
    x = torch.empty(2 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    copy = measure(lambda: y.copy_(x), device, reps=5).ms
    del x, y
    a, b = (torch.randn(8192, 8192, device=device, dtype=torch.bfloat16) for _ in range(2))
    mm = measure(lambda: a @ b, device, reps=10).ms
    return {"copy_GBps": round(2 * (2 << 30) / copy / 1e6), "bf16_matmul_tflops": round(2 * 8192**3 / mm / 1e9, 1)}


def identical(got: Any, want: Any) -> bool:
    """Results equal bit for bit: tensors (floats compared as their bits, so -0.0 != 0.0 and NaN ==
    NaN), or sequences of them element by element."""
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor):
        if got.shape != want.shape or got.dtype != want.dtype:
            return False
        if got.is_floating_point():
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
            return bool(torch.equal(got.view(bits), want.view(bits)))
        return bool(torch.equal(got, want))
    if isinstance(got, (tuple, list)) and isinstance(want, (tuple, list)):
        return len(got) == len(want) and all(identical(a, b) for a, b in zip(got, want))
    return got == want


def same_pairs(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Top-k results (values [...,k], indices [...,k]) holding the same (value, index) pairs per row,
    in any order, bit for bit (``identical`` after ordering each row by index; indices distinct per row)."""
    def by_index(pairs):
        values, indices = pairs
        indices, order = indices.sort(dim=-1, stable=True)
        return values.gather(-1, order), indices

    return identical(by_index(got), by_index(want))


def device_name(device: torch.device | str) -> str:
    """The CUDA device's name, or the CPU's."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def versions() -> dict[str, str]:
    """torch, triton, transformers (where installed) and Python versions."""
    out = {"torch": torch.__version__}
    for package in ("triton", "transformers"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    out["python"] = platform.python_version()
    return out


def header(device: torch.device | str, **fields: Any) -> dict[str, Any]:
    """The start of a results document: ``{"device", "versions", **fields}``."""
    return {"device": device_name(device), "versions": versions(), **fields}


def versions_of(doc: dict) -> dict:
    """A results document's versions (documents written before ``header`` kept them at the top level)."""
    return doc.get("versions") or {k: doc[k] for k in ("torch", "triton", "transformers", "python") if k in doc}


def write_json(path: str | Path, doc: Any) -> Path:
    """Write ``doc`` as indented JSON (parents made); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table: one header row, then one row per entry (``None`` shown as "-")."""
    cell = (lambda x: "-" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def rows_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """``markdown_table`` of dict rows; ``columns`` default to every key, in first-seen order."""
    if columns is None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    return markdown_table(columns, ([row.get(c) for c in columns] for row in rows))


def notes_lines(doc: dict) -> list[str]:
    """Markdown lines of a results document's ``notes`` (where rows of several runs were combined,
    or what each run was): one bullet each."""
    return [f"- {note}" for note in doc.get("notes", ())]


def write_results(path: str | Path, doc: Any, table: str) -> Path:
    """Write ``doc`` as JSON at ``path`` and ``table`` beside it (``.md``), and print the table."""
    path = write_json(path, doc)
    path.with_suffix(".md").write_text(table.rstrip("\n") + "\n")
    print(table, flush=True)
    return path
