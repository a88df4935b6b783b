"""End-to-end Pulsar generation on one device: HF ``generate`` against ``runtime.pulsar.generate`` on
the uncompiled model and on the model compiled with ``backend="pulsar_dosa"``.

    python benchmarks/pulsar_e2e.py --out benchmarks/results/pulsar_e2e_h200.json --md benchmarks/results/pulsar_e2e_h200.md
    python benchmarks/pulsar_e2e.py --smoke                         # CPU, tiny model, ~1 min

A ``LlamaForCausalLM`` of Llama-3.1-8B layer shapes (``--layers 2``, random weights, bf16), random
context ids of L tokens, 16 query ids, 8 greedy new tokens. Rows: ``hf_generate`` (dense only),
``generate_eager`` and ``generate_compiled`` for modes dense / star / pulsar (block L/4); ``ms``
is the median of ``--reps`` host-paced runs after a warm-up, garbage collected before each; the
parts ``layout_ms``, ``phase1_ms``, ``phase2_decode_ms`` each timed alone; ``packed_tokens`` and
``attention_pairs`` the work. Checks (reported: random weights tie logits): eager and compiled
tokens equal, dense eager and HF equal. Targets: eager within 10% of its baseline. Results after
every row; ``--budget-s`` records the rest as skipped; ``--profile FILE`` adds profiler traces."""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks import harness
from runtime.attention_layout import attention_kernel
from runtime.pulsar import PulsarConfig, decode, encode_context, generate

HOWS = ("hf_generate", "generate_eager", "generate_compiled")
PARTS = ("layout_ms", "phase1_ms", "phase2_decode_ms")
"""The parts of ``generate`` timed alone, in the order it runs them."""
MODES = ("dense", "star", "pulsar")
TARGET = 1.10
"""``generate_eager`` may take at most this times its baseline's time."""


@dataclass(frozen=True)
class Settings:
    """One benchmark run (``--smoke`` replaces the model shape, lengths, dtype and device)."""

    lengths: tuple[int, ...] = (32768, 131072)
    layers: int = 2
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    mlp: int = 14336
    vocab: int = 128256
    query_tokens: int = 16
    new_tokens: int = 8
    blocks: int = 4
    reps: int = 5
    dtype: str = "bfloat16"
    device: str = "cuda"
    downstream: str = "inductor"
    budget_s: float = 300.0


SMOKE = dict(lengths=(192,), hidden=64, heads=4, kv_heads=2, head_dim=16, mlp=128, vocab=256,
             query_tokens=4, new_tokens=3, reps=1, dtype="float32", device="cpu", budget_s=600.0)


def build_model(settings: Settings) -> LlamaForCausalLM:
    """The random-weight Llama (seed 0) on the settings' device and dtype, eval mode, no eos id."""
    positions = max(settings.lengths) + settings.query_tokens + settings.new_tokens
    config = LlamaConfig(
        vocab_size=settings.vocab, hidden_size=settings.hidden, intermediate_size=settings.mlp,
        num_hidden_layers=settings.layers, num_attention_heads=settings.heads,
        num_key_value_heads=settings.kv_heads, head_dim=settings.head_dim, max_position_embeddings=positions,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": min(8192, positions // 2)},
        bos_token_id=0, eos_token_id=None, pad_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(settings.device):
        model = LlamaForCausalLM(config)
    model = model.to(getattr(torch, settings.dtype)).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def workload(length: int, settings: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random context ids [length] and query ids (CPU, seeded by the length)."""
    gen = torch.Generator().manual_seed(length)
    return (torch.randint(1, settings.vocab, (length,), generator=gen),
            torch.randint(1, settings.vocab, (settings.query_tokens,), generator=gen))


def pulsar_config(mode: str, length: int, settings: Settings) -> PulsarConfig:
    """Block size L / blocks; summary settings at their defaults (a tiny block gets a smaller sink)."""
    block = -(-length // settings.blocks)
    return PulsarConfig(block, mode=mode, sink=min(64, block))


def layout_work(config: PulsarConfig, context_ids: torch.Tensor) -> dict:
    """Phase-1 packed tokens and visible (query, key) pairs of the layout."""
    layout = config.layout(context_ids)
    packed = torch.arange(layout.source_index.numel())
    pairs = layout.prefix_end + (packed - layout.segment_start + 1)
    return {"packed_tokens": int(packed.numel()), "attention_pairs": int(pairs.sum())}


def hf_generate(model, context_ids: torch.Tensor, query_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy ``model.generate`` on ``[context ‖ query]``; the new token ids (1-D, CPU)."""
    device = next(model.parameters()).device
    ids = torch.cat([context_ids, query_ids])[None].to(device)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False)
    return out[0, ids.shape[1]:].cpu()


class Recorder:
    """Rows and checks, written to JSON and markdown after every row; a time budget."""

    def __init__(self, settings: Settings, out: Optional[Path], md: Optional[Path]):
        self.settings, self.out, self.md = settings, out, md
        self.start = time.perf_counter()
        self.rows: list[dict] = []
        self.notes: dict = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def over_budget(self) -> bool:
        return self.elapsed() > self.settings.budget_s

    def add(self, row: dict) -> None:
        row["elapsed_s"] = round(self.elapsed(), 1)
        self.rows.append(row)
        shown = {k: row[k] for k in ("how", "mode", "L", "ms", *PARTS, "error") if row.get(k) is not None}
        print(f"[{row['elapsed_s']:7.1f}s] {shown}", flush=True)
        self.write()

    def row(self, how: str, mode: str, length: int) -> Optional[dict]:
        for row in self.rows:
            if (row["how"], row["mode"], row["L"]) == (how, mode, length) and row.get("tokens") is not None:
                return row
        return None

    def checks(self) -> list[dict]:
        """Token agreement: eager vs compiled per mode, dense eager vs HF generate."""
        result = []
        for length in self.settings.lengths:
            pairs = [("generate_eager", "generate_compiled", mode) for mode in MODES]
            pairs.append(("generate_eager", "hf_generate", "dense"))
            for first, second, mode in pairs:
                a, b = self.row(first, mode, length), self.row(second, mode, length)
                if a is None or b is None:
                    continue
                diff = next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), None)
                if diff is None and len(a["tokens"]) != len(b["tokens"]):
                    diff = min(len(a["tokens"]), len(b["tokens"]))
                result.append({"L": length, "mode": mode, "compare": f"{first} vs {second}",
                               "tokens_equal": diff is None, "first_difference": diff})
        return result

    def targets(self) -> list[dict]:
        """Eager time against its baseline: HF generate (dense), the compiled path (star, pulsar)."""
        result = []
        for length in self.settings.lengths:
            for mode in MODES:
                baseline = "hf_generate" if mode == "dense" else "generate_compiled"
                eager, base = self.row("generate_eager", mode, length), self.row(baseline, mode, length)
                if eager is None or base is None:
                    continue
                ratio = eager["ms"] / base["ms"]
                result.append({"L": length, "mode": mode, "baseline": baseline, "ratio": round(ratio, 3),
                               "meets_target": ratio <= TARGET})
        return result

    def payload(self) -> dict:
        return harness.header(self.settings.device, benchmark="pulsar_e2e", settings=asdict(self.settings),
                              notes=self.notes, rows=self.rows, checks=self.checks(), targets=self.targets(),
                              elapsed_s=round(self.elapsed(), 1))

    def write(self) -> None:
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.payload(), indent=1) + "\n")
            os.replace(tmp, self.out)
        if self.md is not None:
            self.md.parent.mkdir(parents=True, exist_ok=True)
            self.md.write_text(markdown(self.payload()))


def markdown(payload: dict) -> str:
    """The results as markdown tables (times per how, targets and token agreement)."""
    s = payload["settings"]
    lines = [f"# Pulsar end to end: `generate` against HF `generate` ({payload['device']})", "",
             f"{s['layers']}-layer Llama (hidden {s['hidden']}, {s['heads']}/{s['kv_heads']} heads, MLP {s['mlp']}, "
             f"vocab {s['vocab']}), {s['dtype']}, random weights; {s['query_tokens']} query tokens, "
             f"{s['new_tokens']} new tokens, block L/{s['blocks']}; median of {s['reps']} after a warm-up "
             f"(garbage collected and device synchronised before each timed run); "
             f"compiled: `backend=\"pulsar_dosa\"`, downstream {s['downstream']}. "
             f"torch {payload['versions']['torch']}, transformers {payload['versions']['transformers']}, "
             f"triton {payload['versions']['triton']}.", "",
             "Parts of `generate`, each timed alone: layout assembly (on the device, summaries included), "
             "phase 1 (context encoding), phase 2 + decode (over the kept KV).", "",
             "| L | mode | HF generate ms | generate eager ms | generate compiled ms | layout ms | eager phase 1 ms "
             "| compiled phase 1 ms | eager phase 2 + decode ms | compiled phase 2 + decode ms | phase-1 tokens "
             "| attention pairs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = {(r["how"], r["mode"], r["L"]): r for r in payload["rows"]}

    def cell(how, mode, length, key="ms"):
        row = rows.get((how, mode, length))
        if row is None:
            return "-"
        if row.get("error"):
            return row["error"].split(":")[0]
        value = row.get(key)
        return "-" if value is None else f"{value:.1f}"

    for length in s["lengths"]:
        for mode in MODES:
            work = next((r for r in payload["rows"] if r["mode"] == mode and r["L"] == length
                         and r.get("packed_tokens") is not None), {})
            lines.append(f"| {length} | {mode} | {cell('hf_generate', mode, length)} | "
                         f"{cell('generate_eager', mode, length)} | {cell('generate_compiled', mode, length)} | "
                         f"{cell('generate_eager', mode, length, 'layout_ms')} | "
                         f"{cell('generate_eager', mode, length, 'phase1_ms')} | "
                         f"{cell('generate_compiled', mode, length, 'phase1_ms')} | "
                         f"{cell('generate_eager', mode, length, 'phase2_decode_ms')} | "
                         f"{cell('generate_compiled', mode, length, 'phase2_decode_ms')} | "
                         f"{work.get('packed_tokens', '-')} | {work.get('attention_pairs', '-')} |")
    lines += ["", "Targets (eager time / baseline time, at most 1.10):", "",
              "| L | mode | baseline | ratio | meets target |", "|---|---|---|---|---|"]
    lines += [f"| {t['L']} | {t['mode']} | {t['baseline']} | {t['ratio']:.3f} | {t['meets_target']} |"
              for t in payload["targets"]]
    lines += ["", "Generated tokens (reported, not asserted: random weights have near-tied logits):", "",
              "| L | mode | compared | equal | first difference |", "|---|---|---|---|---|"]
    lines += [f"| {c['L']} | {c['mode']} | {c['compare']} | {c['tokens_equal']} | "
              f"{'-' if c['first_difference'] is None else c['first_difference']} |" for c in payload["checks"]]
    if payload["notes"]:
        lines += ["", "Notes: " + "; ".join(f"{k}: {v}" for k, v in payload["notes"].items())]
    return "\n".join(lines) + "\n"


def run_row(recorder: Recorder, how: str, mode: str, length: int, device: torch.device,
            run: Callable[[], torch.Tensor], parts: Optional[Callable[[], dict]], work: dict) -> None:
    """Warm up, time ``run`` (then ``parts``: the times of its parts), record the row; an
    out-of-memory error is recorded."""
    row = {"how": how, "mode": mode, "L": length, "ms": None, "tokens": None, **work}
    if recorder.over_budget():
        recorder.add({**row, "error": f"skipped: time budget of {recorder.settings.budget_s:.0f} s spent"})
        return
    try:
        timing = harness.measure(run, device, recorder.settings.reps, host_paced=True, before=gc.collect)
        row["ms"], tokens = timing.ms, timing.out
        row["tokens"] = [int(t) for t in tokens]
        if parts is not None:  # warmed up by the runs above
            row.update(parts())
        if device.type == "cuda":
            row["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    except torch.cuda.OutOfMemoryError as error:
        row["error"] = f"OutOfMemoryError: {str(error).splitlines()[0]}"
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
    recorder.add(row)


def part_times(model, context_ids: torch.Tensor, query_ids: torch.Tensor, config: PulsarConfig,
               settings: Settings, device: torch.device) -> dict:
    """``PARTS``: median ms of each part of ``generate`` run alone as ``generate`` runs it (no
    warm-up: run after ``generate`` itself), each part fed the previous part's result."""
    def median(fn: Callable[[], object]) -> tuple[float, object]:
        timing = harness.measure(fn, device, settings.reps, warmup=0, host_paced=True, before=gc.collect)
        return timing.ms, timing.out

    layout_ms, layout = median(lambda: config.layout(context_ids.to(device)))
    phase1_ms, kept = median(lambda: encode_context(model, context_ids, layout))
    decode_ms, _ = median(lambda: decode(model, kept, query_ids, query_position_start=layout.query_position_start,
                                         max_new_tokens=settings.new_tokens))
    return dict(zip(PARTS, (layout_ms, phase1_ms, decode_ms)))


def pulsar_rows(recorder: Recorder, how: str, model, length: int, settings: Settings, device: torch.device) -> None:
    """``how`` rows of every mode at ``length`` through ``runtime.pulsar.generate`` on ``model``."""
    context_ids, query_ids = workload(length, settings)
    for mode in MODES:
        config = pulsar_config(mode, length, settings)
        run_row(recorder, how, mode, length, device,
                lambda: generate(model, context_ids, query_ids, config, max_new_tokens=settings.new_tokens),
                lambda: part_times(model, context_ids, query_ids, config, settings, device),
                layout_work(config, context_ids))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU (a check that the script runs)")
    parser.add_argument("--lengths", type=int, nargs="+", help="context lengths (default 32768 131072)")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--reps", type=int)
    parser.add_argument("--downstream", choices=("inductor", "eager"), help="compiler after the pulsar_dosa passes")
    parser.add_argument("--budget-s", type=float, help="skip the rows left once this many seconds have passed")
    parser.add_argument("--out", type=Path, help="JSON results")
    parser.add_argument("--md", type=Path, help="markdown table")
    parser.add_argument("--profile", type=Path,
                        help="after the rows: one torch.profiler trace of generate per mode, eager and "
                             "compiled, at the first length; the top operators of each to this text file")
    args = parser.parse_args(argv)
    settings = Settings(**SMOKE) if args.smoke else Settings()
    overrides = {"lengths": tuple(args.lengths) if args.lengths else None, "layers": args.layers, "reps": args.reps,
                 "downstream": args.downstream, "budget_s": args.budget_s}
    settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    if settings.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --smoke on the CPU")
    device = torch.device(settings.device)
    recorder = Recorder(settings, args.out, args.md)
    print(f"settings: {settings}", flush=True)

    model = build_model(settings)
    kernel = attention_kernel(device)  # before anything imports compiler: what an uncompiled model gets
    recorder.notes["two_interval_kernel"] = f"{kernel.__module__}.{kernel.__qualname__}"
    recorder.notes["compiler_imported_before_first_row"] = "compiler" in sys.modules
    torch._dynamo.config.recompile_limit = 64
    compiled = torch.compile(model, backend="pulsar_dosa", options={"downstream": settings.downstream})
    for length in settings.lengths:
        context_ids, query_ids = workload(length, settings)
        run_row(recorder, "hf_generate", "dense", length, device,
                lambda: hf_generate(model, context_ids, query_ids, settings.new_tokens), None, {})
        pulsar_rows(recorder, "generate_eager", model, length, settings, device)
        pulsar_rows(recorder, "generate_compiled", compiled, length, settings, device)
    recorder.write()
    print(markdown(recorder.payload()), flush=True)
    if args.profile is not None:
        write_profiles(args.profile, {"generate_eager": model, "generate_compiled": compiled},
                       settings.lengths[0], settings, device)
    return 0


def write_profiles(path: Path, models: dict, length: int, settings: Settings, device: torch.device) -> None:
    """One profiled ``generate`` (after a warm-up call) per mode and model at ``length``: the top
    operators by self device time (by self CPU time off CUDA), written to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    context_ids, query_ids = workload(length, settings)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    sections = []
    for how, model in models.items():
        for mode in MODES:
            config = pulsar_config(mode, length, settings)
            run = lambda: generate(model, context_ids, query_ids, config, max_new_tokens=settings.new_tokens)  # noqa: E731
            run()
            gc.collect()
            with profile(activities=activities) as trace:
                run()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            table = trace.key_averages().table(sort_by=sort_by, row_limit=25)
            sections.append(f"## {how}, {mode}, L = {length}\n\n{table}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(sections), encoding="utf-8")
    print(f"profiles: {path}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
