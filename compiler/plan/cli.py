"""Offline per-layer indexer plans: ``python -m compiler.plan --model M --tokens F --out plan.json``.

Runs the model eagerly on calibration tokens, captures each DSA indexer layer's q, k, weights through
the backend's own indexer pass (``compiler.plan.capture``), measures per layer the survival m(r), the
redo fraction and the call time of each candidate budget r with the certified top-K on the device,
the dense time, the seed gap and slack distributions (``compiler.plan.measure``), lets
``compiler.plan.choice.choose_layer`` choose r, the path and the crossover length (or refuse, with the
reason), and writes a versioned JSON plan (``compiler.plan.schema``). ``--plot out.png`` also draws
m(r) per layer and the predicted speedup.

Candidates: by default the short tile-aligned list r = 1, 3, 7 (``choice.short_candidates``);
``--candidates all`` sweeps every tile-aligned budget, ``--candidates 2,5`` measures those. Times are
measured when the plan is for the device it is calibrated on (``--device cuda``, or the CPU
constants on the CPU); with other constants (e.g. ``--constants h200`` on a CPU) the choice rests on
the cost model's prediction alone.

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


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
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
    p.add_argument("--seed", type=int, default=0, help="seed of the random initialisation (no weights)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per calibration sequence (default: the whole stream, or each row)")
    p.add_argument("--batch-size", type=int, default=1, help="sequences per model call")
    p.add_argument("--candidates", default=None,
                   help="comma-separated retained-head budgets r to measure, or 'all' for every tile-aligned "
                        "budget (default: the short list 1,3,7)")
    p.add_argument("--constants", default=None,
                   help="'cpu', 'h200', 'measure' (time the runtime reference on --device) or a JSON file "
                        "of KernelConstants (default: cpu, or h200 on --device cuda)")
    p.add_argument("--design-length", type=int, default=131072,
                   help="key length the choice of r is optimised for (default 131072)")
    p.add_argument("--queries", type=int, default=None,
                   help="queries per indexer call to plan for (default: causal prefill, one per key)")
    p.add_argument("--device", default="cpu", help="device the model runs on (default cpu)")
    p.add_argument("--plot", default=None, help="also write a PNG of m(r) and the predicted speedup")
    args = p.parse_args(argv)
    if args.structured is None and (args.model is None or (args.tokens is None and args.text is None)):
        p.error("give --model with --tokens or --text, or --structured")
    if args.structured is not None and (args.model or args.tokens or args.text):
        p.error("--structured replaces --model, --tokens and --text")
    return args


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
    if requested[-1] >= heads:
        raise ValueError(f"--candidates: expected budgets below the layer's {heads} heads, got {requested}")
    return requested


def times_the_calls(constants_spec: str | None, device: str) -> bool:
    """Whether calibration calls are timed: only when the plan is for the device it is measured on."""
    return device.startswith("cuda") or constants_spec in (None, "cpu", "measure")


def plan_from_calls(calls: Mapping[str, Sequence], *, constants: KernelConstants, design_length: int,
                    queries: int | None, candidates: list[int] | str | None, model: Any, inputs: Any,
                    timed: bool = True) -> Plan:
    """Measure and decide every layer of ``calls`` (layer -> CapturedCalls) and assemble the plan;
    ``model`` and ``inputs`` are the plan's descriptions; ``timed``: time the calibration calls."""
    from compiler.plan.measure import choose_from_measurement, measure_layer
    from compiler.plan.progress import progress

    layers = []
    for name, layer_calls in calls.items():
        rs = layer_candidates(candidates, layer_calls[0].q.shape[2], constants)
        with progress((len(rs) + 1) * len(layer_calls), f"measure {name} (r x batches)") as step:
            measurement = measure_layer(name, layer_calls, rs, timed=timed, on_call=step)
            layers.append(choose_from_measurement(measurement, constants, design_length, queries, on_call=step))
    return Plan(model=model, inputs=inputs, design_length=design_length, queries=queries, constants=constants,
                layers=tuple(layers))


def structured_calls(spec: str, seed: int, device: str) -> tuple[dict, dict]:
    """``--structured B,S,T,H,D,K`` -> ({"structured": [call]}, inputs description)."""
    import torch

    from compiler.ops.capture_topk import CapturedCall
    from runtime.structured_indexer import structured_indexer_inputs

    try:
        B, S, T, H, D, K = (int(x) for x in spec.split(","))
    except ValueError as exc:
        raise ValueError(f"--structured: expected six ints B,S,T,H,D,K, got {spec!r}") from exc
    if not 1 <= S <= T:
        raise ValueError(f"--structured: expected 1 <= S <= T, got S={S}, T={T}")
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
    if args.tokens is not None:
        ids, source = load_token_ids(args.tokens), args.tokens
    else:
        ids, source = tokenize_text(args.text, loaded.tokenizer), args.text
    batches = batch_sequences(ids, args.seq_len, args.batch_size)
    device = torch.device(args.device)
    model = loaded.model.to(device)
    with progress(len(batches), "capture (batches)") as step:
        recorder = capture_indexer_inputs(model, [b.to(device) for b in batches], lambda i: step())
    return plan_from_calls(recorder.calls, model=loaded.description,
                           inputs=describe_tokens(ids, source, batches), **settings)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = build_plan(args)
    save_plan(plan, args.out)
    for e in plan.layers:
        pruned = "-" if e.predicted_pruned_frac is None else f"{e.predicted_pruned_frac:.3f}"
        print(f"{e.layer}: path={e.settings.path} r={e.settings.r} min_keys={e.settings.min_keys} pruned={pruned} "
              f"speedup@{plan.design_length}={e.predicted_speedup:.2f}: {e.reason}", file=sys.stderr)
    print(f"wrote {args.out} (sha256 {plan.hash[:16]}...)", file=sys.stderr)
    if args.plot:
        from compiler.plan.plot import plot_plan

        print(f"wrote {plot_plan(plan, Path(args.plot))}", file=sys.stderr)
    return 0
