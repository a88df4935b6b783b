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
