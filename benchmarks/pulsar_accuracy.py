"""Does Pulsar keep a trained model's answers? Retrieval accuracy of dense, star and pulsar (every
summaries heuristic) generation with the trained Llama measuring model (GPU).

Each trial plants 4 facts at uniform depths of a held-out window (``benchmarks/models/tiny_data.py``);
the context is that window, the query a primer question with its answer followed by the scored
question (why a primer: ``benchmarks/models/tiny_eval.py``); ``runtime.pulsar.generate`` on the
uncompiled model greedily generates the 6 answer tokens. One row per (mode, heuristic, length,
blocks, trial): correct or not, the fact's depth, and the end-to-end ``generate`` time (ms, after
one untimed warm-up per configuration). Dense mode does not depend on the block count: it runs
once per trial (``blocks`` null). Results are rewritten after every configuration;
``--budget-s`` stops the run and records what was left.

    python benchmarks/pulsar_accuracy.py --model ckpt/llama --out pulsar_accuracy_h200.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "models"))
from tiny_data import FactTokens, load_tokens, planted_sequence, random_facts  # noqa: E402

from runtime.pulsar import PulsarConfig, generate  # noqa: E402
from runtime.summaries import HEURISTICS  # noqa: E402

HELDOUT = Path(__file__).resolve().parent / "models" / "heldout_tokens.npy"


def trial_inputs(rng: np.random.Generator, tokens: np.ndarray, length: int, encoder: FactTokens):
    """(context ids, query ids, answer ids, depth) of one trial, ``length`` ids in all."""
    planted = planted_sequence(rng, tokens, length, random_facts(rng, 4),
                               [int(i) for i in rng.permutation(4)[:2]], encoder)
    ids, start, answer = planted.ids, planted.questions[0], planted.answers[1]
    return ids[:start], ids[start:int(answer[0])], ids[answer], planted.depths[-1]


def configurations(lengths: list[int], blocks: list[int]):
    """(mode, heuristic, length, blocks) in run order."""
    for length in lengths:
        yield "dense", None, length, None
        for n in blocks:
            yield "star", None, length, n
            for heuristic in HEURISTICS:
                yield "pulsar", heuristic, length, n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="the Llama measuring model's checkpoint")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768])
    parser.add_argument("--blocks", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        parser.error(f"--model: {args.model} holds no config.json")
    if not args.out.parent.is_dir():
        parser.error(f"--out: directory {args.out.parent} does not exist")
    for flag in ("lengths", "blocks", "trials"):
        values = getattr(args, flag) if isinstance(getattr(args, flag), list) else [getattr(args, flag)]
        if min(values) < 1:
            parser.error(f"--{flag}: expected positive integers, got {values}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to(device).eval()
    encoder = FactTokens(AutoTokenizer.from_pretrained(args.model))
    tokens = load_tokens(HELDOUT)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "model": str(args.model), "trials": args.trials, "rows": [], "skipped": []}
    started = time.time()
    for mode, heuristic, length, blocks in configurations(args.lengths, args.blocks):
        if time.time() - started > args.budget_s:
            result["skipped"].append({"mode": mode, "heuristic": heuristic, "length": length, "blocks": blocks})
            continue
        block_size = length // (blocks or 4)
        config = PulsarConfig(block_size=block_size, mode=mode, **({"heuristic": heuristic} if heuristic else {}))
        rng = np.random.default_rng(777 + length)  # the same trials for every configuration
        trials = [trial_inputs(rng, tokens, length, encoder) for _ in range(args.trials)]
        context, query, _, _ = trials[0]
        generate(model, context, query, config, max_new_tokens=6, stop_ids=())  # warm-up, untimed
        for trial, (context, query, answer, depth) in enumerate(trials):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = generate(model, context, query, config, max_new_tokens=6, stop_ids=())
            ms = (time.perf_counter() - t0) * 1e3
            result["rows"].append({"mode": mode, "heuristic": heuristic, "length": length, "blocks": blocks,
                                   "trial": trial, "correct": bool(torch.equal(out[:6], answer)),
                                   "depth": round(depth, 3), "ms": round(ms, 2)})
        done = [r for r in result["rows"] if (r["mode"], r["heuristic"], r["length"], r["blocks"]) ==
                (mode, heuristic, length, blocks)]
        print(json.dumps({"mode": mode, "heuristic": heuristic, "length": length, "blocks": blocks,
                          "accuracy": sum(r["correct"] for r in done) / len(done),
                          "median_ms": sorted(r["ms"] for r in done)[len(done) // 2]}), flush=True)
        args.out.write_text(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
