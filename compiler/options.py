"""The backend's options: one frozen, validated dataclass.

``torch.compile(model, backend="pulsar_dosa", options={...})`` hands the dict to the backend, which
turns it into :class:`CompileOptions` (:meth:`CompileOptions.from_user`); ``CompileOptions(...)``
validates the same way. An unknown key or a bad value raises ``ValueError``/``TypeError`` naming
the key and what was expected (a combination that cannot work, ``capture`` without the indexer
pass, names both keys). A new option is one field: ``name: type = option(default, check,
doc)``. :meth:`CompileOptions.uuid` hashes every field (a plan by its content) and is recorded per
compile; compiled code is not looked up by it: an option changes compiled code only through the
rewritten graph, which Inductor's cache keys on, and Dynamo shares compiled code only between
``torch.compile`` calls with equal backends and options. ``PASS_FAMILIES`` are the pattern
families a user may name, in run order."""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
from typing import Any, Callable, Mapping

from compiler.topk_settings import CHOICES
from runtime.fp8_quant import PRECISIONS

DOWNSTREAMS = ("inductor", "eager", "tensorrt")
PASS_FAMILIES = ("dsa_indexer", "sparse_attention", "attention", "dsa_mask")
"""The pattern families a user may name, in the order they run (``compiler.passes`` runs them)."""
SPARSE_FORMS = ("absorbed", "union")
"""The kernels of an MLA layer's DSA sparse attention: the absorbed form (latent rows shared by the
heads, the heads on the products' rows) or the union form (the expanded keys and values, a tile of
queries walking the union of their selections)."""
SPARSE_FORM_CHOICES = ("auto",) + SPARSE_FORMS
"""What the ``sparse_form`` option may ask for."""


def option(default: Any, check: Callable[[str, Any], Any], doc: str) -> Any:
    """Declare an option field: its default, its validator ``check(key, value) -> value`` and a doc line."""
    return dataclasses.field(default=default, metadata={"check": check, "doc": doc})


def _choice(choices: tuple[str, ...]) -> Callable[[str, Any], str]:
    def check(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise TypeError(f"option {key!r}: expected one of {list(choices)}, got {type(value).__name__} {value!r}")
        if value not in choices:
            raise ValueError(f"option {key!r}: expected one of {list(choices)}, got {value!r}")
        return value

    return check


def _check_downstream(key: str, value: Any) -> str:
    value = _choice(DOWNSTREAMS)(key, value)
    if value == "tensorrt" and importlib.util.find_spec("torch_tensorrt") is None:
        raise ImportError(
            f"option {key!r}='tensorrt' needs the torch_tensorrt package, which is not importable here; "
            "install it (pip install 'pulsar-dosa[tensorrt]') or use 'inductor' or 'eager'"
        )
    return value


def _check_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"option {key!r}: expected a bool, got {type(value).__name__} {value!r}")
    return value


def _check_products(key: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"option {key!r}: expected None or an int >= 0 (query-key-head products), got {value!r}")
    return value


def _check_passes(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(f"option {key!r}: expected a list of pass families from {list(PASS_FAMILIES)}, got {value!r}")
    for name in value:
        if name not in PASS_FAMILIES:
            raise ValueError(f"option {key!r}: unknown pass family {name!r}; expected names from {list(PASS_FAMILIES)}")
    if len(set(value)) != len(value):
        raise ValueError(f"option {key!r}: pass family listed twice in {list(value)}")
    return tuple(value)


def _check_plan(key: str, value: Any) -> Any:
    from compiler.plan.schema import Plan, load_plan  # late: plans pull in the cost model (sympy)

    if value is None or isinstance(value, Plan):
        return value
    if isinstance(value, (str, os.PathLike)):
        return load_plan(value)
    raise TypeError(f"option {key!r}: expected a path to a JSON plan (python -m compiler.plan), a Plan or None, "
                    f"got {type(value).__name__} {value!r}")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Validated backend options: ``CompileOptions(...)`` and :meth:`from_user` check (and normalise)
    every field the same way; every field is documented in its ``doc``."""

    downstream: str = option("inductor", _check_downstream,
                             "compiler that receives the rewritten graph: 'inductor', 'eager' or 'tensorrt'")
    passes: tuple[str, ...] | None = option(None, lambda k, v: None if v is None else _check_passes(k, v),
                                            "pattern families to run, in pass-list order; None runs all")
    path: str = option("auto", _choice(CHOICES),
                       "path of every rewritten indexer: 'auto' (the plan, or the cost model, then the runtime "
                       "guard), 'dense' or 'certified' (forced, unguarded)")
    record_stats: bool = option(True, _check_bool,
                                "accumulate per-layer top-K statistics (device tensors, no host sync)")
    plan: Any = option(None, _check_plan,
                       "per-layer indexer plan: a JSON plan path (loaded and validated) or a Plan; each layer's "
                       "r and min_keys come from it, and its content is part of uuid()")
    stock_below: int | None = option(None, _check_products,
                                     "indexer and sparse-attention calls of fewer B*S*T*H query-key-head products "
                                     "keep their stock subgraph (0: rewrite every call); None: 2^25 (indexer) and "
                                     "2^21 (sparse attention) on CUDA, 0 there under CUDA graphs, every call on "
                                     "devices where the ops run their plain-torch references, such as the CPU "
                                     "(compiler.policy.stock_threshold)")
    sparse_form: str = option("auto", _choice(SPARSE_FORM_CHOICES),
                              "kernel of the DSA sparse attentions of MLA layers: 'auto' (the absorbed op choosing "
                              "per call, compiler.policy.sparse_attention_form), 'absorbed' (latent rows, where the keys and "
                              "values are kv_b_proj's expansion of a latent) or 'union' (expanded keys and values)")
    indexer_precision: str = option("bf16", _choice(PRECISIONS),
                                    "what the rewritten indexers score: 'bf16' (the inputs as the model makes "
                                    "them), 'fp8' (q and k Hadamard-rotated, then E4M3 with one scale per key and "
                                    "per query head, the query scales folded into the weights: DeepSeek-V3.2's "
                                    "indexer, SPEC A.10) or 'fp8_unrotated' (the same without the rotation); the "
                                    "top-K is exact for the scorer of that precision. With an fp8 precision every "
                                    "indexer call is rewritten (stock_below does not apply: a stock subgraph would "
                                    "score in the model's precision, compiler.policy.stock_threshold)")
    capture: bool = option(False, _check_bool,
                           "record each rewritten indexer's inputs instead of optimising (plan calibration, "
                           "compiler.ops.capture_topk)")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, f.metadata["check"](f.name, getattr(self, f.name)))
        if self.capture and "dsa_indexer" not in self.enabled_passes():
            raise ValueError(f"option 'capture': records what the 'dsa_indexer' pass rewrites, but option 'passes' "
                             f"{list(self.passes)} leaves that pass out")

    @classmethod
    def from_user(cls, options: "CompileOptions | Mapping[str, Any] | None") -> "CompileOptions":
        """Validate ``options`` (None, a mapping of option names, or a CompileOptions) into one object."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if not isinstance(options, Mapping):
            raise TypeError(f"options: expected a dict of option names or None, got {type(options).__name__}")
        fields = sorted(f.name for f in dataclasses.fields(cls))
        for key in options:
            if key not in fields:
                raise ValueError(f"options: unknown key {key!r}; expected keys from {fields}")
        return cls(**options)

    def enabled_passes(self) -> tuple[str, ...]:
        """The pass families to run, in ``PASS_FAMILIES`` order."""
        chosen = PASS_FAMILIES if self.passes is None else self.passes
        return tuple(name for name in PASS_FAMILIES if name in chosen)

    def uuid(self) -> str:
        """A stable hex hash of every field: equal options give equal ids across processes."""
        payload = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()
