"""Does Pulsar keep a trained model's answers where they need more than one block? Accuracy of
dense, Star and Pulsar (every summaries heuristic) generation with the Llama measuring model on
tasks spread across blocks, and the phase-1 cost per block of Star and Pulsar, in one run (GPU).

Trials: ``benchmarks/cross_block_tasks.py`` (a held-out context of exactly L tokens with planted
single facts, two-hop chains and counts, each task's lines in distinct blocks of L / min(blocks)
tokens, hence of every block count run). Every configuration (mode, heuristic, L, blocks) runs the
same trials; per trial, phase 1 (``runtime.pulsar.encode_context`` over the configuration's
layout, on the uncompiled model) runs once and each instance's query is decoded greedily over the
kept KV (``runtime.pulsar.decode``, as many tokens as its answer): correct when they equal the
answer. Trials run in rounds of ``--round`` (every configuration, then the next round); a round is
not started when the last one's time would overrun ``--budget-s``, so every cell holds the same
trials. A cell (mode, heuristic, L, blocks, kind) reports its correct count, trials, the Wilson 95%
interval and its outcomes in trial order. Dense does not depend on the block count (``blocks``
null).

Cost, per configuration on the first trial's context: the per-host inputs of
``runtime.assembly.assemble`` without a shared spine (Star: [B_0 ‖ B_i]; Pulsar: [sink ‖ Σ_0 … Σ_{i-1}
‖ B_i]; dense: the whole context as one input), their tokens, phase-1 FLOPs
(``benchmarks.phase1_flops`` from the model's configuration) and the time of each input's forward
alone (the uncompiled model with its own attention, ``harness.measure`` median of ``--reps`` after
a warm-up): what each host of a Star or Pulsar deployment runs.

Output: ``--out`` JSON, and its tables and plot (``benchmarks/pulsar_accuracy_report.py``) beside
it as ``.md`` and ``.png``.

    python benchmarks/pulsar_accuracy.py --model benchmarks/models/tiny-llama --out benchmarks/results/NAME.json
    python benchmarks/pulsar_accuracy.py --smoke --out /tmp/smoke.json   # CPU: tiny lengths, 2 trials
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks" / "models")]
from benchmarks import harness  # noqa: E402
from benchmarks.cross_block_tasks import HELDOUT, Trial, make_trial, tokenizer_encoder  # noqa: E402
from benchmarks.phase1_flops import DecoderShape, host_lengths  # noqa: E402
from benchmarks.pulsar_accuracy_report import write_report  # noqa: E402
from proportions import wilson_interval  # noqa: E402
from tiny_data import load_tokens  # noqa: E402
from tiny_tasks import KINDS  # noqa: E402

from runtime.assembly import assemble  # noqa: E402
from runtime.pulsar import PulsarConfig, decode, encode_context  # noqa: E402
from runtime.summaries import HEURISTICS  # noqa: E402

SMOKE = dict(lengths=[256, 512], blocks=[2, 4], trials=2, round=2, sink=16, chunk=8, reps=1)
"""``--smoke``'s defaults: the committed model on the CPU at tiny lengths (flags given still apply)."""


def configurations(lengths: list[int], blocks: list[int], heuristics: list[str]):
    """(mode, heuristic, length, blocks) in run order: per length dense, then per block count
    Star and Pulsar with each heuristic."""
    for length in lengths:
        yield "dense", None, length, None
        for n in blocks:
            yield "star", None, length, n
            for heuristic in heuristics:
                yield "pulsar", heuristic, length, n


def pulsar_config(mode: str, heuristic: str | None, length: int, blocks: int | None, args) -> PulsarConfig:
    extra = {} if heuristic is None else {"heuristic": heuristic}
    return PulsarConfig(block_size=length // (blocks or 1), mode=mode, sink=args.sink, chunk=args.chunk,
                        ratio=args.ratio, **extra)


def decoded(model, trial: Trial, config: PulsarConfig, device: torch.device) -> list[torch.Tensor]:
    """Per instance of ``trial`` (``KINDS`` order), the greedy continuation of its query (as many
    tokens as its answer) over one phase 1 of the context: what ``runtime.pulsar.generate`` gives
    for each query alone."""
    context = trial.context_ids.to(device)
    layout = config.layout(context)
    kept = encode_context(model, context, layout)
    return [decode(model, kept, x.query_ids, query_position_start=layout.query_position_start,
                   max_new_tokens=x.answer_ids.numel(), stop_ids=()) for x in trial.instances]


def answers(model, trial: Trial, config: PulsarConfig, device: torch.device) -> list[bool]:
    """Per instance of ``trial`` (``KINDS`` order), whether greedy decoding gives its answer."""
    outputs = decoded(model, trial, config, device)
    return [bool(torch.equal(out, x.answer_ids)) for out, x in zip(outputs, trial.instances)]


def cost(model, shape: DecoderShape, context: torch.Tensor, config: PulsarConfig, reps: int,
         device: torch.device) -> dict:
    """Tokens, phase-1 FLOPs and forward time (ms) of every per-host input (module docstring)."""
    if config.mode == "dense":
        layout = assemble(context, context.numel(), mode="dense")
    else:
        layout = assemble(context, config.block_size, mode=config.mode, sink=config.sink, chunk=config.chunk,
                          ratio=config.ratio, heuristic=config.heuristic)
    tokens, ms, at = host_lengths(layout), [], 0
    for n in tokens:
        ids = context[layout.source_index[at:at + n]].to(device)[None]
        positions = layout.position_ids[at:at + n].to(device)[None]
        with torch.no_grad():
            ms.append(harness.measure(lambda: model(input_ids=ids, position_ids=positions, use_cache=False,
                                                    logits_to_keep=1), device, reps).ms)
        at += n
    flops = [shape.causal_input_flops(n) for n in tokens]
    return {"tokens_per_block": tokens, "flops_per_block": flops, "ms_per_block": [round(x, 3) for x in ms],
            "max_flops": max(flops), "max_ms": round(max(ms), 3), "mean_ms": round(sum(ms) / len(ms), 3)}


def cells(outcomes: dict[tuple, list[bool]]) -> list[dict]:
    """One summary per (mode, heuristic, length, blocks, kind): correct, trials, accuracy, Wilson 95%."""
    out = []
    for (mode, heuristic, length, blocks, kind), hits in outcomes.items():
        low, high = wilson_interval(sum(hits), len(hits))
        out.append({"mode": mode, "heuristic": heuristic, "length": length, "blocks": blocks, "kind": kind,
                    "trials": len(hits), "correct": sum(hits), "accuracy": round(sum(hits) / len(hits), 4),
                    "wilson_95": [round(low, 4), round(high, 4)], "outcomes": "".join("01"[h] for h in hits)})
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "benchmarks" / "models" / "tiny-llama",
                        help="the Llama measuring model's checkpoint")
    parser.add_argument("--out", type=Path, required=True, help="results JSON (.md and .png beside it)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[32768, 65536])
    parser.add_argument("--blocks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--heuristics", nargs="+", default=list(HEURISTICS), choices=HEURISTICS)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--round", type=int, default=25, help="trials per round of every configuration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sink", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--ratio", type=float, default=0.125, help="summary budget per block")
    parser.add_argument("--reps", type=int, default=3, help="timed forwards per per-host input")
    parser.add_argument("--budget-s", type=float, default=420.0, help="start no round that could end after this")
    parser.add_argument("--smoke", action="store_true", help=f"CPU smoke run: {SMOKE}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    if "--smoke" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**SMOKE)
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        parser.error(f"--model: {args.model} holds no config.json")
    if not args.out.parent.is_dir():
        parser.error(f"--out: directory {args.out.parent} does not exist")
    if min(args.lengths + args.blocks + [args.trials, args.round, args.reps]) < 1:
        parser.error("--lengths, --blocks, --trials, --round and --reps take positive integers")
    coarse = min(args.blocks)
    if any(n % coarse for n in args.blocks) or any(length % max(args.blocks) for length in args.lengths):
        parser.error(f"--blocks must be multiples of the smallest, and every length a multiple of the largest "
                     f"(so the trials' blocks nest): {args.blocks}, {args.lengths}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    from transformers import AutoModelForCausalLM

    started = time.time()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    shape = DecoderShape.from_config(model.config)
    encoder = tokenizer_encoder(args.model)
    tokens = load_tokens(HELDOUT)
    configs = list(configurations(args.lengths, args.blocks, args.heuristics))
    result = harness.header(device, model=str(args.model), dtype=str(dtype), seed=args.seed, sink=args.sink,
                            chunk=args.chunk, ratio=args.ratio, trials_asked=args.trials,
                            lengths=args.lengths, blocks=args.blocks, heuristics=args.heuristics,
                            kinds=list(KINDS), trials_placed_in_blocks=min(args.blocks))
    outcomes: dict[tuple, list[bool]] = {}
    result["cost"], result["rounds"] = [], []
    first, last_round_s = 0, 0.0
    while first < args.trials:
        if first and time.time() - started + last_round_s > args.budget_s:
            result["stopped"] = f"budget: {first} of {args.trials} trials run"
            break
        t_round = time.time()
        indices = range(first, min(first + args.round, args.trials))
        trials = {length: [make_trial(tokens, encoder, length, min(args.blocks), i, args.seed) for i in indices]
                  for length in args.lengths}
        for mode, heuristic, length, blocks in configs:
            config = pulsar_config(mode, heuristic, length, blocks, args)
            if first == 0:
                result["cost"].append({"mode": mode, "heuristic": heuristic, "length": length, "blocks": blocks,
                                       **cost(model, shape, trials[length][0].context_ids, config, args.reps, device)})
            for trial in trials[length]:
                for kind, hit in zip(KINDS, answers(model, trial, config, device)):
                    outcomes.setdefault((mode, heuristic, length, blocks, kind), []).append(hit)
        last_round_s = time.time() - t_round
        result["rounds"].append({"trials": list(indices), "seconds": round(last_round_s, 1)})
        first = indices.stop
        result["cells"] = cells(outcomes)
        print(f"round to trial {first}: {last_round_s:.1f} s", flush=True)
        write_report(args.out, result)
    result["seconds"] = round(time.time() - started, 1)
    write_report(args.out, result)
    return result


if __name__ == "__main__":
    main()
