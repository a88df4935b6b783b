"""Loading what the plan CLI calibrates on: the model and the token ids, with descriptions for the plan.

Model specs (``load_model``):

* a directory with ``config.json`` (a transformers model): weights are loaded when the directory has
  ``*.safetensors`` or ``pytorch_model*.bin`` files, else the model is randomly initialised from
  ``seed``;
* a path to a ``config.json`` file: random initialisation from ``seed``;
* ``module:function``: an importable factory called with no arguments that returns an ``nn.Module``.

``model_config`` reads a spec's configuration (and imports a factory) without building the model,
``load_tokenizer`` a model directory's tokenizer.

Token files (``load_token_ids``): ``.txt`` with whitespace-separated integers, ``.npy`` or ``.pt`` with
an integer array of rank 1 (one stream) or 2 (one sequence per row). ``tokenize_text`` reads plain
text through the model's tokenizer.
"""
from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch


@dataclass
class LoadedModel:
    """The model in eval mode, its tokenizer when it has one, and a JSON description for the plan."""

    model: torch.nn.Module
    tokenizer: Any
    description: dict


def _has_weights(directory: Path) -> bool:
    return any(directory.glob("*.safetensors")) or any(directory.glob("pytorch_model*.bin"))


def _config_hash(config) -> str:
    """SHA-256 of the configuration's content (its load path excluded)."""
    data = {k: v for k, v in config.to_dict().items() if k != "_name_or_path"}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def model_config(spec: str) -> Any:
    """The transformers configuration of ``spec`` (a model directory or a config.json file), read
    without building the model; None for a ``module:function`` spec once its factory imports
    (``model_factory``). TypeError/ValueError naming the spec when it is none of the forms or its
    configuration cannot be read."""
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"model: expected a path or 'module:function', got {spec!r}")
    path = Path(spec)
    if path.is_dir() or path.is_file():
        return _read_config(path)
    if ":" in spec:
        model_factory(spec)
        return None
    raise ValueError(f"model {spec!r}: expected a transformers model directory, a config.json file "
                     "or 'module:function'")


def _read_config(path: Path) -> Any:
    import transformers

    if path.is_dir() and not (path / "config.json").is_file():
        raise ValueError(f"model {str(path)!r}: directory has no config.json")
    try:
        return transformers.AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"model {str(path)!r}: cannot read a transformers configuration ({exc})") from exc


def load_model(spec: str, *, seed: int = 0) -> LoadedModel:
    """Load ``spec`` (see the module docstring); errors as ``model_config``'s."""
    config = model_config(spec)
    if config is None:
        return _load_factory(spec)
    return _load_transformers(Path(spec), config, seed)


def load_tokenizer(spec: str) -> Any:
    """The tokenizer saved in the model directory ``spec``; None for any other spec or a directory
    without one."""
    path = Path(spec)
    if not path.is_dir():
        return None
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _load_transformers(path: Path, config: Any, seed: int) -> LoadedModel:
    import transformers

    directory = path if path.is_dir() else path.parent
    if path.is_dir() and _has_weights(directory):
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        weights = "loaded"
    else:
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
        weights = f"random init, seed {seed}"
    tokenizer = load_tokenizer(str(path))
    description = {"spec": str(path), "class": type(model).__name__, "model_type": config.model_type,
                   "config_sha256": _config_hash(config), "weights": weights}
    return LoadedModel(model.eval(), tokenizer, description)


def model_factory(spec: str) -> Callable[[], Any]:
    """The factory a ``module:function`` spec names, imported; ValueError naming the spec when it
    cannot be imported, TypeError when it is not callable."""
    module_name, _, function_name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"model {spec!r}: cannot import the factory ({exc})") from exc
    if not callable(factory):
        raise TypeError(f"model {spec!r}: {function_name} is a {type(factory).__name__}, expected a callable factory")
    return factory


def _load_factory(spec: str) -> LoadedModel:
    model = model_factory(spec)()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model {spec!r}: the factory returned {type(model).__name__}, expected an nn.Module")
    return LoadedModel(model.eval(), None, {"spec": spec, "class": type(model).__name__, "weights": "factory"})


def load_token_ids(path: str | Path) -> torch.Tensor:
    """Integer token ids as int64, rank 1 (one stream) or 2 (rows are sequences)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".txt":
        try:
            ids = torch.tensor([int(t) for t in path.read_text(encoding="utf-8").split()], dtype=torch.int64)
        except ValueError as exc:
            raise ValueError(f"tokens {str(path)!r}: expected whitespace-separated integers ({exc})") from exc
    elif suffix == ".npy":
        import numpy as np

        array = np.load(path, allow_pickle=False)
        if not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"tokens {str(path)!r}: expected an integer array, got dtype {array.dtype}")
        ids = torch.from_numpy(array.astype(np.int64))
    elif suffix == ".pt":
        ids = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool \
                or ids.is_complex():
            raise TypeError(f"tokens {str(path)!r}: expected an integer tensor")
        ids = ids.to(torch.int64)
    else:
        raise ValueError(f"tokens {str(path)!r}: expected a .txt, .npy or .pt file")
    if ids.dim() not in (1, 2) or ids.numel() == 0:
        raise ValueError(f"tokens {str(path)!r}: expected a non-empty rank-1 or rank-2 array, "
                         f"got shape {tuple(ids.shape)}")
    if int(ids.min()) < 0:
        raise ValueError(f"tokens {str(path)!r}: token ids must be >= 0")
    return ids


def tokenize_text(path: str | Path, tokenizer) -> torch.Tensor:
    """Plain text tokenised with the model's tokenizer, as one int64 stream."""
    if tokenizer is None:
        raise ValueError("text: the model has no tokenizer; pass token ids with --tokens instead")
    text = Path(path).read_text(encoding="utf-8")
    ids = torch.tensor(tokenizer(text, add_special_tokens=True)["input_ids"], dtype=torch.int64)
    if ids.numel() == 0:
        raise ValueError(f"text {str(path)!r}: the tokenizer made no tokens of it")
    return ids


def batch_sequences(ids: torch.Tensor, seq_len: int | None, batch_size: int) -> list[torch.Tensor]:
    """Cut ids into sequences of ``seq_len`` tokens (a rank-1 stream; a short tail is dropped unless it
    is the only sequence) and group them into batches [b, seq_len] of at most ``batch_size`` rows."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
    if ids.dim() == 2:
        rows = ids if seq_len is None else ids[:, :seq_len]
    else:
        length = ids.numel() if seq_len is None else min(seq_len, ids.numel())
        if length < 1:
            raise ValueError(f"seq_len: expected an int >= 1, got {seq_len!r}")
        rows = ids[: ids.numel() // length * length].view(-1, length)
    return [rows[i:i + batch_size] for i in range(0, rows.shape[0], batch_size)]


def describe_tokens(ids: torch.Tensor, source: str, batches: list[torch.Tensor]) -> dict:
    """A JSON description of the calibration inputs: source, hash, counts and batch shapes."""
    digest = hashlib.sha256(ids.contiguous().numpy().tobytes()).hexdigest()
    return {"source": source, "token_ids_sha256": digest, "tokens": int(ids.numel()),
            "sequences": sum(int(b.shape[0]) for b in batches),
            "seq_len": int(batches[0].shape[1]), "batches": len(batches)}
