"""Where the warps of the absorbed attention's Gluon kernel wait: ncu's warp-state samples per SASS
instruction, summed per partition (even consumer, odd consumer, producer) and per cause.

Two steps. On the GPU, ``profile`` runs the kernel once to build it and once more, which ncu records
(S = T = ``--S``, B = 1, 128 heads, topk 2048, uniform selections; ``--variant`` a module file in
place of the package's ``absorbed_attention_ws``, for a kernel under trial):

    ncu --clock-control none --kernel-name regex:_absorbed_attention_ws_kernel --launch-skip 1 \\
        --launch-count 1 --set full --import-source no -o REP python3 benchmarks/ws_stalls.py profile
    ncu -i REP.ncu-rep --page source --csv --print-source sass > NAME_sass.csv
    ncu -i REP.ncu-rep --page details --csv > NAME_details.csv

Then anywhere, ``report`` reads the listings (one per kernel, named) and writes the JSON and table:

    python3 benchmarks/ws_stalls.py report --runs NAME=NAME_sass.csv,NAME_details.csv ... \\
        --out benchmarks/results/ws_stalls_h100.json

The partitions are the stretches of the listing each ``setmaxnreg`` opens: the consumers' raise the
count to ``CONSUMER_REGISTERS`` (the even warpgroup's code first), the producer's lowers it to the
kernel's least. A sample is a wait on an mbarrier when it sits on the branch that retries a
``SYNCS.PHASECHK`` try-wait on its predicate (the barrier named by its rank in shared memory,
``BARRIERS``), a wgmma wait on ``WARPGROUP.DEPBAR``, a global-load wait where its dominant reason is
the long scoreboard, a ``bar.sync`` where it is the barrier, else "other" (issue, math, dispatch
and the rest).
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402

BARRIERS = ("lo_ready0", "lo_ready1", "hi_ready0", "hi_ready1", "lo_free0", "lo_free1", "hi_free0", "hi_free1",
            "p_ready0", "p_ready1", "l_ready0", "l_ready1")
"""The kernel's mbarriers in the order ``_absorbed_attention_ws_kernel`` allocates them (two each of
lo_ready, hi_ready, lo_free, hi_free, p_ready, l_ready), which is their order in shared memory."""
PARTITIONS = ("even", "odd", "producer")
CAUSES = ("global loads", "wgmma", "bar.sync", "other")
"""The causes other than an mbarrier wait (module docstring)."""
DETAILS = ("Elapsed Cycles", "Duration", "Executed Instructions", "Issue Slots Busy",
           "Warp Cycles Per Issued Instruction", "Compute (SM) Throughput", "L2 Hit Rate")
"""The whole-kernel metrics of ncu's details page kept beside the stalls."""
SAMPLES = "Warp Stall Sampling (All Samples)"
_TRY_WAIT = re.compile(r"SYNCS\.PHASECHK\S*\s+(\w+),\s*\[[^\]]*?\+?(0x[0-9a-f]+)\]")
_SETMAXNREG = re.compile(r"USETMAXREG\.(TRY_ALLOC|DEALLOC)\S*\s+(?:UP\d+,\s*)?(0x[0-9a-f]+)")


def read_listing(path: str | Path) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of ncu's source page as CSV: the rows after the one that starts with "Address"."""
    rows = list(csv.reader(Path(path).read_text().splitlines()))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if start is None:
        raise ValueError(f"{path}: no 'Address' header row (expected ncu --page source --csv --print-source sass)")
    header = rows[start]
    for column in ("Source", SAMPLES):
        if column not in header:
            raise ValueError(f"{path}: no {column!r} column")
    return header, [r for r in rows[start + 1:] if len(r) >= len(header)]


def partitions(sources: list[str], consumer_registers: int) -> list[str]:
    """The partition of each instruction (PARTITIONS, or "other" outside them; module docstring)."""
    opens = [(i, kind, int(count, 16)) for i, s in enumerate(sources) for kind, count in _SETMAXNREG.findall(s)]
    if not opens:
        raise ValueError("no setmaxnreg in the listing: not a warp-specialised kernel")
    least = min(count for _, kind, count in opens if kind == "DEALLOC")
    labels, consumers, current, starts = [], 0, "other", {i: (kind, count) for i, kind, count in opens}
    for i in range(len(sources)):
        if i in starts:
            kind, count = starts[i]
            if kind == "TRY_ALLOC" and count == consumer_registers and consumers < 2:
                current, consumers = PARTITIONS[consumers], consumers + 1
            elif kind == "DEALLOC" and count == least:
                current = "producer"
            else:
                current = "other"
        labels.append(current)
    return labels


def barrier_names(sources: list[str]) -> dict[int, str]:
    """Shared-memory offset -> name of every mbarrier the listing's try-waits name: BARRIERS by rank
    where the listing names as many offsets as BARRIERS has, in 8-byte steps; else the offset."""
    offsets = sorted({int(m, 16) for s in sources for _, m in _TRY_WAIT.findall(s)})
    if len(offsets) == len(BARRIERS) and all(b - a == 8 for a, b in zip(offsets, offsets[1:])):
        return dict(zip(offsets, BARRIERS))
    return {o: hex(o) for o in offsets}


def stall_summary(header: list[str], rows: list[list[str]], consumer_registers: int) -> dict:
    """{"samples": all samples, "partitions": {partition: {"share": its share of the samples,
    "causes": {cause: share of the partition's samples}}}} (module docstring)."""
    col = {name: i for i, name in enumerate(header)}
    stall_columns = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
    sources = [r[col["Source"]] for r in rows]
    labels, names = partitions(sources, consumer_registers), barrier_names(sources)

    def count(row, column):
        value = row[col[column]].replace(",", "")
        return int(float(value)) if value else 0

    per_part: dict[str, Counter] = {p: Counter() for p in (*PARTITIONS, "other")}
    retry = None  # (the branch that retries the last try-wait, its barrier's name)
    for row, source, part in zip(rows, sources, labels):
        samples = count(row, SAMPLES)
        found = _TRY_WAIT.search(source)
        if found:
            retry = (re.compile(rf"@!{found.group(1)}\s+BRA\b"), names[int(found.group(2), 16)])
            cause = "other"
        elif retry is not None and retry[0].search(source):
            cause, retry = f"waits {retry[1]}", None
        else:
            top = max(stall_columns, key=lambda c: count(row, c)) if stall_columns and samples else ""
            cause = ("wgmma" if "WARPGROUP.DEPBAR" in source else "global loads" if top == "stall_long_sb"
                     else "bar.sync" if top == "stall_barrier" else "other")
        per_part[part][cause] += samples
    total = sum(sum(c.values()) for c in per_part.values())
    if not total:
        raise ValueError("the listing holds no warp-state samples (profile with --set full)")
    return {"samples": total, "partitions": {
        p: {"share": round(sum(c.values()) / total, 4),
            "causes": {k: round(v / max(1, sum(c.values())), 4) for k, v in c.most_common() if v}}
        for p, c in per_part.items() if p in PARTITIONS}}


def read_details(path: str | Path) -> dict[str, str]:
    """DETAILS from ncu's details page as CSV: {metric: "value unit"}."""
    rows = list(csv.reader(Path(path).read_text().splitlines()))
    header = rows[0]
    name, value, unit = header.index("Metric Name"), header.index("Metric Value"), header.index("Metric Unit")
    return {r[name]: f"{r[value]} {r[unit]}".strip() for r in rows[1:] if len(r) > value and r[name] in DETAILS}


def render(doc: dict) -> str:
    """The markdown: each run's whole-kernel metrics, then the share of each partition's samples by cause."""
    runs = doc["runs"]
    lines = [f"# Where the Gluon attention kernel's warps wait ({doc['device']})", "",
             "ncu's warp-state samples per SASS instruction (benchmarks/ws_stalls.py); " + doc["case"], "",
             *harness.notes_lines(doc), ""]
    lines += [harness.markdown_table(["metric", *runs], [[m, *(r["details"].get(m, "-") for r in runs.values())]
                                                         for m in DETAILS]), ""]
    for part in PARTITIONS:
        causes = list(dict.fromkeys(k for r in runs.values() for k in r["stalls"]["partitions"][part]["causes"]))
        body = [[cause, *(f"{100 * r['stalls']['partitions'][part]['causes'].get(cause, 0):.1f}%"
                          for r in runs.values())] for cause in causes]
        shares = ", ".join(f"{name} {100 * r['stalls']['partitions'][part]['share']:.1f}%" for name, r in runs.items())
        lines += [f"## {part} (share of all samples: {shares})", "", harness.markdown_table(["cause", *runs], body), ""]
    return "\n".join(lines)


def report(argv) -> int:
    p = argparse.ArgumentParser(prog="ws_stalls.py report", description="write the stalls of ncu listings")
    p.add_argument("--runs", nargs="+", required=True, metavar="NAME=SASS_CSV,DETAILS_CSV",
                   help="one per kernel: a name, its source-page listing and its details page")
    p.add_argument("--device", default="NVIDIA H100 80GB HBM3")
    p.add_argument("--case", default="S = T = 8192, B = 1, 128 heads, topk 2048, uniform selections, one call")
    p.add_argument("--consumer-registers", type=int, default=None,
                   help="registers a consumer thread asks for (default: the kernel module's)")
    p.add_argument("--notes", nargs="*", default=[], help="lines printed under the title (what each run was)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    registers = args.consumer_registers
    if registers is None:
        from compiler.lowering.attention.absorbed_attention_ws import CONSUMER_REGISTERS as registers
    runs = {}
    for spec in args.runs:
        name, _, files = spec.partition("=")
        sass, _, details = files.partition(",")
        if not name or not sass or not details:
            p.error(f"--runs: expected NAME=SASS_CSV,DETAILS_CSV, got {spec!r}")
        runs[name] = {"stalls": stall_summary(*read_listing(sass), registers), "details": read_details(details)}
    doc = {"device": args.device, "case": args.case, "notes": args.notes, "runs": runs}
    harness.write_results(args.out, doc, render(doc))
    return 0


def profile(argv) -> int:
    """Two calls of the kernel (the first builds it), to run under ncu (module docstring)."""
    import importlib.util

    import torch

    from benchmarks.anchor_attention import ws_kernel_call
    from benchmarks.anchor_inputs import absorbed_case
    from compiler.lowering.attention import absorbed_attention as dispatch

    p = argparse.ArgumentParser(prog="ws_stalls.py profile", description=profile.__doc__)
    p.add_argument("--S", type=int, default=8192, help=f"at most {dispatch.MAX_CHUNK}: one launch a call")
    p.add_argument("--variant", default=None, help="a module file to run in place of absorbed_attention_ws")
    args = p.parse_args(argv)
    if not 1 <= args.S <= dispatch.MAX_CHUNK:
        p.error(f"--S must lie in [1, {dispatch.MAX_CHUNK}] (one launch a call), got {args.S}")
    module = dispatch.absorbed_attention_ws
    if args.variant:
        spec = importlib.util.spec_from_file_location("ws_variant", args.variant)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    case = absorbed_case(1, args.S, args.S, 128, 2048, "uniform", "cuda", 7)
    call = ws_kernel_call(case, module)
    for _ in range(2):
        call()
        torch.cuda.synchronize()
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("profile", "report"):
        print(__doc__.split("\n\n")[0], "\n\nusage: ws_stalls.py {profile,report} ...", file=sys.stderr)
        return 2
    return (profile if argv[0] == "profile" else report)(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
