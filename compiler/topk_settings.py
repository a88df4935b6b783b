"""How one certified top-K layer picks its path: the settings object that travels whole from the
options and the plan through the indexer pass and the op to the runtime's configuration.

``TopkSettings(path, r, min_keys, list_queries, witnesses)``. ``path`` is one of ``CHOICES``: "dense" and
"certified" are obeyed on every call; "auto" scores calls over fewer than ``min_keys`` keys densely
(None: the cost model's crossover for the call) and lets the runtime guard (``compiler.ops.guard``)
choose from there. ``r``: the certificate's retained heads (None: the runtime's per-query rule).
``list_queries``: queries sharing a survivor list in the GPU pipeline, a power of two
(``CertifiedTopkConfig.list_queries``; None: the pipeline's default). ``witnesses``: whether anchor
queries are scored densely and their top keys seed the threshold (``CertifiedTopkConfig.witnesses``;
None: the runtime's default). Frozen; a bad field raises ``ValueError``/``TypeError`` naming it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from runtime.certified_topk import PATHS, CertifiedTopkConfig, check_list_queries

__all__ = ["CHOICES", "PATHS", "TopkSettings", "check_witnesses", "settings_of"]

CHOICES = ("auto",) + PATHS
"""What an option, a plan, a pass or an op argument may ask for; ``PATHS`` is what a call runs."""


def _optional_int(name: str, value, low: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected None or an int >= {low}, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{name}: expected None or an int >= {low}, got {value}")


def check_witnesses(value, name: str = "witnesses") -> None:
    """TypeError naming ``name`` unless ``value`` is None or a bool."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name}: expected None or a bool, got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class TopkSettings:
    """The path of a certified top-K layer (module docstring)."""

    path: str = "auto"
    r: int | None = None
    min_keys: int | None = None
    list_queries: int | None = None
    witnesses: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or self.path not in CHOICES:
            raise ValueError(f"path: expected one of {list(CHOICES)}, got {self.path!r}")
        _optional_int("r", self.r, 1)
        _optional_int("min_keys", self.min_keys, 0)
        check_list_queries(self.list_queries)
        check_witnesses(self.witnesses)

    def op_arguments(self) -> dict:
        """The op's ``path``, ``r``, ``min_keys``, ``list_queries`` and ``witnesses`` arguments."""
        return {"path": self.path, "r": self.r, "min_keys": self.min_keys, "list_queries": self.list_queries,
                "witnesses": self.witnesses}

    def runtime_config(self, path: str) -> CertifiedTopkConfig:
        """The runtime configuration of a call that runs ``path`` (one of PATHS) with these settings."""
        return _runtime_config(self.r, path, self.list_queries, self.witnesses)


@functools.lru_cache(maxsize=256)
def settings_of(path: str, r: int | None, min_keys: int | None, list_queries: int | None,
                witnesses: bool | None) -> TopkSettings:
    """``TopkSettings(path, r, min_keys, list_queries, witnesses)``, built and validated once per
    distinct call (a decode loop does not rebuild it)."""
    return TopkSettings(path, r, min_keys, list_queries, witnesses)


@functools.lru_cache(maxsize=256)
def _runtime_config(r: int | None, path: str, list_queries: int | None, witnesses: bool | None) -> CertifiedTopkConfig:
    """The runtime configuration; ``witnesses`` None keeps ``CertifiedTopkConfig``'s default."""
    chosen = {} if witnesses is None else {"witnesses": witnesses}
    return CertifiedTopkConfig(r=r, path=path, list_queries=list_queries, **chosen)
