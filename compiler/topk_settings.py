"""How one certified top-K layer picks its path: the settings object that travels whole from the
options and the plan through the indexer pass and the op to the runtime's configuration.

``TopkSettings(path, r, min_keys)``. ``path`` is one of ``CHOICES``: "dense" and "certified" are
obeyed on every call; "auto" scores calls over fewer than ``min_keys`` keys densely (None: the
cost model's crossover for the call) and lets the runtime guard (``compiler.ops.guard``) choose
from there. ``r``: the certificate's retained heads (None: the runtime's per-query rule). Frozen;
a bad field raises ``ValueError``/``TypeError`` naming it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from runtime.certified_topk import PATHS, CertifiedTopkConfig

__all__ = ["CHOICES", "PATHS", "TopkSettings", "settings_of"]

CHOICES = ("auto",) + PATHS
"""What an option, a plan, a pass or an op argument may ask for; ``PATHS`` is what a call runs."""


def _optional_int(name: str, value, low: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected None or an int >= {low}, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{name}: expected None or an int >= {low}, got {value}")


@dataclass(frozen=True)
class TopkSettings:
    """The path of a certified top-K layer (module docstring)."""

    path: str = "auto"
    r: int | None = None
    min_keys: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or self.path not in CHOICES:
            raise ValueError(f"path: expected one of {list(CHOICES)}, got {self.path!r}")
        _optional_int("r", self.r, 1)
        _optional_int("min_keys", self.min_keys, 0)

    def op_arguments(self) -> dict:
        """The op's ``path``, ``r`` and ``min_keys`` arguments."""
        return {"path": self.path, "r": self.r, "min_keys": self.min_keys}

    def runtime_config(self, path: str) -> CertifiedTopkConfig:
        """The runtime configuration of a call that runs ``path`` (one of PATHS) with these settings."""
        return _runtime_config(self.r, path)


@functools.lru_cache(maxsize=256)
def settings_of(path: str, r: int | None, min_keys: int | None) -> TopkSettings:
    """``TopkSettings(path, r, min_keys)``, built and validated once per distinct call (a decode loop
    does not rebuild it)."""
    return TopkSettings(path, r, min_keys)


@functools.lru_cache(maxsize=256)
def _runtime_config(r: int | None, path: str) -> CertifiedTopkConfig:
    return CertifiedTopkConfig(r=r, path=path)
