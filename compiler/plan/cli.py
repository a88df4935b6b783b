"""Offline per-layer indexer plans: ``python -m compiler.plan --model M --tokens F --out plan.json``.

Runs the model eagerly on calibration tokens, captures each DSA indexer layer's q, k, weights through
the backend's own indexer pass (``compiler.plan.capture``), measures per layer the survival m(r), the
redo fraction and the call time of each candidate budget r with the certified top-K on the device
(the best budgets also with survivor lists of other sizes, on CUDA, and the best of those with anchor
witnesses off and on), the dense time, the seed gap and slack distributions (``compiler.plan.measure``),
lets ``compiler.plan.choice.choose_layer`` choose r, the list size, the witnesses, the path and the
crossover length (or refuse, with the reason), and writes a versioned JSON plan
(``compiler.plan.schema``). ``--plot out.png`` also draws m(r) per layer and the predicted speedup.

Candidates: by default the short tile-aligned list r = 1, 3, 7, 15, 31, at most half the heads
(``choice.short_candidates``);
``--candidates all`` sweeps every tile-aligned budget, ``--candidates 2,5`` measures those. Times are
measured when the plan is for the device it is calibrated on (``--device cuda``, or the CPU
constants on the CPU); with other constants (e.g. ``--constants h200`` on a CPU) the choice rests on
the cost model's prediction alone.

Every flag is checked before any model work (``check_args``: paths, positive lengths and counts,
the device, the constants file, the model's configuration (read, not built: it must configure a DSA
indexer with more heads than every --candidates budget), the token file or the text and its
tokenizer, and the ids against the configuration's vocabulary); a bad one exits with argparse's
usage message naming it and exit code 2. A factory model (``module:function``) is imported first
and checked once built.

Use the plan with ``torch.compile(model, backend="pulsar_dosa", options={"plan": "plan.json"})``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from compiler.cost_model import CPU_REFERENCE, H200_FITTED, KernelConstants, candidate_rs
from compiler.plan.choice import short_candidates
from compiler.plan.schema import Plan, save_plan


def _int_at_least(low: int):
    """An argparse type: an int >= ``low`` (argparse names the flag in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {text!r}")
        return value
    return parse


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected an int in [0, 2^63), got {text!r}")
    return value


def make_parser() -> argparse.ArgumentParser:
    positive = _int_at_least(1)
    p = argparse.ArgumentParser(prog="python -m compiler.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--model",
                   help="transformers model directory, config.json (random init) or module:function factory")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--tokens", help=".txt of whitespace-separated token ids, or an integer .npy / .pt array")
    src.add_argument("--text", help="plain text, tokenised with the model's tokenizer")
    p.add_argument("--structured", default=None, metavar="B,S,T,H,D,K",
                   help="instead of a model: one layer named 'structured' on synthetic inputs of "
                        "runtime.structured_indexer (causal over the last S of T keys, seeded by --seed)")
    p.add_argument("--out", required=True, help="where to write the JSON plan")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the random initialisation (no weights)")
    p.add_argument("--seq-len", type=positive, default=None,
                   help="tokens per calibration sequence (default: the whole stream, or each row)")
    p.add_argument("--batch-size", type=positive, default=1, help="sequences per model call")
    p.add_argument("--candidates", default=None,
                   help="comma-separated retained-head budgets r to measure, or 'all' for every tile-aligned "
                        "budget (default: the short list 1,3,7,15,31, at most half the heads)")
    p.add_argument("--constants", default=None,
                   help="'cpu', 'h200', 'measure' (time the runtime reference on --device) or a JSON file "
                        "of KernelConstants (default: cpu, or h200 on --device cuda)")
    p.add_argument("--design-length", type=positive, default=131072,
                   help="key length the choice of r is optimised for (default 131072)")
    p.add_argument("--queries", type=positive, default=None,
                   help="queries per indexer call to plan for (default: causal prefill, one per key)")
    p.add_argument("--device", default="cpu", help="device the model runs on (default cpu)")
    p.add_argument("--plot", default=None, help="also write a PNG of m(r) and the predicted speedup")
    return p


class UsageError(ValueError):
    """A flag's value is unusable; ``main`` reports it as argparse does (exit code 2)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed flags, every one checked (``check_args``) before any model work; a bad one exits
    with argparse's usage message naming it and code 2."""
    p = make_parser()
    args = p.parse_args(argv)
    try:
        check_args(args)
    except UsageError as exc:
        p.error(str(exc))
    return args


def check_args(args: argparse.Namespace) -> None:
    """UsageError naming the flag for anything that would fail later: the inputs' combination,
    the output and plot directories, --queries beyond --design-length, --candidates, --constants
    (a JSON file is read), --device (parsed, and available), --structured, --model (its
    configuration read without building the model: a DSA indexer, ``runtime.dsa_config``, whose
    heads exceed every --candidates budget; a factory imported), the token file or the text
    (read, the text tokenised by the model directory's tokenizer: kept as ``args.token_ids``) and
    the ids against the configuration's vocabulary (a factory model is checked once built,
    ``check_vocabulary``)."""
    if args.structured is None and (args.model is None or (args.tokens is None and args.text is None)):
        raise UsageError("give --model with --tokens or --text, or --structured")
    if args.structured is not None and (args.model or args.tokens or args.text):
        raise UsageError("--structured replaces --model, --tokens and --text")
    for flag, path in (("--out", args.out), ("--plot", args.plot)):
        if path is not None:
            _check_output_path(flag, Path(path))
    if args.queries is not None and args.queries > args.design_length:
        raise UsageError(f"--queries: expected at most --design-length ({args.design_length}) queries, "
                         f"got {args.queries}")
    try:
        parse_candidates(args.candidates)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    _check_constants(args.constants)
    _check_device(args.device)
    if args.structured is not None:
        parse_structured(args.structured)
    args.token_ids = None
    if args.model is None:
        return
    config = _check_model(args.model, parse_candidates(args.candidates))
    flag, path = ("--tokens", args.tokens) if args.tokens is not None else ("--text", args.text)
    if not Path(path).is_file():
        raise UsageError(f"{flag}: no file {path}")
    from compiler.plan.inputs import load_token_ids, load_tokenizer, tokenize_text

    tokenizer = load_tokenizer(args.model) if flag == "--text" else None
    if flag == "--text" and tokenizer is None:
        raise UsageError(f"--text: the model {args.model} has no tokenizer (a model directory holding one is "
                         "needed); pass token ids with --tokens instead")
    try:
        args.token_ids = load_token_ids(path) if tokenizer is None else tokenize_text(path, tokenizer)
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        raise UsageError(f"{flag}: {exc}") from exc
    vocabulary = None if config is None else getattr(config.get_text_config(decoder=True), "vocab_size", None)
    if isinstance(vocabulary, int):
        check_vocabulary(args.token_ids, vocabulary, flag)


def _check_model(spec: str, candidates: list[int] | str | None) -> Any:
    """The configuration of the model ``spec`` (None for a factory, imported), after UsageErrors
    naming --model when it cannot be read or configures no DSA indexer, and --candidates when a
    budget is not below the indexer's heads."""
    from compiler.plan.inputs import model_config
    from runtime.dsa_config import indexer_heads

    try:
        config = model_config(spec)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--model: {exc}") from exc
    if config is None:
        return None
    heads = indexer_heads(config)
    if heads is None:
        raise UsageError(f"--model: {spec} configures no DSA indexer (model type {config.model_type!r} has no "
                         "index_n_heads); a plan needs at least one indexer layer")
    check_candidates(candidates, heads)
    return config


def _check_output_path(flag: str, path: Path) -> None:
    if path.is_dir():
        raise UsageError(f"{flag}: {path} is a directory, expected a file path")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag}: directory {parent} does not exist")


def _check_constants(spec: str | None) -> None:
    if spec is None or spec in ("cpu", "h200", "measure"):
        return
    if not Path(spec).is_file():
        raise UsageError(f"--constants: expected 'cpu', 'h200', 'measure' or a JSON file, got {spec!r}")
    try:
        KernelConstants.from_json(spec)
    except (ValueError, TypeError, KeyError, OSError) as exc:
        raise UsageError(f"--constants: cannot read KernelConstants from {spec} ({exc})") from exc


def _check_device(spec: str) -> None:
    import torch

    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device: expected cpu or an available cuda device, got {spec!r}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise UsageError(f"--device: {spec} is not available ({count} CUDA devices)")


def parse_structured(spec: str) -> tuple[int, int, int, int, int, int]:
    """``--structured B,S,T,H,D,K`` as six ints >= 1 with S <= T, else UsageError."""
    try:
        B, S, T, H, D, K = (int(x) for x in spec.split(","))
    except ValueError:
        raise UsageError(f"--structured: expected six ints B,S,T,H,D,K, got {spec!r}") from None
    if min(B, S, T, H, D, K) < 1:
        raise UsageError(f"--structured: expected B,S,T,H,D,K >= 1, got {spec!r}")
    if S > T:
        raise UsageError(f"--structured: expected S <= T, got S={S}, T={T}")
    return B, S, T, H, D, K


def check_vocabulary(ids, vocabulary: int, flag: str = "--tokens") -> None:
    """UsageError naming ``flag`` (where the ids come from) when a token id is outside ``[0, vocabulary)``."""
    top = int(ids.max())
    if top >= vocabulary:
        raise UsageError(f"{flag}: token id {top} is outside the model's vocabulary of {vocabulary} ids")


def resolve_constants(spec: str | None, device: str) -> KernelConstants:
    """'cpu' / 'h200' / 'measure' / a JSON path -> constants; None picks by device."""
    if spec is None:
        return H200_FITTED if device.startswith("cuda") else CPU_REFERENCE
    if spec == "cpu":
        return CPU_REFERENCE
    if spec == "h200":
        return H200_FITTED
    if spec == "measure":
        from compiler.plan.constants import measure_reference_constants

        return measure_reference_constants(device)
    return KernelConstants.from_json(spec)


def parse_candidates(spec: str | None) -> list[int] | str | None:
    """``--candidates`` as sorted distinct budgets >= 1, "all", or None (the short list)."""
    if spec is None or spec == "all":
        return spec
    try:
        rs = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError as exc:
        raise ValueError(f"--candidates: expected comma-separated ints or 'all', got {spec!r}") from exc
    if not rs or rs[0] < 1:
        raise ValueError(f"--candidates: expected budgets >= 1, got {spec!r}")
    return rs


def layer_candidates(requested: list[int] | str | None, heads: int, constants: KernelConstants) -> list[int]:
    """The budgets measured on a layer with ``heads`` heads: the requested ones (each < heads), every
    tile-aligned one ("all"), or the short list (None)."""
    if requested is None:
        return short_candidates(heads)
    if requested == "all":
        return candidate_rs(heads, constants)
    check_candidates(requested, heads)
    return requested


def check_candidates(requested: list[int] | str | None, heads: int) -> None:
    """UsageError naming --candidates when a requested budget is not below an indexer's ``heads``."""
    if isinstance(requested, list) and requested[-1] >= heads:
        raise UsageError(f"--candidates: expected budgets below the layer's {heads} heads, got {requested}")


def times_the_calls(constants_spec: str | None, device: str) -> bool:
    """Whether calibration calls are timed: only when the plan is for the device it is measured on."""
    return device.startswith("cuda") or constants_spec in (None, "cpu", "measure")


def plan_from_calls(calls: Mapping[str, Sequence], *, constants: KernelConstants, design_length: int,
                    queries: int | None, candidates: list[int] | str | None, model: Any, inputs: Any,
                    timed: bool = True) -> Plan:
    """Measure and decide every layer of ``calls`` (layer -> CapturedCalls) and assemble the plan;
    ``model`` and ``inputs`` are the plan's descriptions; ``timed``: time the calibration calls."""
    from compiler.plan.measure import choose_from_measurement, measure_layer, measurement_count
    from compiler.plan.progress import progress

    layers = []
    for name, layer_calls in calls.items():
        rs = layer_candidates(candidates, layer_calls[0].q.shape[2], constants)
        runs = measurement_count(len(rs), layer_calls) + 1
        with progress(runs * len(layer_calls), f"measure {name} ((r, list size, witnesses) x batches)") as step:
            measurement = measure_layer(name, layer_calls, rs, timed=timed, on_call=step)
            layers.append(choose_from_measurement(measurement, constants, design_length, queries, on_call=step))
    return Plan(model=model, inputs=inputs, design_length=design_length, queries=queries, constants=constants,
                layers=tuple(layers))


def structured_calls(spec: str, seed: int, device: str) -> tuple[dict, dict]:
    """``--structured B,S,T,H,D,K`` -> ({"structured": [call]}, inputs description)."""
    import torch

    from compiler.ops.capture_topk import CapturedCall
    from runtime.structured_indexer import structured_indexer_inputs

    B, S, T, H, D, K = parse_structured(spec)
    q, k, w, params = structured_indexer_inputs(B, S, T, H, D, seed=seed)
    mask = torch.ones(S, T, dtype=torch.bool).tril(diagonal=T - S).expand(B, S, T)
    call = CapturedCall(q.to(device), k.to(device), w.to(device), K, mask.to(device))
    return {"structured": [call]}, {"source": "runtime.structured_indexer", "topk": K, "causal": True,
                                    "parameters": {n: v if isinstance(v, (int, float, str)) else str(v)
                                                   for n, v in params.items()}}


def build_plan(args: argparse.Namespace) -> Plan:
    """Everything but writing: load, capture (or synthesise), measure, choose."""
    import torch

    from compiler.plan.capture import capture_indexer_inputs
    from compiler.plan.inputs import (batch_sequences, describe_tokens, load_model, load_token_ids,
                                      tokenize_text)
    from compiler.plan.progress import progress

    constants = resolve_constants(args.constants, args.device)
    requested = parse_candidates(args.candidates)
    settings = dict(constants=constants, design_length=args.design_length, queries=args.queries,
                    candidates=requested, timed=times_the_calls(args.constants, args.device))
    if args.structured is not None:
        calls, inputs = structured_calls(args.structured, args.seed, args.device)
        return plan_from_calls(calls, model={"spec": "structured"}, inputs=inputs, **settings)
    loaded = load_model(args.model, seed=args.seed)
    flag, source = ("--tokens", args.tokens) if args.tokens is not None else ("--text", args.text)
    ids = getattr(args, "token_ids", None)
    if ids is None:
        ids = load_token_ids(args.tokens) if args.tokens is not None else tokenize_text(args.text, loaded.tokenizer)
    embeddings = loaded.model.get_input_embeddings() if hasattr(loaded.model, "get_input_embeddings") else None
    if isinstance(embeddings, torch.nn.Embedding):
        check_vocabulary(ids, embeddings.num_embeddings, flag)
    batches = batch_sequences(ids, args.seq_len, args.batch_size)
    device = torch.device(args.device)
    model = loaded.model.to(device)
    with progress(len(batches), "capture (batches)") as step:
        recorder = capture_indexer_inputs(model, [b.to(device) for b in batches], lambda i: step())
    return plan_from_calls(recorder.calls, model=loaded.description,
                           inputs=describe_tokens(ids, source, batches), **settings)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = build_plan(args)
    except UsageError as exc:  # a check that needed the built model (a factory's vocabulary)
        make_parser().error(str(exc))
    save_plan(plan, args.out)
    for e in plan.layers:
        pruned = "-" if e.predicted_pruned_frac is None else f"{e.predicted_pruned_frac:.3f}"
        print(f"{e.layer}: path={e.settings.path} r={e.settings.r} min_keys={e.settings.min_keys} "
              f"list_queries={e.settings.list_queries} witnesses={e.settings.witnesses} pruned={pruned} "
              f"speedup@{plan.design_length}={e.predicted_speedup:.2f}: {e.reason}", file=sys.stderr)
    print(f"wrote {args.out} (sha256 {plan.hash[:16]}...)", file=sys.stderr)
    if args.plot:
        from compiler.plan.plot import plot_plan

        print(f"wrote {plot_plan(plan, Path(args.plot))}", file=sys.stderr)
    return 0
