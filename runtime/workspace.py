"""Refusing calls whose workspace cannot fit on their device, before any of it is allocated.

An op computes the bytes its intermediates need from the argument shapes alone (each path its own
estimate, an upper bound of what it allocates at once) and calls ``check_workspace``, which
compares them with the device's memory: a CUDA device's total memory, the CPU's physical memory.
Devices whose memory is unknown (meta, others) are not checked. Without this, a call sized beyond
the device (e.g. expanded, zero-stride inputs of huge logical size) fails in the allocator after
part of the work, with a message that names no argument.
"""
from __future__ import annotations

import functools
import os

import torch

__all__ = ["INDEX_LIMIT", "check_index_range", "check_workspace", "device_memory_bytes"]

INDEX_LIMIT = 2**31
"""Sizes the kernels index in int32 (keys, queries, list positions) must stay below this."""


def check_index_range(name: str, what: str, size: int) -> None:
    """ValueError naming ``name`` when ``size`` (its ``what``) cannot be indexed in int32."""
    if size >= INDEX_LIMIT:
        raise ValueError(f"{name}: expected fewer than 2^31 {what} (the kernels index them in int32), got {size}")


@functools.lru_cache(maxsize=None)
def _cuda_memory(index: int) -> int:
    return torch.cuda.get_device_properties(index).total_memory


def device_memory_bytes(device: torch.device) -> int | None:
    """The memory of ``device`` in bytes, or None when it is not known (meta and other devices)."""
    if device.type == "cuda":
        return _cuda_memory(device.index if device.index is not None else torch.cuda.current_device())
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    return None


def check_workspace(nbytes: int, device: torch.device, arguments: str, sizes: str,
                    remedy: str = "split the call") -> None:
    """ValueError naming ``arguments`` (whose ``sizes``, e.g. "B=2, S=10, T=4096", set the
    workspace) and ending with ``remedy`` when ``nbytes`` exceed the memory of ``device``."""
    limit = device_memory_bytes(device)
    if limit is not None and nbytes > limit:
        raise ValueError(f"{arguments}: {sizes} need about {nbytes / 2**30:.1f} GiB of workspace on {device}, "
                         f"more than its {limit / 2**30:.1f} GiB of memory; {remedy}")
