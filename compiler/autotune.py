"""Triton launch configurations chosen by measurement, keyed on bucketed lengths, cached on disk.

``choose_config(kernel, configs, launch, device=, length=, shape=)``: under ``TRITON_INTERPRET=1`` or
off CUDA the first candidate; for a call with less work than ``MIN_TUNED_WORK`` the first candidate
that launches (``first_launchable``: e.g. one whose shared memory the device has), none measured;
otherwise the cached choice for (kernel, device name,
torch and triton versions, power-of-two bucket of the length, the other shape ints), or the fastest
candidate that launches (a failing one is skipped), measured once and stored. The cache is a JSON
file (``PULSAR_DOSA_AUTOTUNE_CACHE`` or ``~/.cache/pulsar_dosa/autotune.json``) written atomically;
an unreadable one is ignored and replaced. The choice changes speed only: every candidate computes
the same result."""
from __future__ import annotations

import functools
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import torch

MIN_TUNED_WORK = 1 << 32
"""Calls with less work than this (multiply-adds, as the kernel family counts them) are not tuned.
Tuning a new key compiles every candidate on the call that meets it first: about 0.3-8 s per
candidate for the screen and sparse-attention kernels (sm_90, Triton 3.6, compiled on a 2-core
x86 CPU), so the screen's candidates alone add several seconds to a first call, while a call below
2^32 multiply-adds runs for tens of microseconds on the GPU, where a config changes little."""
CACHE_ENV = "PULSAR_DOSA_AUTOTUNE_CACHE"
CACHE_FORMAT = "pulsar-dosa-autotune-1"


@dataclass(frozen=True)
class LaunchConfig:
    """Kernel meta-parameters (``tl.constexpr`` names -> ints) plus ``num_warps`` and ``num_stages``."""

    meta: tuple[tuple[str, int], ...]
    num_warps: int = 4
    num_stages: int = 2

    @classmethod
    def of(cls, num_warps: int = 4, num_stages: int = 2, **meta: int) -> "LaunchConfig":
        for name, value in meta.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"LaunchConfig meta {name!r}: expected an int, got {value!r}")
        for name, value in (("num_warps", num_warps), ("num_stages", num_stages)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LaunchConfig {name}: expected an int >= 1, got {value!r}")
        return cls(tuple(sorted(meta.items())), num_warps, num_stages)

    def kwargs(self) -> dict[str, int]:
        """Keyword arguments for a Triton launch: the meta-parameters, num_warps and num_stages."""
        return {**dict(self.meta), "num_warps": self.num_warps, "num_stages": self.num_stages}

    def to_dict(self) -> dict:
        return {"meta": dict(self.meta), "num_warps": self.num_warps, "num_stages": self.num_stages}

    @classmethod
    def from_dict(cls, data: Mapping) -> "LaunchConfig":
        return cls.of(num_warps=data["num_warps"], num_stages=data["num_stages"], **data["meta"])


def length_bucket(length: int, minimum: int = 256) -> int:
    """The smallest power of two >= max(length, minimum)."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length: expected an int >= 1, got {length!r}")
    n = max(length, minimum)
    return 1 << (n - 1).bit_length()


def interpreter_active() -> bool:
    """True when Triton kernels run in the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def graph_capturing(device: torch.device) -> bool:
    """True while a CUDA graph is captured on ``device``'s current stream (no host read may wait)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@functools.lru_cache(maxsize=None)
def device_capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device, looked up once (a decode loop asks at every call)."""
    return torch.cuda.get_device_capability(device)


@functools.lru_cache(maxsize=None)
def multiprocessor_count(device: torch.device | str | int | None = None) -> int:
    """Streaming multiprocessors of a CUDA device (the current one when None), looked up once."""
    if device is None:
        device = torch.cuda.current_device()
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_cache_path() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "pulsar_dosa" / "autotune.json"


def tuning_key(kernel: str, device: torch.device, bucket: int, shape: Mapping[str, int]) -> str:
    """Cache key: kernel, device model, torch and triton versions, bucket and the other shape ints."""
    import triton

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    parts = [kernel, name, f"torch={torch.__version__}", f"triton={triton.__version__}", f"bucket={bucket}"]
    parts += [f"{k}={shape[k]}" for k in sorted(shape)]
    return "|".join(parts)


class AutotuneCache:
    """A JSON file of key -> LaunchConfig; reads once, writes atomically on every new entry."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_cache_path()
        self._lock = threading.Lock()
        self._entries = self._read()

    def _read(self) -> dict[str, LaunchConfig]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") != CACHE_FORMAT:
                return {}
            return {k: LaunchConfig.from_dict(v) for k, v in data["entries"].items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}

    def get(self, key: str) -> LaunchConfig | None:
        return self._entries.get(key)

    def put(self, key: str, config: LaunchConfig) -> None:
        with self._lock:
            self._entries[key] = config
            self.path.parent.mkdir(parents=True, exist_ok=True)
            payload = {"format": CACHE_FORMAT,
                       "entries": {k: v.to_dict() for k, v in sorted(self._entries.items())}}
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".autotune-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(payload, fh, indent=1)
            os.replace(tmp, self.path)


def cuda_timer(fn: Callable[[], None]) -> float:
    """Median milliseconds of ``fn`` on the current CUDA stream (Triton's do_bench)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, return_mode="median"))


def launch_errors() -> tuple[type[BaseException], ...]:
    """Exceptions by which a candidate config is skipped: Triton compile/launch failures."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import InterpreterError, OutOfResources

    return (CompilationError, OutOfResources, InterpreterError, RuntimeError)


def _launching(configs: Sequence[LaunchConfig], launch: Callable[[LaunchConfig], None]) -> Iterator[LaunchConfig]:
    """The candidates whose ``launch`` succeeds once, in order and lazily (a launch also compiles);
    a failing one (``launch_errors``) is skipped; the last failure is raised when none succeeded."""
    failure, any_ok = None, False
    for config in configs:
        try:
            launch(config)
        except launch_errors() as err:
            failure = err
            continue
        any_ok = True
        yield config
    if not any_ok:
        raise failure


def launchable_configs(configs: Sequence[LaunchConfig],
                       launch: Callable[[LaunchConfig], None]) -> tuple[LaunchConfig, ...]:
    """Every candidate whose ``launch`` succeeds once (``_launching``)."""
    return tuple(_launching(configs, launch))


def fastest_config(configs: Sequence[LaunchConfig], launch: Callable[[LaunchConfig], None],
                   timer: Callable[[Callable[[], None]], float]) -> LaunchConfig:
    """Among the launchable candidates, the one with the smallest ``timer(lambda: launch(config))``
    (ties: the earlier one)."""
    if not configs:
        raise ValueError("configs: expected at least one LaunchConfig")
    candidates = launchable_configs(configs, launch)
    times = [timer(lambda cfg=cfg: launch(cfg)) for cfg in candidates]
    return candidates[min(range(len(candidates)), key=times.__getitem__)]


_SHARED_CACHE: AutotuneCache | None = None
_FIRST_LAUNCHABLE: dict[str, LaunchConfig] = {}


def first_launchable(kernel: str, configs: Sequence[LaunchConfig], launch: Callable[[LaunchConfig], None], *,
                     device: torch.device, shape: Mapping[str, int]) -> LaunchConfig:
    """The first candidate whose ``launch`` succeeds (a failing one, ``launch_errors``, is skipped;
    the last failure is raised when none succeeds), found once per (kernel, device, shape) and
    process: the candidates after it are neither compiled nor run."""
    key = tuning_key(kernel, device, 0, shape)
    found = _FIRST_LAUNCHABLE.get(key)
    if found not in configs:
        found = _FIRST_LAUNCHABLE[key] = next(_launching(configs, launch))
    return found


def choose_config(kernel: str, configs: Sequence[LaunchConfig], launch: Callable[[LaunchConfig], None], *,
                  device: torch.device, length: int, shape: Mapping[str, int], work: int,
                  cache: AutotuneCache | None = None) -> LaunchConfig:
    """The launch config for ``kernel`` at ``length`` on ``device`` for a call of ``work``
    multiply-adds (see the module docstring)."""
    global _SHARED_CACHE
    if not configs:
        raise ValueError("configs: expected at least one LaunchConfig")
    if isinstance(work, bool) or not isinstance(work, int) or work < 0:
        raise ValueError(f"work: expected an int >= 0, got {work!r}")
    if device.type != "cuda" or interpreter_active():
        return configs[0]
    if work < MIN_TUNED_WORK:
        return first_launchable(kernel, configs, launch, device=device, shape=shape)
    if cache is None:
        if _SHARED_CACHE is None:
            _SHARED_CACHE = AutotuneCache()
        cache = _SHARED_CACHE
    key = tuning_key(kernel, device, length_bucket(length), shape)
    found = cache.get(key)
    if found is not None and found in configs:
        return found
    best = fastest_config(configs, launch, cuda_timer)
    cache.put(key, best)
    return best
