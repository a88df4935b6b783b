"""First calls at new shapes, then a property run: certified against dense of the same op.

    python -m benchmarks.gpu_properties --out $OUT/gpu_properties.json    # GPU (H200: about 3 min)
    python -m benchmarks.gpu_properties --smoke --out /tmp/props.json       # CPU, seconds
    python -m benchmarks.gpu_properties --stages properties --out ...      # stage 2 only

Stage 1, first calls. A fresh process (cold Triton cache and autotune cache, ``first_calls``)
calls ``torch.ops.pulsar_dosa.certified_topk`` at each shape of ``FIRST_CALL_SHAPES``, path
"dense" then "certified", and reports per shape and path: the first call's seconds, the Triton
compiles it made (count and seconds, Triton's compilation listener), the seconds spent choosing
launch configs by measurement, the second call's milliseconds and whether both paths agree. The
process runs under a hard timeout; at it the process is asked for its Python stack (``faulthandler``
on SIGUSR1) and then killed, and the run records the timeout and that stack. (A stack dumped by a
timer while the process is still working can crash it inside Triton's compiler: the dump is taken
only from a process about to be killed.) Then a second fresh process with the now warm
disk caches repeats it: the difference is compilation. The first shape is the call that did not
return within 100 s on the H200: B=2, S=54, H=64, D=128, T=2694, topk 1991, r=8, fp16 integers
in -2..2 (many ties), a causal mask.

Stage 2, properties. Worker processes run at once, each one class of (dtype, H, D) of CLASSES
(``worker_classes``: LOW_PRECISION_WORKERS for a bf16 / fp16 class), so that they compile different
kernels. Each draws cases (``draw_case``; seeded, reproducible) until twice its share of ``--cases``
or the deadline (every worker still running WORKER_GRACE_S past it is asked for its stacks and
stopped, its last tally counted with the case it was in), GROUP_CASES cases at a time at one drawn
shape: shapes (B, S, T, topk), every budget r of small
H (a spread for H = 64) and -1, values that tie (integers, ReLU zeros, repeated keys), NaN and
inf in q, k, weights or an additive mask, huge magnitudes, masks None / bool (random, causal
either way, rows with no visible key) / additive (ties in the bias), and calls the op with path
"dense" and "certified": the indices must be identical and the values bitwise equal. Counts per
category, per worker its shapes and Triton compilations (count, seconds), and the first mismatches
(with their seeds) go to the JSON; the exit code is 1 when a case mismatched or failed, a process
timed out or fewer than ``--cases`` cases ran.

``--smoke``: tiny shapes on the CPU (the op's plain-torch reference), three workers, a few cases.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: import this checkout's packages
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]

FIRST_CALL_SHAPES = (
    # (B, S, H, D, T, topk, r, mask): mask "end" = causal over the last S of T keys, "start" = query
    # s sees keys 0..s (every row has fewer visible keys than topk: all redone densely)
    (2, 54, 64, 128, 2694, 1991, 8, "end"),
    (2, 54, 64, 128, 2694, 1991, 8, "start"),
    (2, 55, 64, 128, 2695, 1990, 8, "end"),
    (1, 37, 64, 128, 5003, 777, -1, "end"),
    (1, 64, 64, 128, 4096, 2048, 64, "end"),
)
SMOKE_FIRST_CALL_SHAPES = ((1, 6, 3, 8, 40, 5, 2, "end"), (1, 5, 3, 8, 41, 7, -1, "start"))
FIRST_CALL_TIMEOUT_S = 150
"""Hard limit of the cold first-call process (the warm one gets half)."""
STACK_DUMP_S = 3.0
"""Seconds a timed-out first-call process is given to write its stacks before it is killed."""
CLASSES = (("float16", 1, 16), ("float16", 4, 32), ("float16", 8, 64), ("float16", 64, 128),
           ("bfloat16", 1, 16), ("bfloat16", 4, 32), ("bfloat16", 8, 64), ("bfloat16", 64, 128),
           ("float32", 8, 64), ("float32", 64, 128))
"""Worker classes (dtype, H, D). fp32 operands are scored densely on the GPU on both paths."""
SMOKE_CLASSES = (("float32", 2, 8), ("bfloat16", 3, 8))
LOW_PRECISION_WORKERS = 2
"""Worker processes per bf16 / fp16 class (each its own seed): their cases wait on compilation, one
CPU core each; an fp32 class, scored densely, compiles little and gets one."""
CASES = 10_000
BUDGET_S = 120
"""Stage 2's deadline from its start; a worker stops drawing cases there or after twice its share
of ``--cases`` (so that the total passes ``--cases`` when some classes compile slower)."""
T_CHOICES = (1, 2, 7, 16, 17, 63, 64, 65, 127, 300, 511, 777, 1024, 1500, 2047, 2694, 3001)
S_CHOICES = (1, 2, 5, 16, 17, 31, 54, 64, 96)
TOPK_CHOICES = (1, 2, 5, 16, 17, 64, 100, 255, 512, 1000, 1991, 2048, 4096)
SMOKE_T, SMOKE_S, SMOKE_TOPK = (1, 7, 17, 40), (1, 2, 5), (1, 3, 8, 50)
H64_BUDGETS = (1, 2, 3, 4, 5, 7, 8, 15, 16, 31, 64)
"""Budgets r drawn for H = 64 (every r in 1..H for smaller H)."""
GROUP_CASES = 160
"""Cases a worker draws at one shape (B, S, T, topk) before it draws the next. Triton compiles kernels
per shape class (its integer arguments are specialised), seconds a kernel; a case at a compiled shape
takes milliseconds. The values, mask, budget r and non-finite entries are drawn afresh per case."""
EXAMPLES = 10
TALLY_EVERY_S = 2.0
"""Seconds between a worker's rewrites of its tally."""
WORKER_GRACE_S = 15.0
"""Seconds a worker may run past the deadline (finishing a case) before it is stopped and its last
tally counted."""


# ---------------------------------------------------------------------------------------------
# Stage 1



def budget(r: int) -> int | None:
    """The op's r argument for a drawn budget (-1: the op's default, None)."""
    return None if r < 0 else r

def item7_inputs(shape, device, dtype):
    """(q, k, weights, mask) of a first-call shape: integers in -2..2 and a causal bool mask."""
    import torch

    B, S, H, D, T, _, _, align = shape
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-2, 3, (B, S, H, D), generator=g).to(dtype)
    k = torch.randint(-2, 3, (B, T, D), generator=g).to(dtype)
    w = torch.randint(-2, 3, (B, S, H), generator=g).to(dtype)
    mask = torch.ones(S, T, dtype=torch.bool).tril(T - S if align == "end" else 0).expand(B, S, T)
    return q.to(device), k.to(device), w.to(device), mask.contiguous().to(device)


def first_calls(shapes, device: str) -> None:
    """The child process of stage 1: one JSON line per (shape, path) on stdout, as it goes."""
    import faulthandler

    faulthandler.register(signal.SIGUSR1)
    started = time.perf_counter()
    import torch
    import triton

    import compiler  # noqa: F401  (registers the op)
    import compiler.autotune as autotune

    compiles = []
    triton.knobs.compilation.listener = lambda *, src, metadata, metadata_group, times, cache_hit: \
        compiles.append(0.0 if cache_hit else times.total / 1e6)
    tuning = [0.0]
    fastest = autotune.fastest_config

    def timed_fastest(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fastest(*args, **kwargs)
        finally:
            tuning[0] += time.perf_counter() - t0

    autotune.fastest_config = timed_fastest
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.zeros(1, device=dev)
    sync()
    print(json.dumps({"startup_s": round(time.perf_counter() - started, 2)}), flush=True)
    op = torch.ops.pulsar_dosa.certified_topk
    for shape in shapes:
        q, k, w, mask = item7_inputs(shape, dev, torch.float16)
        outputs = {}
        for path in ("dense", "certified"):
            before, tuned = len(compiles), tuning[0]
            t0 = time.perf_counter()
            outputs[path] = op(q, k, w, shape[5], mask, "", path, budget(shape[6]), None, False)
            sync()
            first = time.perf_counter() - t0
            new = compiles[before:]
            t0 = time.perf_counter()
            op(q, k, w, shape[5], mask, "", path, budget(shape[6]), None, False)
            sync()
            second = time.perf_counter() - t0
            row = {"shape": list(shape), "path": path, "first_s": round(first, 3), "second_ms": round(second * 1e3, 2),
                   "compiles": sum(1 for c in new if c > 0), "compile_s": round(sum(new), 2),
                   "tuning_s": round(tuning[0] - tuned, 2)}
            if path == "certified":
                row["identical"] = identical(outputs["dense"], outputs["certified"])
            print(json.dumps(row), flush=True)


def start_child(args: list[str], env: dict, out: Path, err: Path) -> subprocess.Popen:
    """``args`` run from the repository root as the leader of a new process group, stdout and stderr to the files
    ``out`` and ``err``: no pipe to fill or to be held open by the processes it starts, and
    ``stop_child`` ends them all (``stop_overdue`` first asks an overdue one for its stacks)."""
    with open(out, "w") as stdout, open(err, "w") as stderr:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def stop_child(proc: subprocess.Popen) -> None:
    """Kill ``start_child``'s process with every process it started (its process group), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the process and every one it started have ended
        pass
    proc.wait()


def run_first_calls(shapes, device: str, env: dict, timeout: float) -> dict:
    """Stage 1 in a fresh process with ``env``: its rows, or the timeout and its stack dumps."""
    args = [sys.executable, "-m", "benchmarks.gpu_properties", "--first-calls-child", "--device", device]
    if shapes is SMOKE_FIRST_CALL_SHAPES:
        args.append("--smoke")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        proc = start_child(args, env, out, err)
        timed_out = bool(stop_overdue([proc], time.time() + timeout))  # its stacks go to stderr
        out_text, err_text = out.read_text(), err.read_text()
    code = None if timed_out else proc.returncode
    rows = [json.loads(line) for line in out_text.splitlines() if line.startswith("{")]
    result = {"wall_s": round(time.perf_counter() - t0, 1), "timed_out": timed_out, "exit_code": code,
              "startup_s": next((r["startup_s"] for r in rows if "startup_s" in r), None),
              "calls": [r for r in rows if "path" in r]}
    if timed_out or code:
        result["stderr_tail"] = err_text[-6000:]
    return result


# ---------------------------------------------------------------------------------------------
# Stage 2


def draw_shape(rng: random.Random, smoke: bool) -> tuple[int, int, int, int]:
    """(B, S, T, topk) of a case."""
    B = rng.choice((1, 1, 2, 3))
    S = rng.choice(SMOKE_S if smoke else S_CHOICES)
    T = rng.choice(SMOKE_T if smoke else T_CHOICES)
    return B, S, T, rng.choice(SMOKE_TOPK if smoke else TOPK_CHOICES + (T, T + 7))


def draw_case(seed: int, dtype_name: str, H: int, D: int, device: str, smoke: bool, shape_seed: int | None = None):
    """One adversarial case, a function of its seed: ((q, k, weights, topk, mask, r), tags). Its shape
    (``draw_shape``) is the one drawn from ``shape_seed`` when given (a case drawn with its own seed
    as ``shape_seed`` is the case drawn without one)."""
    import torch

    rng = random.Random(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    B, S, T, topk = draw_shape(rng, smoke)
    if shape_seed is not None:
        B, S, T, topk = draw_shape(random.Random(shape_seed), smoke)
    r = rng.choice((-1,) + (H64_BUDGETS if H == 64 else tuple(range(1, H + 1))))
    tags = [f"dtype={dtype_name}", f"H={H}", f"r={r}"]

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    values = rng.choice(("gauss", "ties", "relu_zeros", "repeated_keys"))
    tags.append(f"values={values}")
    if values == "ties":
        q, k, w = (torch.randint(-2, 3, s, generator=gen, device=device).float()
                   for s in ((B, S, H, D), (B, T, D), (B, S, H)))
    else:
        q, k, w = randn(B, S, H, D), randn(B, T, D), randn(B, S, H)
        if values == "relu_zeros":  # most head dots negative: scores of exactly 0 tie
            q, k = q - 2.0, k.abs()
        elif values == "repeated_keys":
            k = k[:, torch.arange(T, device=device) % max(1, T // 3)]
    if rng.random() < 0.05:
        q = q * 2.0 ** rng.randint(-30, 30)
        tags.append("huge_or_tiny")
    mask, mask_tags = _draw_mask(rng, gen, B, S, T, dtype, device)
    tags += mask_tags
    q, k, w = q.to(dtype), k.to(dtype), w.to(dtype)
    if rng.random() < 0.15:
        target = rng.choice(("q", "k", "weights") + (("mask",) if mask is not None and mask.is_floating_point() else ()))
        x = {"q": q, "k": k, "weights": w, "mask": mask}[target]
        flat = x.view(-1)
        for _ in range(rng.randint(1, 3)):
            flat[rng.randrange(flat.numel())] = rng.choice((float("nan"), float("inf"), float("-inf")))
        tags.append(f"nonfinite_{target}")
    if topk >= T:
        tags.append("topk>=T")
    if B * S < 128:
        tags.append("few_rows")
    return (q, k, w, topk, mask, r), tags


def _draw_mask(rng, gen, B, S, T, dtype, device):
    """(mask None | bool | additive [B,S,T], tags)."""
    import torch

    kind = rng.choice(("none", "bool", "additive"))
    if kind == "none":
        return None, ["mask=none"]
    form = rng.choice(("random", "causal_end", "causal_start"))
    if form == "random":
        visible = torch.rand(B, S, T, generator=gen, device=device) < rng.choice((0.05, 0.5, 0.95))
    else:
        diagonal = T - S if form == "causal_end" else 0
        visible = torch.ones(S, T, dtype=torch.bool, device=device).tril(diagonal).expand(B, S, T).clone()
    tags = [f"mask={kind}", f"mask_form={form}"]
    if rng.random() < 0.3:
        visible[:, torch.randint(0, S, (max(1, S // 3),), generator=gen, device=device)] = False
        tags.append("empty_rows")
    if kind == "bool":
        return visible, tags
    bias_kind = rng.choice(("zero", "integers", "gauss"))
    tags.append(f"bias={bias_kind}")
    if bias_kind == "zero":
        bias = torch.zeros(B, S, T, device=device)
    elif bias_kind == "integers":
        bias = torch.randint(-1, 2, (B, S, T), generator=gen, device=device).float()
    else:
        bias = torch.randn(B, S, T, generator=gen, device=device)
    additive = torch.where(visible, bias, float("-inf"))
    return additive.to(rng.choice((dtype, torch.float32))), tags


def identical(a, b) -> bool:
    """Same indices and bitwise the same values."""
    import torch

    return torch.equal(a[1], b[1]) and torch.equal(a[0].view(torch.int32), b[0].view(torch.int32))


def new_tally(klass, **fields) -> dict:
    """A worker's tally before its first case (``fields`` added)."""
    return {"class": list(klass), "cases": 0, "shapes": 0, "compiles": 0, "compile_s": 0.0, "mismatches": 0,
            "errors": 0, "by_category": {}, "examples": [], **fields}


def property_worker(klass, cases: int, deadline: float, seed: int, device: str, smoke: bool,
                    result: Path | None = None) -> dict:
    """Stage 2's worker: draw and check cases of one class until ``cases`` or ``deadline`` (epoch s);
    the tally so far is rewritten to ``result`` every TALLY_EVERY_S, so that a worker stopped in a
    compilation past the deadline still reports the cases it checked."""
    import faulthandler

    faulthandler.register(signal.SIGUSR1)  # run_workers asks an overdue worker for its stacks
    import torch

    import compiler  # noqa: F401  (registers the op)

    dtype_name, H, D = klass
    op = torch.ops.pulsar_dosa.certified_topk
    tally = new_tally(klass)
    if not smoke:  # Triton's compilations (none under the CPU interpreter)
        import triton

        def compiled(*, src, metadata, metadata_group, times, cache_hit):
            if not cache_hit:
                tally["compiles"] += 1
                tally["compile_s"] = round(tally["compile_s"] + times.total / 1e6, 2)

        triton.knobs.compilation.listener = compiled
    written = -math.inf  # the first case's tally is written before it runs
    for i in range(cases):
        if time.time() > deadline:
            break
        case_seed = seed * 1_000_003 + i
        shape_seed = seed * 1_000_003 + i - i % GROUP_CASES  # the seed of the group's first case
        tally["current_seed"] = case_seed
        if result is not None and time.time() - written > TALLY_EVERY_S:
            Path(result).write_text(json.dumps(tally))
            written = time.time()
        (q, k, w, topk, mask, r), tags = draw_case(case_seed, dtype_name, H, D, device, smoke, shape_seed)
        outcome = "cases"
        try:
            dense = op(q, k, w, topk, mask, "", "dense", budget(r), None, False)
            certified = op(q, k, w, topk, mask, "", "certified", budget(r), None, False)
            if not identical(dense, certified):
                outcome = "mismatches"
        except Exception as exc:  # a valid input must never fail: counted and shown
            outcome, error = "errors", f"{type(exc).__name__}: {str(exc)[:300]}"
        tally["cases"] += 1
        tally["shapes"] += i % GROUP_CASES == 0
        for tag in tags:
            cat = tally["by_category"].setdefault(tag, {"cases": 0, "mismatches": 0, "errors": 0})
            cat["cases"] += 1
            if outcome != "cases":
                cat[outcome] += 1
        if outcome != "cases":
            tally[outcome] += 1
            if len(tally["examples"]) < EXAMPLES:
                tally["examples"].append({"seed": case_seed, "shape_seed": shape_seed, "outcome": outcome, "tags": tags,
                                          "topk": topk, "r": r, "shape": list(q.shape) + [k.shape[1]],
                                          **({"error": error} if outcome == "errors" else {})})
    return tally


def stop_overdue(procs: list[subprocess.Popen], cut_at: float) -> list[subprocess.Popen]:
    """Wait for ``start_child``'s processes until the epoch time ``cut_at``; ask every one still
    running for its Python stacks (SIGUSR1, which a worker answers with ``faulthandler``), give them
    STACK_DUMP_S together, then stop each with the processes it started. Returns those it stopped."""
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, cut_at - time.time()))
        except subprocess.TimeoutExpired:
            pass
    overdue = [proc for proc in procs if proc.poll() is None]
    for proc in overdue:
        proc.send_signal(signal.SIGUSR1)
    if overdue:
        time.sleep(STACK_DUMP_S)
    for proc in overdue:
        stop_child(proc)
    return overdue


def worker_classes(classes) -> list[tuple]:
    """The class of each worker process: LOW_PRECISION_WORKERS for a bf16 / fp16 class, one for fp32."""
    return [klass for klass in classes for _ in range(1 if klass[0] == "float32" else LOW_PRECISION_WORKERS)]


def run_workers(classes, cases: int, budget_s: float, device: str, smoke: bool, seed: int,
                env: dict) -> list[dict]:
    """Stage 2: one process per class, all at once, with ``env`` (stage 1's warm caches); their
    tallies (or how each ended). Every worker still running WORKER_GRACE_S past the deadline is
    asked for its Python stacks (SIGUSR1, ``faulthandler``), given STACK_DUMP_S, then stopped with
    the processes it started (``stop_child``); its tally keeps the case it was in and its stderr tail."""
    deadline = time.time() + budget_s
    share = 2 * math.ceil(cases / len(classes))
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, klass in enumerate(classes):
            path, err = Path(tmp) / f"worker{i}.json", Path(tmp) / f"worker{i}.err"
            args = [sys.executable, "-m", "benchmarks.gpu_properties", "--worker", ",".join(map(str, klass)),
                    "--cases", str(share), "--deadline", str(deadline), "--seed", str(seed + i), "--device", device,
                    "--result", str(path)] + (["--smoke"] if smoke else [])
            procs.append((klass, path, err, start_child(args, env, Path(tmp) / f"worker{i}.out", err)))
        cut_at = deadline + WORKER_GRACE_S  # one cut for all: the stage ends by then whatever the workers do
        overdue = stop_overdue([proc for _, _, _, proc in procs], cut_at)
        tallies = []
        for klass, path, err, proc in procs:
            cut = proc in overdue
            tally = json.loads(path.read_text()) if (proc.returncode == 0 or cut) and path.exists() else None
            if tally is None:
                tally = new_tally(klass, failed=f"exit code {proc.returncode}")
            if cut:
                tally["cut_at_deadline"] = True
            if cut or "failed" in tally:
                tally["stderr_tail"] = err.read_text()[-3000:]
            tallies.append(tally)
    return tallies


def summarise(tallies: list[dict]) -> dict:
    """Totals and per-category counts over the workers."""
    total = {"cases": 0, "shapes": 0, "mismatches": 0, "errors": 0, "failed_workers": 0, "by_category": {},
             "examples": []}
    for t in tallies:
        for key in ("cases", "shapes", "mismatches", "errors"):
            total[key] += t[key]
        total["failed_workers"] += "failed" in t
        for tag, counts in t["by_category"].items():
            cat = total["by_category"].setdefault(tag, {"cases": 0, "mismatches": 0, "errors": 0})
            for key in cat:
                cat[key] += counts[key]
        total["examples"] += [{"class": t["class"], **e} for e in t["examples"]]
    total["by_category"] = dict(sorted(total["by_category"].items()))
    return total


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="JSON results path")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    p.add_argument("--device", default=None, help="default: cuda, or cpu with --smoke")
    p.add_argument("--cases", type=int, default=None, help=f"stage 2 cases in all (default {CASES}; smoke 20)")
    p.add_argument("--budget-s", type=float, default=None, help=f"stage 2 deadline (default {BUDGET_S} s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", nargs="+", choices=("first_calls", "properties"), default=["first_calls", "properties"],
                   help="which stages to run (default both)")
    p.add_argument("--first-call-timeout-s", type=float, default=FIRST_CALL_TIMEOUT_S,
                   help="stage 1's limit for the cold process (the warm one gets half)")
    p.add_argument("--first-calls-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cpu" if args.smoke else "cuda"
    if not (args.first_calls_child or args.worker) and not args.out:
        p.error("--out is required")
    if not args.first_call_timeout_s > 0:
        p.error(f"--first-call-timeout-s: expected a positive number of seconds, got {args.first_call_timeout_s}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.first_calls_child:
        first_calls(SMOKE_FIRST_CALL_SHAPES if args.smoke else FIRST_CALL_SHAPES, args.device)
        return 0
    if args.worker:
        dtype_name, H, D = args.worker.split(",")
        tally = property_worker((dtype_name, int(H), int(D)), args.cases, args.deadline, args.seed, args.device,
                                args.smoke, Path(args.result))
        Path(args.result).write_text(json.dumps(tally))
        return 0
    shapes = SMOKE_FIRST_CALL_SHAPES if args.smoke else FIRST_CALL_SHAPES
    cases = args.cases if args.cases is not None else (20 if args.smoke else CASES)
    budget = args.budget_s if args.budget_s is not None else (120 if args.smoke else BUDGET_S)
    started = time.perf_counter()
    result = {"device": args.device}
    with tempfile.TemporaryDirectory() as caches:
        env = {**os.environ, "TRITON_CACHE_DIR": os.path.join(caches, "triton"),
               "PULSAR_DOSA_AUTOTUNE_CACHE": os.path.join(caches, "autotune.json")}
        if "first_calls" in args.stages:
            stages = result["first_calls"] = {}
            stages["cold_caches"] = run_first_calls(shapes, args.device, env, args.first_call_timeout_s)
            _write_partial(args.out, result)
            stages["warm_disk_caches"] = run_first_calls(shapes, args.device, env, args.first_call_timeout_s / 2)
            _write_partial(args.out, result)
        if "properties" in args.stages:
            tallies = run_workers(worker_classes(SMOKE_CLASSES if args.smoke else CLASSES), cases, budget, args.device,
                                  args.smoke, args.seed, env)
            total = summarise(tallies)
            result["properties"] = {**total, "target": cases, "budget_s": budget,
                                    "workers": [{k: v for k, v in t.items() if k not in ("by_category", "examples")}
                                                for t in tallies]}
    result["wall_s"] = round(time.perf_counter() - started, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print_tables(result)
    bad = False
    for stage in result.get("first_calls", {}).values():
        bad |= bool(stage["timed_out"] or stage["exit_code"] or not all(c.get("identical", True) for c in stage["calls"]))
    if "properties" in result:
        p = result["properties"]
        bad |= bool(p["mismatches"] or p["errors"] or p["failed_workers"] or p["cases"] < cases)
    return 1 if bad else 0


def _write_partial(out: str, result: dict) -> None:
    """The results so far (a stage at a time), written and printed, so that a run cut short keeps them."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({**result, "partial": True}, indent=1))
    print(json.dumps(result), flush=True)


def print_tables(result: dict) -> None:
    for name, stage in result.get("first_calls", {}).items():
        print(f"first calls, {name}: startup {stage['startup_s']} s, wall {stage['wall_s']} s"
              + (" TIMED OUT" if stage["timed_out"] else ""))
        print(f"  {'B,S,H,D,T,topk,r,mask':34s} {'path':9s} {'first s':>8s} {'compiles':>8s} {'compile s':>9s} "
              f"{'tuning s':>8s} {'second ms':>9s} identical")
        for c in stage["calls"]:
            print(f"  {','.join(map(str, c['shape'])):34s} {c['path']:9s} {c['first_s']:8.2f} {c['compiles']:8d} "
                  f"{c['compile_s']:9.2f} {c['tuning_s']:8.2f} {c['second_ms']:9.2f} {c.get('identical', '')}")
    if "properties" in result:
        p = result["properties"]
        print(f"properties: {p['cases']} cases at {p['shapes']} shapes (target {p['target']}), {p['mismatches']} "
              f"mismatches, {p['errors']} errors, {p['failed_workers']} failed workers; whole run {result['wall_s']} s")
        for w in p["workers"]:
            print(f"  worker {','.join(map(str, w['class'])):18s} {w['cases']:6d} cases {w['shapes']:5d} shapes "
                  f"{w['compiles']:5d} compiles {w['compile_s']:7.1f} s"
                  + (" (cut at the deadline)" if w.get("cut_at_deadline") else "") + (" FAILED" if "failed" in w else ""))
        for tag, c in p["by_category"].items():
            print(f"  {tag:28s} {c['cases']:6d} cases {c['mismatches']:4d} mismatches {c['errors']:4d} errors")


if __name__ == "__main__":
    sys.exit(main())
