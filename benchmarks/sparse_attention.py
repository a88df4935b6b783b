"""DSA sparse attention at DeepSeek-V3.2's attention shape: transformers' masked SDPA against
``pulsar_dosa.sparse_attention``, with correctness checked in the same run.

Run on one CUDA GPU from the repository root (about 3 minutes on an H200):

    PYTHONPATH=. python3 benchmarks/sparse_attention.py --out benchmarks/results/sparse_attention_h200.json

and on the CPU, tiny, under the Triton interpreter (checks that the script works):

    TRITON_INTERPRET=1 PYTHONPATH=. python3 benchmarks/sparse_attention.py --smoke --out /tmp/sparse_smoke.json

Shape: H = 128 heads, qk head dim 192 (nope 128 + rope 64), v head dim 128, top-K = 2048, bf16,
B = 1 (transformers' non-absorbed MLA: per-head K/V). Cases: prefill S = T (causal) and decode
S = 1 at the end of T keys. Index sources (what the indexer selected):

* ``window_g64`` / ``window_g16``: the 64 sink keys, the 1024 most recent keys and 15 far blocks
  of 64 keys shared by each group of 64 / 16 consecutive queries (neighbouring queries of a DSA
  layer select much the same far keys: the locality the DoSA witnesses rely on, SPEC A.8; with
  groups of 16 a tile of 64 queries walks four groups' far blocks);
* ``uniform``: one key drawn uniformly in each of 2048 equal strata of the visible keys, per query
  (no locality at all: the adversarial case for a tile of queries sharing key loads).

A query with at most 2048 visible keys selects keys 0..2047 (what ``topk`` returns there: all
visible keys, then hidden ones, which the causal mask hides). Methods, each timed by CUDA events
(median), with the index mask building included where the model builds it:

* ``masked_sdpa``: what transformers runs: ``ones.scatter(-1, indices, False)``, ``mask & ~index_mask``,
  ``F.scaled_dot_product_attention`` over all T keys (timed once per (S, T): its work does not
  depend on the indices; its output is compared for every source);
* ``sparse``: the op (``compiler.lowering.attention.sparse_attention``); ``build_ms`` is its union
  building alone, ``graph_ms`` a CUDA-graph replay (captured after warm-up; ``no_sync``: an eager
  call with host synchronisation forbidden succeeded; ``graph_identical``: replay == eager, bitwise).

Correctness on sampled query rows (every row for decode): ``err_vs_reference`` = max |sparse -
runtime reference (fp32)|, ``err_vs_masked_sdpa`` = max |sparse - masked SDPA|, and
``masked_sdpa_vs_reference`` (SDPA's own bf16 error). A separate small check runs rows without any
visible key through both dense chains (SDPA with a bool mask -> 0; eager with finfo.min -> mean of v).

Floor of the sparse kernel: FLOPs = 2·(Dqk+Dv)·H·Σ_rows |visible selected keys| at 780 TFLOP/s
(bf16 dense, measured) and bytes = q + o + the K/V rows read at least once + indices at
4.2 TB/s; ``floor_ms`` is the larger. ``union_per_row``: keys a 64-query tile walks per useful
key (the score work above the floor: 1 = none).
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch
import torch.nn.functional as F
import triton

import benchmarks.indexer_graphs as graphs
from compiler.lowering.attention.sparse_attention import build_union, sparse_attention_triton, tile_rows
from runtime.sparse_attention import selected_keys, sparse_attention

QK_DIM, V_DIM, TOPK = 192, 128, 2048
SINK, WINDOW, FAR_BLOCK, FAR_BLOCKS, GROUPS = 64, 1024, 64, 15, (64, 16)
PEAK_FLOPS, PEAK_BYTES = 780e12, 4.2e12
SCALE = QK_DIM ** -0.5
CHECK_ROWS = 48


def window_indices(s, t, topk, device, seed, group):
    """[1, S, topk] int32: sink + recent window + far blocks shared by groups of ``group`` queries."""
    g = torch.Generator(device=device).manual_seed(seed)
    pos = torch.arange(t - s, t, device=device)
    far_total = topk - SINK - WINDOW
    sink = torch.arange(SINK, device=device).expand(s, SINK)
    recent = pos[:, None] - torch.arange(WINDOW, device=device)[None, :]
    # Far blocks: per group, FAR_BLOCKS distinct 64-key blocks strictly between sink and window.
    groups = (s + group - 1) // group
    first = pos[::group]
    room = ((first - WINDOW - SINK) // FAR_BLOCK).clamp(min=1)
    slots = max(int(room.max()), FAR_BLOCKS)
    draw = torch.rand(groups, slots, generator=g, device=device)
    draw = draw.masked_fill(torch.arange(slots, device=device)[None, :] >= room[:, None], 2.0)
    blocks = draw.topk(FAR_BLOCKS, dim=1, largest=False).indices  # [groups, FAR_BLOCKS]
    far = SINK + blocks[:, :, None] * FAR_BLOCK + torch.arange(FAR_BLOCK, device=device)
    far = far.reshape(groups, -1)[:, :far_total].repeat_interleave(group, dim=0)[:s]
    chosen = torch.cat([sink, recent, far], dim=1)
    short = pos < topk  # at most topk visible keys: topk lists keys 0..topk-1
    chosen = torch.where(short[:, None], torch.arange(topk, device=device)[None, :], chosen)
    return chosen.to(torch.int32).unsqueeze(0)


def uniform_indices(s, t, topk, device, seed):
    """[1, S, topk] int32: one key uniformly in each of topk strata of the query's visible keys."""
    g = torch.Generator(device=device).manual_seed(seed)
    pos = torch.arange(t - s, t, device=device)
    u = torch.rand(s, topk, generator=g, device=device, dtype=torch.float64)
    strata = (torch.arange(topk, device=device)[None, :] + u) * ((pos[:, None] + 1) / topk)
    chosen = strata.floor().long().clamp(max=t - 1)
    chosen = torch.where((pos < topk)[:, None], torch.arange(topk, device=device)[None, :], chosen)
    return chosen.to(torch.int32).unsqueeze(0)


def sources() -> dict:
    """Index source name -> ``fn(s, t, topk, device, seed)`` (module docstring)."""
    found = {f"window_g{g}": functools.partial(window_indices, group=g) for g in GROUPS}
    return {**found, "uniform": uniform_indices}


def causal_mask(s, t, device):
    """[1, 1, S, T] bool: S queries at the end of T keys, causal."""
    return (torch.arange(t, device=device)[None, :] <= torch.arange(t - s, t, device=device)[:, None]).view(1, 1, s, t)


def masked_sdpa(q, k, v, indices, mask):
    """transformers' DSA attention (sdpa implementation): index mask, combined mask, dense SDPA."""
    b, s, _ = indices.shape
    index_mask = indices.new_ones((b, s, k.shape[2]), dtype=torch.bool).scatter(-1, indices.long(), False)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask & ~index_mask.unsqueeze(1), scale=SCALE)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def one_call_ms(fn, device):
    """Milliseconds of one call of ``fn`` (CUDA events on a GPU, wall clock on the CPU)."""
    if device.type == "cuda":
        return graphs.median_ms(fn, 1)
    start = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - start)


def median_ms(fn, reps, device, budget_ms=3000.0):
    """Median milliseconds of ``fn`` over up to ``reps`` calls, fewer when a call is long (about
    ``budget_ms`` in all, at least 2 calls)."""
    times = []
    while len(times) < reps and (len(times) < 2 or sum(times) < budget_ms):
        sync(device)
        times.append(one_call_ms(fn, device))
    return statistics.median(times)


def check_rows(s):
    """Query rows checked against the reference: the first ones, around TOPK, spread, the last."""
    picks = {min(s - 1, r) for r in (0, 1, TOPK - 1, TOPK, TOPK + 1, s - 1)}
    picks |= {int(x) for x in torch.linspace(0, s - 1, CHECK_ROWS - len(picks))}
    return torch.tensor(sorted(picks))


def floor_ms(pairs, keys_read, s, heads):
    flops = 2.0 * (QK_DIM + V_DIM) * heads * pairs
    bytes_ = 2.0 * heads * (s * QK_DIM + s * V_DIM + keys_read * (QK_DIM + V_DIM)) + 4.0 * s * TOPK
    return 1e3 * max(flops / PEAK_FLOPS, bytes_ / PEAK_BYTES)


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
    result = {"no_sync": no_sync, "graph_identical": identical, "graph_ms": median_ms(graph.replay, 10, device)}
    del graph
    return result


def run_case(s, t, heads, device, dtype, reps, rows_out):
    """Rows of one (S, T): masked SDPA (timed once: its work does not depend on the indices) and
    sparse per index source, errors on sampled rows, the floor."""
    g = torch.Generator(device=device).manual_seed(s + t)
    q = torch.randn(1, heads, s, QK_DIM, generator=g, device=device, dtype=dtype)
    k = torch.randn(1, heads, t, QK_DIM, generator=g, device=device, dtype=dtype)
    v = torch.randn(1, heads, t, V_DIM, generator=g, device=device, dtype=dtype)
    mask = causal_mask(s, t, device)
    rows = check_rows(s).to(device)
    dense_ms = None
    for source, make in sources().items():
        indices = make(s, t, TOPK, device, seed=s + 1)
        base = {"S": s, "T": t, "heads": heads, "source": source, "topk": TOPK}

        def sparse():
            return sparse_attention_triton(q, k, v, indices, mask, scale=SCALE)[0]

        picked = sparse()[:, :, rows].float()
        _, visible = selected_keys(indices, t, mask)
        pairs = int(visible.sum())
        keys_read = int(torch.zeros(t, dtype=torch.bool, device=device).scatter(
            0, indices.long().flatten(), True).sum()) if s == 1 else t
        _, _, sizes, _ = build_union(indices, mask, t, tile_rows(s))
        reference, _ = sparse_attention(q[:, :, rows], k, v, indices[:, rows], mask[:, :, rows], scale=SCALE)
        sparse_row = {**base, "method": "sparse", "ms": median_ms(sparse, reps, device),
                      "build_ms": median_ms(lambda: build_union(indices, mask, t, tile_rows(s)), reps, device),
                      "floor_ms": floor_ms(pairs, keys_read, s, heads), "pairs": pairs,
                      "union_per_row": float(sizes.double().sum() * min(s, tile_rows(s)) / max(pairs, 1)),
                      "err_vs_reference": float((picked - reference.float()).abs().max())}
        sparse_row.update(graph_checks(sparse, device))
        dense_row = {**base, "method": "masked_sdpa"}
        try:
            dense_rows = masked_sdpa(q, k, v, indices, mask)[:, :, rows].float()
            if dense_ms is None:
                dense_ms = median_ms(lambda: masked_sdpa(q, k, v, indices, mask), reps, device)
            dense_row["ms"] = dense_ms
            dense_row["masked_sdpa_vs_reference"] = float((dense_rows - reference.float()).abs().max())
            sparse_row["err_vs_masked_sdpa"] = float((picked - dense_rows).abs().max())
            sparse_row["speedup"] = dense_ms / sparse_row["ms"]
        except torch.OutOfMemoryError as exc:
            dense_row["error"] = repr(exc)[:300]
        rows_out += [dense_row, sparse_row]
        for row in (dense_row, sparse_row):
            print(json.dumps(row), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def masked_rows_check(device, dtype):
    """Rows with no visible key, on this device: sparse "zero" == SDPA with a bool mask and sparse
    "mean" == the eager chain with finfo.min, on a small left-padded case."""
    g = torch.Generator(device=device).manual_seed(7)
    q = torch.randn(1, 4, 96, QK_DIM, generator=g, device=device, dtype=dtype)
    k = torch.randn(1, 4, 96, QK_DIM, generator=g, device=device, dtype=dtype)
    v = torch.randn(1, 4, 96, V_DIM, generator=g, device=device, dtype=dtype)
    indices = uniform_indices(96, 96, 16, device, seed=3)
    mask = causal_mask(96, 96, device).clone()
    mask[..., :, :10] = False  # ten padded keys: query rows 0..9 see nothing
    index_mask = torch.ones(1, 96, 96, dtype=torch.bool, device=device).scatter(-1, indices.long(), False)
    visible = mask & ~index_mask.unsqueeze(1)
    zero_ref = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=SCALE)
    lowest = torch.finfo(dtype).min
    additive = torch.zeros(visible.shape, device=device, dtype=dtype).masked_fill(~visible, lowest)
    weights = torch.softmax(torch.matmul(q, k.transpose(2, 3)) * SCALE + additive, dim=-1, dtype=torch.float32)
    mean_ref = torch.matmul(weights.to(dtype), v)
    result = {}
    for rows, ref in (("zero", zero_ref), ("mean", mean_ref)):
        out, _ = sparse_attention_triton(q, k, v, indices, mask, scale=SCALE, masked_rows=rows)
        result[f"{rows}_rows_err"] = float((out.float() - ref.float()).abs().max())
        result[f"{rows}_rows_padded_err"] = float((out[:, :, :10].float() - ref[:, :, :10].float()).abs().max())
    print(json.dumps({"masked_rows_check": result}), flush=True)
    return result


def render_markdown(doc) -> str:
    lines = [f"Device: {doc['device']}, torch {doc['torch']}, triton {doc['triton']}. {doc['shape']}. "
             f"Floor: FLOPs at {PEAK_FLOPS / 1e12:.0f} TFLOP/s or bytes at {PEAK_BYTES / 1e12:.1f} TB/s.", "",
             "| S | T | heads | indices | method | ms | graph ms | build ms | floor ms | x floor | speedup | "
             "union/row | err vs ref | err vs masked SDPA |", "|" + "---|" * 14]
    for r in doc["rows"]:
        if "ms" not in r:
            lines.append(f"| {r['S']} | {r['T']} | {r['heads']} | {r['source']} | {r['method']} | "
                         f"error: {r.get('error', '')[:60]} |" + " |" * 8)
            continue
        cell = (lambda key, fmt: "-" if r.get(key) is None else format(r[key], fmt))
        ratio = "-" if "floor_ms" not in r else f"{r['ms'] / r['floor_ms']:.2f}"
        lines.append(f"| {r['S']} | {r['T']} | {r['heads']} | {r['source']} | {r['method']} | {r['ms']:.3f} | "
                     f"{cell('graph_ms', '.3f')} | {cell('build_ms', '.3f')} | {cell('floor_ms', '.3f')} | {ratio} | "
                     f"{cell('speedup', '.1f')} | {cell('union_per_row', '.2f')} | {cell('err_vs_reference', '.2e')} | "
                     f"{cell('err_vs_masked_sdpa', '.2e')} |")
    if "masked_rows_check" in doc:
        lines += ["", "Rows without a visible key (max abs error, all rows / padded rows): "
                  + ", ".join(f"{k} {v:.2e}" for k, v in doc["masked_rows_check"].items())]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="JSON path; the markdown table goes beside it (.md)")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run (TRITON_INTERPRET=1)")
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cases", nargs="+", default=["16384:16384", "65536:65536", "1:131072", "1:524288"],
                    help="S:T cases on the GPU (S = T: causal prefill; S = 1: decode at the end of T keys)")
    args = ap.parse_args()
    global TOPK, SINK, WINDOW, FAR_BLOCK, FAR_BLOCKS, GROUPS, CHECK_ROWS
    if args.smoke:
        device, heads, reps = torch.device("cpu"), 2, 1
        TOPK, SINK, WINDOW, FAR_BLOCK, FAR_BLOCKS, GROUPS, CHECK_ROWS = 64, 4, 32, 4, 7, (16, 4), 8
        cases = [(256, 256), (1, 1024)]
    else:
        device, heads, reps = torch.device("cuda"), args.heads, args.reps
        cases = [tuple(int(x) for x in case.split(":")) for case in args.cases]
    start = time.perf_counter()
    doc = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (Triton interpreter)",
           "torch": torch.__version__, "triton": triton.__version__,
           "shape": f"bf16, qk dim {QK_DIM}, v dim {V_DIM}, top-K {TOPK}, causal, B = 1", "rows": []}
    try:
        doc["masked_rows_check"] = masked_rows_check(device, torch.bfloat16)
    except Exception as exc:  # recorded; the cases still run
        doc["masked_rows_check_error"] = repr(exc)[:500]
        print(json.dumps({"masked_rows_check_error": doc["masked_rows_check_error"]}), flush=True)
    for s, t in cases:
        try:
            run_case(s, t, heads, device, torch.bfloat16, reps, doc["rows"])
        except Exception as exc:  # recorded; the run goes on with the next case
            doc["rows"].append({"S": s, "T": t, "heads": heads, "source": "-", "method": "sparse",
                                "error": repr(exc)[:500]})
            print(json.dumps(doc["rows"][-1]), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"[{time.perf_counter() - start:.0f} s] S={s} T={t} done", flush=True)
    table = render_markdown(doc)
    with open(args.out.rsplit(".", 1)[0] + ".md", "w") as f:
        f.write(table)
    print(table)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
