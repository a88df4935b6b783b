"""Time of ``runtime.summaries.select_summaries`` at L = 131072 on one device, against phase 1.

Token ids: the words and punctuation marks of the Python standard library's ``*.py`` files (a
regular expression split), each mapped to ``crc32(word) % 131072``: real text with a Zipf-like
id distribution and about Tekken's vocabulary size, available on a host without tokenizer files.
Every heuristic of ``HEURISTICS`` at block sizes 4096 and L/4: the median of ``--reps`` timed
calls after warm-up (CUDA: synchronised wall time; CPU: process CPU time, one thread). The same
run checks that the device selects exactly the positions the CPU selects. Phase 1 for reference
(``benchmarks/results/pulsar_phase1_h200.json``): Pulsar at L = 131072 per device with its 4 blocks on 4
devices, and on one device.

    python -m benchmarks.summary_timing --out $OUT/summary_timing_h200.json      # CUDA when present
    python -m benchmarks.summary_timing --smoke --out /tmp/summary_timing.json   # CPU, L = 8192
"""
from __future__ import annotations

import argparse
import json
import re
import sysconfig
import time
import zlib
from pathlib import Path

import torch

from benchmarks import harness
from runtime.summaries import HEURISTICS, select_summaries

LENGTH = 131072
VOCAB = 131072
PHASE1_FILE = Path(__file__).resolve().parent / "results" / "pulsar_phase1_h200.json"


def stdlib_word_ids(length: int) -> torch.Tensor:
    """int64 [length]: crc32 ids of the standard library's words and punctuation, file-name order."""
    words = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        words += re.findall(r"\w+|[^\w\s]", path.read_text(encoding="utf-8"))
        if len(words) >= length:
            break
    if len(words) < length:
        raise SystemExit(f"the standard library holds {len(words)} words, fewer than {length}")
    return torch.tensor([zlib.crc32(w.encode()) % VOCAB for w in words[:length]], dtype=torch.int64)


def phase1_references() -> dict[str, float]:
    """Pulsar phase 1 at L = 131072 from PHASE1_FILE: per device when its 4 blocks are spread over
    4 devices (each device also runs the selection), and on one device with the shared spine."""
    data = json.loads(PHASE1_FILE.read_text())
    ms = {r["mode"]: r["phase1_ms"] for r in data["rows"] if r["L"] == LENGTH}
    return {"per_device_of_4": ms["pulsar"], "one_device": ms["pulsar+spine"]}


def markdown(result: dict) -> str:
    """The report of a result (``main``'s JSON)."""
    ref = result["phase1_ms"]
    lines = [f"# select_summaries time at L = {result['length']} on {result['device']} "
             f"(torch {harness.versions_of(result)['torch']})", "",
             f"Median of {result['reps']} calls. Phase 1 of Pulsar at L = 131072 ({result['phase1_source']}, "
             f"2 Llama-3.1-8B-shaped layers): {ref['per_device_of_4']:.1f} ms per device with its 4 blocks on 4 "
             f"devices (each device also selects the summaries), {ref['one_device']:.1f} ms on one device. "
             "The target is at most 1%.", "",
             "| heuristic | block | ms | % of phase 1 per device of 4 | % of phase 1 on one device | "
             "same positions as CPU |", "|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['heuristic']} | {r['block_size']} | {r['ms']:.2f} | "
              f"{100 * r['ms'] / ref['per_device_of_4']:.2f}% | {100 * r['ms'] / ref['one_device']:.2f}% | "
              f"{'yes' if r['same_as_cpu'] else 'no'} |" for r in result["rows"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="L = 8192, 3 reps")
    parser.add_argument("--out", type=Path, required=True, help="JSON path; the markdown goes beside it (.md)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    length, reps = (8192, 3) if args.smoke else (LENGTH, args.reps)
    ids_cpu = stdlib_word_ids(length)
    ids = ids_cpu.to(device)
    reference = phase1_references()
    rows, failures = [], []
    for heuristic in HEURISTICS:
        for block_size in (4096, length // 4):
            got = select_summaries(ids, block_size, heuristic=heuristic)
            want = select_summaries(ids_cpu, block_size, heuristic=heuristic)
            same = all(torch.equal(g.cpu(), w) for g, w in zip(got, want))
            if not same:
                failures.append(f"{heuristic}/B={block_size}")
            call = (lambda: select_summaries(ids, block_size, heuristic=heuristic))
            ms = harness.measure(call, device, reps, warmup=3, host_paced=True, clock=time.process_time).ms
            row = dict(heuristic=heuristic, block_size=block_size, ms=round(ms, 3), same_as_cpu=same)
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = harness.header(device, clock="synchronised wall time" if device.type == "cuda" else
                            "process CPU time, 1 thread", length=length, reps=reps,
                            token_ids="stdlib words, crc32 % 131072", phase1_ms=reference,
                            phase1_source=str(PHASE1_FILE.name), rows=rows, failures=failures)
    harness.write_results(args.out, result, markdown(result))
    if failures:
        raise SystemExit(f"device and CPU select different positions for {failures}")


if __name__ == "__main__":
    main()
