"""The project's kernels against the public anchors, in one process, on identical inputs (issue 55).

    PYTHONPATH=. python3 benchmarks/anchors.py --anchors-build /tmp/anchors_build --out-dir $OUT   # the GPU
    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/anchors.py --smoke --out-dir /tmp/anchors  # the CPU

``benchmarks/anchors.sh`` builds the anchors (``../shared/anchors``, carried as ``.anchors``: FlashMLA's
SM90 sparse prefill and DeepGEMM with ``anchor_patches``) and runs this; the project never imports
them otherwise. ``--anchors-build`` is their build folder (``flashmla/``, ``deepgemm/``); an anchor
that is not there, or does not import, or (DeepGEMM) whose probe call in a child process fails,
is recorded and its variants skipped with the reason.

Parts, in order (``--parts``): ``prefill`` (``anchor_attention``: S = T, B = 1, every selection
kind), ``decode`` (B x 1..4 queries at the end of T keys, B in ``--decode-B``) and ``indexer``
(``anchor_indexer``). Every variant is checked against an fp32 / fp64 reference on sampled rows in
the same run, then timed (``harness.measure``: CUDA events, the median of ``--reps``). A case
past ``--budget-s`` or whose inputs would not fit is recorded with the reason. Output:
``<out-dir>/anchors_<device>.json`` (rewritten after every row) and ``.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.anchor_attention import FLASHMLA_ENTRY, attention_rows
from benchmarks.anchor_indexer import indexer_rows
from benchmarks.anchor_inputs import INDEXER_DIM, INDEXER_HEADS
from benchmarks.anchor_runs import Deadline, load_anchor, upstream_commit
from benchmarks.anchor_tables import tables

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import deep_gemm
S, T, H, D = 4, 512, 64, 128
q = torch.randn(S, H, D, device="cuda").to(torch.float8_e4m3fn)
k = torch.randn(T, D, device="cuda").to(torch.float8_e4m3fn)
scale = torch.ones(T, device="cuda")
w = torch.randn(S, H, device="cuda")
ends = torch.arange(T - S + 1, T + 1, device="cuda", dtype=torch.int32)
logits = deep_gemm.fp8_mqa_logits(q, (k, scale), w, torch.zeros_like(ends), ends, True)
torch.cuda.synchronize()
print("probe ok", tuple(logits.shape))
"""
"""A child process's first fp8_mqa_logits call: a crash there (the JIT's include scan, issue 55) ends
the child, not the benchmark."""
PROBE_TIMEOUT_S = 420


def probe_deepgemm(build_dir: str | Path) -> str | None:
    """None where DeepGEMM's probe call (``PROBE``) succeeds in a child process, else why not."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE, str(Path(build_dir) / "deepgemm")], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    except subprocess.TimeoutExpired:
        return f"probe call: no answer in {PROBE_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-6:])
    return f"probe call failed (exit status {done.returncode}): {tail[-600:]}"


def device_tag(device: str) -> str:
    """"h100", "h200", "cpu" or the GPU's name in lower case: the results file's suffix."""
    if device == "cpu":
        return "cpu"
    name = torch.cuda.get_device_name(device)
    known = re.search(r"\b(H100|H200|H20|B200|A100)\b", name)
    return known.group(1).lower() if known else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def ints(text: str) -> list[int]:
    """Comma-separated positive integers."""
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--anchors-build", help="the anchors' build folder (flashmla/, deepgemm/); none: project only")
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--parts", default="prefill,decode,indexer")
    p.add_argument("--prefill-sizes", type=ints, default=[16384, 32768, 65536, 131072], help="S = T")
    p.add_argument("--kinds", default="uniform,sink_window_random,clustered", help="selection kinds")
    p.add_argument("--decode-T", type=ints, default=[65536, 131072])
    p.add_argument("--decode-B", type=ints, default=[1, 8, 64])
    p.add_argument("--decode-queries", type=ints, default=[1, 2, 4], help="queries per sequence")
    p.add_argument("--decode-kinds", default="uniform,clustered")
    p.add_argument("--idx-S", type=ints, default=[4096, 16384])
    p.add_argument("--idx-T", type=ints, default=[32768, 131072, 524288])
    p.add_argument("--heads", type=int, default=128, help="attention heads (FlashMLA: 64 or 128)")
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--decode-reps", type=int, default=20)
    p.add_argument("--check-rows", type=int, default=24, help="query rows checked against the reference")
    p.add_argument("--budget-s", type=float, default=None, help="no case starts after this many seconds")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-deepgemm-probe", action="store_true", help="import DeepGEMM without the child probe")
    p.add_argument("--probe-deepgemm", action="store_true", help="only the probe: exit status 0 where it succeeds")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (TRITON_INTERPRET=1), no anchors")
    args = p.parse_args(argv)
    unknown = set(args.parts.split(",")) - {"prefill", "decode", "indexer"}
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}; choose from prefill, decode, indexer")
    if args.probe_deepgemm and not args.anchors_build:
        p.error("--probe-deepgemm needs --anchors-build")
    if args.smoke:
        args.prefill_sizes, args.decode_T, args.decode_B, args.decode_queries = [48], [96], [1, 2], [1, 2]
        args.idx_S, args.idx_T, args.heads, args.topk, args.reps, args.decode_reps = [4], [256], 16, 32, 1, 1
        args.kinds, args.decode_kinds, args.check_rows = "uniform,clustered", "uniform", 6
    return args


def load_anchors(args) -> dict:
    """{"flash_mla", "deep_gemm": module or None, "<name>_missing": why not, or None}."""
    out = {}
    out["flash_mla"], out["flash_mla_missing"] = load_anchor(args.anchors_build, "flashmla", "flash_mla")
    probe = None
    if args.anchors_build and not args.no_deepgemm_probe:
        os.environ.setdefault("DG_JIT_CACHE_DIR", str(Path(args.anchors_build) / "dg_jit_cache"))
        probe = probe_deepgemm(args.anchors_build)
    if probe is None:
        out["deep_gemm"], out["deep_gemm_missing"] = load_anchor(args.anchors_build, "deepgemm", "deep_gemm")
    else:
        out["deep_gemm"], out["deep_gemm_missing"] = None, probe
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.probe_deepgemm:
        why = probe_deepgemm(args.anchors_build)
        print("DeepGEMM probe:", why or "ok", flush=True)
        return 0 if why is None else 1
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("anchors.py times CUDA kernels: no CUDA device here (--smoke runs the CPU check)")
    deadline = Deadline(args.budget_s)
    anchors = load_anchors(args) if not args.smoke else {
        "flash_mla": None, "flash_mla_missing": "not loaded (--smoke)",
        "deep_gemm": None, "deep_gemm_missing": "not loaded (--smoke)"}
    out = Path(args.out_dir) / f"anchors_{device_tag(device)}.json"
    doc = harness.header(device, smoke=args.smoke, args=vars(args), flashmla_entry=FLASHMLA_ENTRY,
                         flashmla_commit=upstream_commit(args.anchors_build, "flashmla"),
                         deepgemm_commit=upstream_commit(args.anchors_build, "deepgemm"),
                         anchors={k: v for k, v in anchors.items() if k.endswith("_missing")}, rows=[])
    print(json.dumps({k: v for k, v in doc.items() if k != "rows"}), flush=True)

    def emit(row: dict) -> None:
        doc["rows"].append(row)
        brief = {k: v for k, v in row.items() if k != "results"}
        brief.update({n: r.get("ms", r.get("skipped", r.get("error"))) for n, r in row.get("results", {}).items()})
        print(f"[{deadline.elapsed():6.1f} s] " + json.dumps(brief, default=str), flush=True)
        harness.write_json(out, doc)

    timing = dict(deadline=deadline, warmup=0 if args.smoke else 1, check_rows=args.check_rows, seed=args.seed)
    for part in args.parts.split(","):
        if part == "prefill":
            attention_rows(emit, "prefill", [(1, s, s) for s in args.prefill_sizes], args.kinds.split(","),
                           args.heads, args.topk, device, anchors["flash_mla"], anchors["flash_mla_missing"],
                           reps=args.reps, **timing)
        elif part == "decode":
            shapes = [(b, n, t) for t in args.decode_T for b in args.decode_B for n in args.decode_queries]
            attention_rows(emit, "decode", shapes, args.decode_kinds.split(","), args.heads, args.topk, device,
                           anchors["flash_mla"], anchors["flash_mla_missing"], reps=args.decode_reps, **timing)
        else:
            indexer_rows(emit, args.idx_S, args.idx_T, args.topk, device, anchors["deep_gemm"],
                         anchors["deep_gemm_missing"], reps=args.reps, heads=4 if args.smoke else INDEXER_HEADS,
                         dim=INDEXER_DIM, **timing)
    harness.write_results(out, doc, tables(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
