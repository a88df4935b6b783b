"""Long-context task instances from held-out text whose answers need information from several
blocks: planted facts (single), two-hop chains whose two lines sit in different blocks, counts of
lines spread across blocks (formats: ``benchmarks/models/tiny_tasks.py``).

A trial is one context of exactly ``length`` tokens: a window of the held-out tokens
(``benchmarks/models/heldout_tokens.npy``, never trained on) with ``trial_composition(length)``'s
tasks and one primer fact planted by ``tiny_tasks.plant`` in blocks of ``length // blocks``
tokens, so a task's lines sit in distinct blocks of that size and of every size dividing it (the
trial serves 4, 8 and 16 blocks alike when ``blocks`` is 4 and ``length`` divides by 16). Its
instances, one per kind, ask the first task of that kind (the others are distractors):
``query_ids`` are the primer's question and answer, then the instance's question (why a primer:
``benchmarks/models/tiny_eval.py``), ``answer_ids`` what the model must generate, ``prompt`` the
query's text. Trials are deterministic from (seed, length, trial index) and independent of each
other, so any subset of indices can be made alone.

    python benchmarks/cross_block_tasks.py --length 65536 --blocks 4 --trials 100 --out tasks_64k
    (writes tasks_64k/contexts.npy [trials, length] uint16 and tasks_64k/instances.json)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

MODELS = Path(__file__).resolve().parent / "models"
sys.path.insert(0, str(MODELS))
from tiny_data import load_tokens  # noqa: E402
from tiny_tasks import KINDS, Composition, TaskTokens, plant, sample_tasks  # noqa: E402

HELDOUT = MODELS / "heldout_tokens.npy"


@dataclass(frozen=True)
class Instance:
    """One question about a trial's context (module docstring); ``line_starts`` and
    ``line_blocks`` give the context position and the block of each line it needs."""

    trial: int
    kind: str
    query_ids: torch.Tensor
    answer_ids: torch.Tensor
    prompt: str
    answer: str
    line_starts: tuple[int, ...]
    line_blocks: tuple[int, ...]


@dataclass(frozen=True)
class Trial:
    """A context of ``length`` ids (int64) and its instances, one per kind in ``KINDS`` order."""

    index: int
    context_ids: torch.Tensor
    instances: tuple[Instance, ...]


def trial_composition(length: int) -> Composition:
    """The tasks of a trial besides the primer: one asked per kind, and distractors (one more of
    each per 8192 tokens for singles and chains, per 16384 for counts; at most 3, 3 and 2)."""
    return Composition(single=1 + min(3, length // 8192), two_hop=1 + min(3, length // 8192),
                       count=1 + min(2, length // 16384))


def make_trial(tokens: np.ndarray, encoder: TaskTokens, length: int, blocks: int, index: int,
               seed: int = 0) -> Trial:
    """Trial ``index`` of ``length`` tokens over ``tokens`` (module docstring)."""
    if length % blocks:
        raise ValueError(f"length {length} is not a multiple of blocks={blocks}")
    rng = np.random.default_rng([seed, length, index])
    composition = trial_composition(length)
    tasks = sample_tasks(rng, Composition(composition.single + 1, composition.two_hop, composition.count,
                                          composition.max_count))
    primer, tasks = tasks[0], tasks[1:]
    block_size = length // blocks
    context, starts = plant(rng, tokens, length, block_size, [encoder.lines(t) for t in [primer] + tasks])
    primer_query, primer_answer = encoder.question(primer)
    instances = []
    for kind in KINDS:
        i = next(i for i, task in enumerate(tasks) if task.kind == kind)
        query, answer = encoder.question(tasks[i])
        query_ids = torch.tensor(primer_query + primer_answer + query, dtype=torch.int64)
        instances.append(Instance(index, kind, query_ids, torch.tensor(answer, dtype=torch.int64),
                                  primer.question + primer.answer + tasks[i].question, tasks[i].answer,
                                  tuple(starts[i + 1]), tuple(s // block_size for s in starts[i + 1])))
    return Trial(index, context, tuple(instances))


def tokenizer_encoder(tokenizer_dir: Path) -> TaskTokens:
    from transformers import AutoTokenizer

    return TaskTokens(AutoTokenizer.from_pretrained(tokenizer_dir))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, required=True, help="context tokens")
    parser.add_argument("--blocks", type=int, default=4, help="the coarsest block count the lines are spread over")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--first", type=int, default=0, help="index of the first trial")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokens", type=Path, default=HELDOUT, help="uint16 token array (held-out text)")
    parser.add_argument("--tokenizer", type=Path, default=MODELS / "tokenizer")
    parser.add_argument("--out", type=Path, required=True, help="folder for contexts.npy and instances.json")
    args = parser.parse_args(argv)
    if args.length < 1 or args.blocks < 1 or args.trials < 1 or args.first < 0:
        parser.error("--length, --blocks and --trials must be positive, --first non-negative")
    if args.length % args.blocks:
        parser.error(f"--length {args.length} is not a multiple of --blocks {args.blocks}")
    tokens = load_tokens(args.tokens)
    encoder = tokenizer_encoder(args.tokenizer)
    trials = [make_trial(tokens, encoder, args.length, args.blocks, i, args.seed)
              for i in range(args.first, args.first + args.trials)]
    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / "contexts.npy", torch.stack([t.context_ids for t in trials]).numpy().astype(np.uint16))
    instances = [{**{k: v for k, v in asdict(x).items() if k not in ("query_ids", "answer_ids")},
                  "query_ids": x.query_ids.tolist(), "answer_ids": x.answer_ids.tolist()}
                 for t in trials for x in t.instances]
    header = {"length": args.length, "blocks": args.blocks, "seed": args.seed, "first": args.first,
              "trials": args.trials, "composition": asdict(trial_composition(args.length)),
              "tokens": str(args.tokens), "tokens_sha256": hashlib.sha256(tokens.tobytes()).hexdigest()}
    (args.out / "instances.json").write_text(json.dumps({**header, "instances": instances}, indent=1))
    print(json.dumps({**header, "instances": len(instances), "out": str(args.out)}))


if __name__ == "__main__":
    main()
