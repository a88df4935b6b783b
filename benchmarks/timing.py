"""Wall-clock timing of device work for the benchmarks."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, reps: int,
          before: Callable[[], None] = lambda: None, warmup: bool = True) -> tuple[float, object]:
    """Median wall time (ms) of ``reps >= 1`` calls (after one warm-up call unless ``warmup`` is
    False), and the last call's result. ``before`` runs (untimed) ahead of every timed call, e.g.
    a barrier so that ranks start together."""
    result = fn() if warmup else None
    times = []
    for _ in range(reps):
        before()
        synchronize(device)
        start = time.perf_counter()
        result = fn()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), result


def median_ms(fn: Callable[[], object], reps: int, device: torch.device | str = "cuda") -> float:
    """Median time (ms) of ``reps`` calls of ``fn``, no warm-up: CUDA events around each call on
    the GPU (the device time of the work it queues), the host clock elsewhere."""
    times = []
    for _ in range(reps):
        if torch.device(device).type != "cuda":
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)
