"""DSA sparse attention at DeepSeek-V3.2's MLA shape: the absorbed op (every launch configuration),
today's union op and transformers' masked SDPA, with errors checked in the same run.

Run on one CUDA GPU from the repository root (about 3 minutes on an H200, ``--budget-s`` bounds it):

    PYTHONPATH=. python3 benchmarks/sparse_attention_forms.py --out benchmarks/results/sparse_attention_h200.json

and on the CPU, tiny, under the Triton interpreter (checks that the script works):

    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/sparse_attention_forms.py --smoke --out /tmp/sparse_smoke.json

Shape: an MLA layer with latent Dc = 512 (kv_lora after its norm), rope key Dr = 64, q/k nope 128,
v 128, H heads (128 and 16), top-K 2048, bf16, random weights; the keys and values of the union op
and of SDPA are kv_b_proj's expansion of the same latent, so every method computes the same
attention. Cases: prefill S = T (causal mask, as the model passes it) at 16K, 32K, 64K; decode
S = 1 over T = 131072 keys at B = 1 and 64 (no mask). Selection kinds (each row's indices distinct,
within its visible keys; a row with at most 2048 visible keys selects keys 0..2047 as topk does):

* ``windowed``: the 2048 most recent keys (neighbours share almost all their keys);
* ``shared16``: 64 sink keys, the 1024 most recent and 15 far blocks of 64 keys shared by each
  group of 16 consecutive queries (drawn below the window of the group's first row);
* ``uniform``: one key drawn uniformly in each of 2048 equal strata of the visible keys;
* ``sink_window_random``: 64 sink keys, the 1024 most recent, the rest drawn in strata of the keys
  between them, per query;
* ``clustered``: 32 runs of 64 contiguous keys, one run drawn in each of 32 strata of the visible
  64-key blocks, per query;
* ``file:<name>``: indices loaded with ``--selections path.pt`` (a ``[B, S, K]`` integer tensor,
  or a dict with ``indices`` and optionally ``T``), e.g. a trained model's selections.

Methods, timed by CUDA events (median): ``absorbed:<config>`` for every form of
``compiler.lowering.attention.absorbed_attention.CONFIG_NAMES`` (its Triton launch configurations and
the Gluon warp-specialised kernel, ``ws``) on a case's first kind and the fastest of
them on its other kinds (the op runs ``default_configs``' first),
``union`` (``pulsar_dosa.sparse_attention``'s kernels on the expanded keys and values) and
``masked_sdpa`` (what transformers runs: index mask, combined mask, SDPA over all T keys; timed
once per case, its work does not depend on the selection), and where the compile-time form is
"auto" (prefill), ``auto``: the op's CUDA kernel choosing per call (``compiler.ops.sparse_form``,
its pick in ``auto_form``, its site the kind: measured on its first call, then from its own earlier
measurements) and ``union:latent``: the union form as that op runs it, the
latent's expansion included; there ``regret`` is auto's time over the fastest absorbed
configuration's or union:latent's. ``tflops`` is the absorbed form's 2·B·S·H·K·(Dc + Dr + Dc) FLOPs
over each method's time; ``chosen``: the form ``policy.sparse_attention_form`` picks at compile time
and ``regret``: its time (for absorbed, its fastest configuration) over the best method's.
``union_ratio``: the mean union of a tile's selections over K, over all tiles
(``union_ratio_sampled``: what the op measures), the input of ``benchmarks/fit_cost_model.py
--attention``. A method whose inputs do not fit in memory is skipped and the
row says so; a case past ``--budget-s`` is skipped. Errors: max |out - fp32 reference| on sampled
query rows (``runtime.absorbed_attention``). Per case, the default configuration is also checked
for CUDA-graph capture: ``no_sync`` (a call with host synchronisation forbidden succeeded),
``graph_identical`` (replay == eager, bitwise) and ``graph_ms``.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

import benchmarks.indexer_graphs as graphs
from compiler.lowering.attention.absorbed_attention import CONFIG_NAMES, DEFAULT_CONFIG, absorbed_sparse_attention_triton
from compiler.lowering.attention.selection_overlap import union_ratio
from compiler.lowering.attention.union_attention import sparse_attention_triton, tile_rows
from compiler.ops.absorbed_sparse_attention import absorbed_sparse_attention_cuda
from compiler.ops.sparse_form import choose_form
from compiler.policy import sparse_attention_form
from runtime.absorbed_attention import absorbed_sparse_attention, expand_latent, head_weights

DIMS = dict(nope=128, rope=64, v=128, latent=512, topk=2048)
SMOKE_DIMS = dict(nope=16, rope=16, v=16, latent=32, topk=32)
FAR_BLOCKS = 15
"""shared16's far blocks per group; the sink, a far block and a clustered run are K/32 keys, the
recent window K/2 (64, 64, 64 and 1024 at K = 2048)."""
PEAK_FLOPS = 780e12
CHECK_ROWS = 32
MEMORY_FRACTION = 0.7
"""A method runs only when its extra tensors take at most this fraction of the free device memory."""
GPU_CASES = [(1, 32768, 32768, 128), (1, 65536, 65536, 128), (1, 16384, 16384, 128), (1, 1, 131072, 128),
             (64, 1, 131072, 128), (1, 16384, 16384, 16), (1, 32768, 32768, 16), (1, 65536, 65536, 16)]
"""(B, S, T, heads), most wanted first: the budget cuts the tail."""
SMOKE_CASES = [(1, 40, 40, 16), (2, 1, 64, 16)]


def _positions(s, t, device):
    return torch.arange(t - s, t, device=device)


def _strata(pos, count, low, high, g):
    """[S, count] int64: one draw in each of ``count`` disjoint integer strata of [low, high) per row
    (distinct when the range holds at least ``count`` values)."""
    j = torch.arange(count + 1, device=pos.device)
    edges = low[:, None] + (j[None, :] * (high - low).clamp(min=0)[:, None]) // count
    u = torch.rand(pos.shape[0], count, generator=g, device=pos.device, dtype=torch.float64)
    return edges[:, :-1] + (u * (edges[:, 1:] - edges[:, :-1])).floor().long()


def distinct_rows(indices):
    """Whether no row of ``indices`` [B, S, K] repeats a key (then the op may skip its sort)."""
    ordered = indices.sort(dim=-1).values
    return not bool((ordered[..., 1:] == ordered[..., :-1]).any())


def _short_rows(chosen, pos, topk):
    """Rows with at most ``topk`` visible keys select keys 0..topk-1, as topk does over the masked row."""
    first = torch.arange(topk, device=pos.device)[None, :]
    return torch.where((pos < topk)[:, None], first, chosen).to(torch.int32)


def windowed(s, t, topk, device, g):
    pos = _positions(s, t, device)
    return _short_rows(pos[:, None] - torch.arange(topk, device=device)[None, :], pos, topk)


def shared16(s, t, topk, device, g, group=16):
    pos = _positions(s, t, device)
    sink, window, block = topk // 32, topk // 2, topk // 32
    recent = pos[:, None] - torch.arange(window, device=device)[None, :]
    groups = (s + group - 1) // group
    # Rows with at most topk visible keys are replaced below: from topk on, every group has room.
    room = ((pos[::group].clamp(min=topk) - window - sink) // block)
    draw = torch.rand(groups, int(room.max()), generator=g, device=device)
    draw = draw.masked_fill(torch.arange(draw.shape[1], device=device)[None, :] >= room[:, None], 2.0)
    blocks = draw.topk(FAR_BLOCKS, dim=1, largest=False).indices
    far = (sink + blocks[:, :, None] * block + torch.arange(block, device=device)).reshape(groups, -1)
    far = far[:, :topk - sink - window].repeat_interleave(group, dim=0)[:s]
    return _short_rows(torch.cat([torch.arange(sink, device=device).expand(s, sink), recent, far], dim=1), pos, topk)


def uniform(s, t, topk, device, g):
    pos = _positions(s, t, device)
    return _short_rows(_strata(pos, topk, torch.zeros_like(pos), pos + 1, g), pos, topk)


def sink_window_random(s, t, topk, device, g):
    pos = _positions(s, t, device)
    sink, window = topk // 32, topk // 2
    recent = pos[:, None] - torch.arange(window, device=device)[None, :]
    middle = _strata(pos, topk - sink - window, torch.full_like(pos, sink), pos + 1 - window, g)
    return _short_rows(torch.cat([torch.arange(sink, device=device).expand(s, sink), recent, middle], dim=1),
                       pos, topk)


def clustered(s, t, topk, device, g):
    pos = _positions(s, t, device)
    run = topk // 32
    blocks = _strata(pos, 32, torch.zeros_like(pos), (pos + 1) // run, g)
    chosen = (blocks[:, :, None] * run + torch.arange(run, device=device)).reshape(s, -1)
    return _short_rows(chosen, pos, topk)


KINDS = {"uniform": uniform, "windowed": windowed, "shared16": shared16,
         "sink_window_random": sink_window_random, "clustered": clustered}


def selections(kind, b, s, t, topk, device, seed):
    """[B, S, topk] int32 of ``kind`` (module docstring), one draw per batch row."""
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.stack([KINDS[kind](s, t, topk, device, g) for _ in range(b)])


def causal_mask(s, t, device):
    """[1, 1, S, T] bool: S queries at the end of T keys, causal."""
    return (torch.arange(t, device=device)[None, :] <= _positions(s, t, device)[:, None]).view(1, 1, s, t)


def mla_inputs(b, s, t, heads, dims, device, dtype, seed):
    """q, latent, rope key, kv_b weight (random; scores O(1)) and the scale of an MLA layer."""
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, heads, s, dims["nope"] + dims["rope"], generator=g, device=device, dtype=dtype)
    latent = torch.randn(b, t, dims["latent"], generator=g, device=device, dtype=dtype)
    rope_key = torch.randn(b, t, dims["rope"], generator=g, device=device, dtype=dtype)
    weight = (torch.randn(heads * (dims["nope"] + dims["v"]), dims["latent"], generator=g, device=device)
              * dims["latent"] ** -0.5).to(dtype)
    return q, latent, rope_key, weight, (dims["nope"] + dims["rope"]) ** -0.5


def expanded_kv(latent, rope_key, weight, heads, nope_dim):
    """(k [B, H, T, Dn+Dr], v [B, H, T, Dv]) as transformers' expand_kv builds them."""
    w_uk, w_uv = head_weights(weight, heads, nope_dim)
    k_nope = torch.einsum("btc,hnc->bhtn", latent, w_uk)
    k = torch.cat([k_nope, rope_key[:, None].expand(-1, heads, -1, -1)], dim=-1)
    return k, torch.einsum("btc,hvc->bhtv", latent, w_uv)


def masked_sdpa(q, k, v, indices, mask, scale):
    """transformers' DSA attention (sdpa implementation): index mask, combined mask, dense SDPA."""
    b, s, _ = indices.shape
    index_mask = indices.new_ones((b, s, k.shape[2]), dtype=torch.bool).scatter(-1, indices.long(), False)
    visible = ~index_mask.unsqueeze(1) if mask is None else mask & ~index_mask.unsqueeze(1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)


def one_call_ms(fn, device):
    """Milliseconds of one call of ``fn`` (CUDA events on a GPU, wall clock on the CPU)."""
    if device.type == "cuda":
        return graphs.median_ms(fn, 1)
    start = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - start)


def median_ms(fn, reps, device, budget_ms=2000.0):
    """Median milliseconds of ``fn`` over up to ``reps`` calls after one warm-up, fewer when a call
    is long (about ``budget_ms`` in all, at least 2 calls on a GPU; on the CPU one call, no warm-up)."""
    if device.type != "cuda":
        return one_call_ms(fn, device)
    fn()
    times = []
    while len(times) < reps and (len(times) < 2 or sum(times) < budget_ms):
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(one_call_ms(fn, device))
    return statistics.median(times)


def check_rows(s, device):
    """Sampled (batch, query) rows: the first ones, around top-K, spread, the last."""
    picks = {min(s - 1, r) for r in (0, 1, 2047, 2048, s - 1)}
    picks |= {int(x) for x in torch.linspace(0, s - 1, CHECK_ROWS)}
    return torch.tensor(sorted(picks), device=device)


def fits(nbytes, device):
    """Whether ``nbytes`` more fit in MEMORY_FRACTION of the free device memory (always on the CPU)."""
    return device.type != "cuda" or nbytes <= MEMORY_FRACTION * torch.cuda.mem_get_info(device)[0]


def graph_checks(fn, device):
    """CUDA only: (no_sync, graph_identical, graph_ms) of ``fn`` after a warm-up call."""
    if device.type != "cuda":
        return {}
    fn()
    torch.cuda.synchronize()
    eager, no_sync = graphs.without_sync(fn)
    graph, graph_out = graphs.captured(fn)
    graph.replay()
    torch.cuda.synchronize()
    identical = eager is not None and bool(torch.equal(graph_out, eager))
    result = {"no_sync": no_sync, "graph_identical": identical, "graph_ms": median_ms(graph.replay, 5, device)}
    del graph
    return result


def run_case(case, kinds, args, device, dims, emit):
    """Rows of one (B, S, T, heads) case: every method on every selection kind (module docstring)."""
    b, s, t, heads = case["B"], case["S"], case["T"], case["heads"]
    q, latent, rope_key, weight, scale = mla_inputs(b, s, t, heads, dims, device, torch.bfloat16, seed=s + t)
    mask = causal_mask(s, t, device) if s > 1 else None
    configs = [DEFAULT_CONFIG] if args.smoke else list(CONFIG_NAMES)
    expanded_bytes = 2 * b * heads * t * (dims["nope"] + dims["rope"] + dims["v"])
    kv = expanded_kv(latent, rope_key, weight, heads, dims["nope"]) if fits(2 * expanded_bytes, device) else None
    sdpa_bytes = 3 * b * s * t  # index mask, combined mask, their inversion
    sdpa_ms, rows = None, check_rows(s, device)
    flops = 2.0 * b * s * heads * dims["topk"] * (2 * dims["latent"] + dims["rope"])
    chosen = sparse_attention_form("auto", heads, s)[0]
    for number, (kind, make) in enumerate(kinds.items()):
        indices = make(b, s, t)
        distinct = distinct_rows(indices)
        tiles = b * triton.cdiv(s, tile_rows(s))
        overlap = {"union_ratio": float(union_ratio(indices, mask, t, tile_rows(s), samples=tiles)),
                   "union_ratio_sampled": float(union_ratio(indices, mask, t, tile_rows(s)))}
        base = {**case, "kind": kind, "topk": indices.shape[2], "distinct": distinct, "chosen": chosen, **overlap}
        reference, _ = absorbed_sparse_attention(q[:, :, rows], latent, rope_key, weight, indices[:, rows],
                                                 None if mask is None else mask[:, :, rows], scale=scale)
        found = []

        def record(method, fn, **extra):
            row = {**base, "method": method, **extra}
            try:
                row["err_vs_reference"] = float((fn()[:, :, rows].float() - reference.float()).abs().max())
                row["ms"] = median_ms(fn, args.reps, device)
                row["tflops"] = flops / row["ms"] / 1e9
                row["floor_ms"] = 1e3 * flops / PEAK_FLOPS
            except Exception as exc:  # out of memory, a configuration that does not compile: recorded
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            found.append(row)

        absorbed = functools.partial(absorbed_sparse_attention_triton, q, latent, rope_key, weight, indices, mask,
                                     scale=scale, distinct=distinct)
        for name in configs:
            record(f"absorbed:{name}", functools.partial(absorbed, config=name))
        if number == 0:  # every configuration on the first kind, its fastest on the others
            ran = [r for r in found if "ms" in r]
            configs = [min(ran, key=lambda r: r["ms"])["method"].split(":", 1)[1]] if ran else configs[:1]
            try:
                found[0].update(graph_checks(absorbed, device))
            except Exception as exc:  # recorded: the timings stand without it
                found[0]["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if chosen == "auto":
            auto_form, reason = choose_form(q, latent, rope_key, weight, indices, mask, site=kind)
            record("auto", lambda: absorbed_sparse_attention_cuda(q, latent, rope_key, weight, indices, mask, scale,
                                                                  "zero", distinct, "auto", kind),
                   auto_form=auto_form, auto_reason=reason)
        if kv is None:
            found.append({**base, "method": "union", "error": "skipped: the expanded keys and values "
                          f"({expanded_bytes / 2**30:.0f} GiB) do not fit"})
        else:
            record("union", lambda: sparse_attention_triton(q, *kv, indices, mask, scale=scale)[0])
            if chosen == "auto":
                record("union:latent", lambda: sparse_attention_triton(
                    q, *expand_latent(latent, rope_key, weight, heads, dims["nope"]), indices, mask, scale=scale)[0])
        if kv is None or not fits(sdpa_bytes, device):
            found.append({**base, "method": "masked_sdpa", "error": "skipped: the expanded keys and values or "
                          f"the [B, S, T] masks ({sdpa_bytes / 2**30:.0f} GiB) do not fit"})
        else:
            row = {**base, "method": "masked_sdpa"}
            try:
                out = masked_sdpa(q, *kv, indices, mask, scale)
                row["err_vs_reference"] = float((out[:, :, rows].float() - reference.float()).abs().max())
                del out
                if sdpa_ms is None:
                    sdpa_ms = median_ms(lambda: masked_sdpa(q, *kv, indices, mask, scale), args.reps, device)
                row.update(ms=sdpa_ms, tflops=flops / sdpa_ms / 1e9)
            except Exception as exc:  # out of memory: recorded
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            found.append(row)
        timed = [r for r in found if "ms" in r]
        mine = [r["ms"] for r in timed if r["method"].split(":")[0] == chosen]
        if chosen == "auto":  # against the op's two forms as it would run them: from the latent
            timed = [r for r in timed if r["method"] not in ("union", "masked_sdpa")]
        best = min(r["ms"] for r in timed) if timed else None
        picked = min(mine) if mine else None
        for row in found:
            row["regret"] = None if picked is None else picked / best
            emit(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def load_selections(path, device):
    """(kinds {name: fn(b, s, t)}, B, S, T) of a ``--selections`` file (module docstring)."""
    data = torch.load(path, map_location="cpu")
    indices = data["indices"] if isinstance(data, dict) else data
    if not isinstance(indices, torch.Tensor) or indices.dim() != 3 or indices.dtype.is_floating_point:
        raise ValueError(f"--selections: expected a [B, S, K] integer tensor (or a dict with 'indices'), got "
                         f"{type(indices).__name__} {getattr(indices, 'shape', '')}")
    b, s, _ = indices.shape
    t = int(data.get("T", s)) if isinstance(data, dict) else s
    loaded = indices.to(device=device, dtype=torch.int32)
    return {f"file:{Path(path).stem}": lambda *_: loaded}, b, s, t


def render_markdown(doc) -> str:
    lines = [f"Device: {doc['device']}, torch {doc['torch']}, triton {doc['triton']}. {doc['shape']}. "
             f"TFLOP/s: the absorbed form's FLOPs over each method's time; floor at {PEAK_FLOPS / 1e12:.0f} "
             "TFLOP/s.", "",
             "| B | S | T | heads | kind | union / K | method | ms | TFLOP/s | x floor | chosen | regret | graph ms | "
             "err vs ref |", "|" + "---|" * 14]
    for r in doc["rows"]:
        method = r["method"] + (f" ({r['auto_form']})" if "auto_form" in r else "")
        ratio = "-" if r.get("union_ratio") is None else f"{r['union_ratio']:.2f}"
        head = f"| {r['B']} | {r['S']} | {r['T']} | {r['heads']} | {r.get('kind', '-')} | {ratio} | {method} |"
        if "ms" not in r:
            lines.append(head + f" {r.get('error', '')[:90]} |" + " |" * 6)
            continue
        cell = (lambda key, fmt: "-" if r.get(key) is None else format(r[key], fmt))
        ratio = "-" if "floor_ms" not in r else f"{r['ms'] / r['floor_ms']:.2f}"
        lines.append(head + f" {r['ms']:.3f} | {r['tflops']:.0f} | {ratio} | {r.get('chosen', '-')} | "
                     f"{cell('regret', '.2f')} | {cell('graph_ms', '.3f')} | {cell('err_vs_reference', '.2e')} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON path; the markdown table goes beside it (.md)")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run (TRITON_INTERPRET=1)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="cases that would start after this many seconds are skipped (the run then ends)")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--selections", default=None, help="a .pt file of [B, S, K] indices (module docstring)")
    ap.add_argument("--heads", nargs="+", type=int, default=[128, 16], help="heads of the --selections cases")
    ap.add_argument("--cases", nargs="+", default=None,
                    help="B:S:T:heads cases instead of the default list (S = T: causal prefill; S = 1: decode)")
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.smoke else "cuda")
    dims = SMOKE_DIMS if args.smoke else DIMS
    cases = SMOKE_CASES if args.smoke else GPU_CASES
    if args.cases is not None:
        cases = [tuple(int(x) for x in case.split(":")) for case in args.cases]
    kinds = {k: functools.partial(lambda kind, b, s, t, seed: selections(kind, b, s, t, dims["topk"], device, seed),
                                  k) for k in args.kinds}
    start = time.perf_counter()
    doc = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (Triton interpreter)",
           "torch": torch.__version__, "triton": triton.__version__,
           "shape": f"bf16, latent {dims['latent']} + rope {dims['rope']}, q/k nope {dims['nope']}, v {dims['v']}, "
                    f"top-K {dims['topk']}", "rows": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def emit(row):
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(doc, indent=1))

    plans = [({"B": b, "S": s, "T": t, "heads": h}, kinds) for b, s, t, h in cases]
    if args.selections:
        loaded, b, s, t = load_selections(args.selections, device)
        plans = [({"B": b, "S": s, "T": t, "heads": h}, loaded) for h in args.heads] + plans
    for case, case_kinds in plans:
        if time.perf_counter() - start > args.budget_s:
            emit({**case, "method": "-", "error": f"skipped: past the {args.budget_s:.0f} s budget"})
            continue
        seeded = {k: functools.partial(fn, seed=case["S"] + case["B"]) if k in KINDS else fn
                  for k, fn in case_kinds.items()}
        try:
            run_case(case, seeded, args, device, dims, emit)
        except Exception as exc:  # recorded; the run goes on with the next case
            emit({**case, "method": "-", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"[{time.perf_counter() - start:.0f} s] {case} done", flush=True)
    table = render_markdown(doc)
    out.with_suffix(".md").write_text(table)
    print(table)
    print(f"total {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
