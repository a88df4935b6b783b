"""Phase-1 (context encoding) cost of dense, Star, Pulsar and Pulsar with a shared spine.

    PYTHONPATH=. python3 benchmarks/pulsar_phase1.py --out results.json --md results.md
    PYTHONPATH=. TRITON_INTERPRET=1 python3 benchmarks/pulsar_phase1.py --tiny   # CPU smoke run

A decoder stack of Llama-3.1-8B layer shapes (``--layers`` of them, random bf16 weights) encodes
the assembled phase-1 inputs of ``runtime.assembly.assemble`` with the Triton two-interval
attention kernel. Per mode and context length: ``phase1_flops_per_device`` (matmul FLOPs of the
largest per-host input: linear layers 2·tokens·weights, attention 4·heads·head_dim per visible
pair), ``phase1_ms`` (that input's forward, median of ``--reps`` after a warm-up) and
``phase1_flops_all_devices``. The same run checks the kernels against the torch references at
model sizes and measures the ceilings (bf16 matmul rate; torch's flash attention on the same
causal problem).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from benchmarks import harness
from benchmarks.phase1_flops import DecoderShape, visible_pairs
from compiler.lowering.attention.two_interval_attention import two_interval_attention_triton
from runtime.lse_merge import merge_partials
from runtime.assembly import PackedLayout, assemble
from runtime.attention_reference import two_interval_attention

MODES = (("dense", "dense", False), ("star", "star", False), ("pulsar", "pulsar", False),
         ("pulsar+spine", "pulsar", True))


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    layers: int
    vocab: int
    rope_theta: float = 500000.0

    def linear_weights_per_layer(self) -> int:
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        return qkv + self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.mlp


LLAMA_8B = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=14336, vocab=32000)
TINY = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, mlp=128, vocab=256)


class LlamaShapedStack(torch.nn.Module):
    """Embedding + ``layers`` pre-norm decoder layers (fused QKV, SwiGLU), random weights.

    ``forward(token_ids [T], position_ids [T], prefix_end [T], segment_start [T], keep [T])``
    returns the final hidden states [T, hidden] and per layer the kept (K, V) [1, Hkv, kept, D].
    """

    def __init__(self, shape: ModelShape, device, dtype):
        super().__init__()
        self.shape = shape
        gen = torch.Generator(device=device).manual_seed(0)

        def weight(rows, cols):
            return torch.nn.Parameter(torch.randn(rows, cols, generator=gen, device=device,
                                                  dtype=dtype) * 0.02, requires_grad=False)

        s = shape
        self.embed = weight(s.vocab, s.hidden)
        self.qkv = torch.nn.ParameterList(
            [weight((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden) for _ in range(s.layers)])
        self.o = torch.nn.ParameterList([weight(s.hidden, s.heads * s.head_dim) for _ in range(s.layers)])
        self.gate_up = torch.nn.ParameterList([weight(2 * s.mlp, s.hidden) for _ in range(s.layers)])
        self.down = torch.nn.ParameterList([weight(s.hidden, s.mlp) for _ in range(s.layers)])
        self.inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, device=device).float()
                                                / s.head_dim))

    @staticmethod
    def _rms_norm(x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)

    def _rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)

    def forward(self, token_ids, position_ids, prefix_end, segment_start, keep):
        s = self.shape
        t = token_ids.numel()
        angles = position_ids.float()[:, None] * self.inv_freq[None, :]
        cos = torch.cat([angles.cos(), angles.cos()], dim=-1)
        sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
        x = self.embed[token_ids]
        kept = []
        for layer in range(s.layers):
            h = self._rms_norm(x) @ self.qkv[layer].T
            q, k, v = h.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1)
            q = self._rope(q.view(t, s.heads, s.head_dim).transpose(0, 1), cos, sin)[None]
            k = self._rope(k.view(t, s.kv_heads, s.head_dim).transpose(0, 1), cos, sin)[None]
            v = v.view(t, s.kv_heads, s.head_dim).transpose(0, 1)[None]
            o, _ = two_interval_attention_triton(q, k, v, prefix_end[None], segment_start[None],
                                                 scale=s.head_dim ** -0.5)
            kept.append((k[:, :, keep], v[:, :, keep]))
            x = x + o[0].transpose(0, 1).reshape(t, -1) @ self.o[layer].T
            gate, up = (self._rms_norm(x) @ self.gate_up[layer].T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ self.down[layer].T
        return x, kept


@dataclass(frozen=True)
class HostInput:
    """One device's phase-1 input, in its own packed coordinates."""

    token_ids: torch.Tensor
    position_ids: torch.Tensor
    prefix_end: torch.Tensor
    segment_start: torch.Tensor
    keep: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The model's forward arguments."""
        return self.token_ids, self.position_ids, self.prefix_end, self.segment_start, self.keep


def host_inputs(layout: PackedLayout, token_ids: torch.Tensor, one_device: bool, device) -> list[HostInput]:
    """Split a layout into per-host inputs (one per segment), or keep it whole on one device;
    the tensors are moved to ``device``."""
    bounds = [0, layout.source_index.numel()] if one_device else layout.cu_seqlens.tolist()
    inputs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if not one_device and bool((layout.prefix_end[a:b] > 0).any()):
            raise ValueError("a per-host segment reads keys before its start: not splittable")
        parts = (token_ids[layout.source_index[a:b]], layout.position_ids[a:b],
                 (layout.prefix_end[a:b] - a).clamp(min=0), layout.segment_start[a:b] - a, layout.keep[a:b])
        inputs.append(HostInput(*(x.to(device) for x in parts)))
    return inputs


def phase1_flops(shape: ModelShape, inp: HostInput) -> int:
    """``benchmarks.phase1_flops``'s count for one host's input."""
    decoder = DecoderShape(shape.layers, shape.heads * shape.head_dim, shape.linear_weights_per_layer())
    return decoder.flops(inp.token_ids.numel(), visible_pairs(inp.prefix_end, inp.segment_start))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def max_lse_error(lse: torch.Tensor, ref: torch.Tensor) -> float:
    if not torch.equal(torch.isneginf(lse), torch.isneginf(ref)):
        return float("inf")
    finite = torch.isfinite(ref)
    return float((lse[finite] - ref[finite]).abs().max())


def correctness_checks(shape: ModelShape, model: LlamaShapedStack, length: int, blocks: int,
                       sink: int, chunk: int, device, dtype) -> dict:
    """Kernels against the torch references on model-sized heads (random inputs)."""
    gen = torch.Generator(device=device).manual_seed(1)
    checks = {}
    ids = torch.randint(0, shape.vocab, (length,), generator=torch.Generator().manual_seed(1))
    layout = assemble(ids, length // blocks, mode="pulsar", shared_spine=True, sink=sink, chunk=chunk)
    spine_input = host_inputs(layout, ids, True, device)[0]
    p = layout.source_index.numel()

    def heads(n, s):
        return torch.randn(1, n, s, shape.head_dim, generator=gen, device=device, dtype=dtype)

    q, k, v = heads(shape.heads, p), heads(shape.kv_heads, p), heads(shape.kv_heads, p)
    args = (q, k, v, spine_input.prefix_end[None], spine_input.segment_start[None])
    o, lse = two_interval_attention_triton(*args, scale=shape.head_dim ** -0.5)
    ref_o, ref_lse = two_interval_attention(*args, scale=shape.head_dim ** -0.5)
    checks[f"attention_spine_layout_{p}_tokens_vs_reference"] = {
        "rel_err_o": relative_error(o, ref_o), "max_abs_err_lse": max_lse_error(lse, ref_lse)}

    causal = torch.zeros(1, p, dtype=torch.int64, device=device)
    o, _ = two_interval_attention_triton(q, k, v, causal, causal, scale=shape.head_dim ** -0.5)
    group = shape.heads // shape.kv_heads
    sdpa = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                          is_causal=True, scale=shape.head_dim ** -0.5)
    checks[f"attention_causal_{p}_tokens_vs_sdpa"] = {"rel_err_o": relative_error(o, sdpa)}
    short = min(p, 1024)
    for other in (torch.float16, torch.float32):
        qs, ks, vs = (x[:, :, :short].to(other) for x in (q, k, v))
        bounds = (causal[:, :short], causal[:, :short])
        o, lse = two_interval_attention_triton(qs, ks, vs, *bounds, scale=shape.head_dim ** -0.5)
        ref_o, ref_lse = two_interval_attention(qs, ks, vs, *bounds, scale=shape.head_dim ** -0.5)
        checks[f"attention_causal_{short}_tokens_{str(other)[6:]}_vs_reference"] = {
            "rel_err_o": relative_error(o, ref_o), "max_abs_err_lse": max_lse_error(lse, ref_lse)}

    queries = 128
    qq = heads(shape.heads, queries)
    shards = torch.arange(p, device=device).tensor_split(blocks)
    partials = [two_interval_attention_triton(
        qq, k[:, :, idx], v[:, :, idx], torch.full((1, queries), idx.numel(), device=device),
        torch.full((1, queries), idx.numel(), device=device), scale=shape.head_dim ** -0.5)
        for idx in shards]
    merged_o, merged_lse = merge_partials(torch.stack([x[0] for x in partials]),
                                                 torch.stack([x[1] for x in partials]))
    everything = torch.full((1, queries), p, device=device)
    ref_o, ref_lse = two_interval_attention(qq, k, v, everything, everything, scale=shape.head_dim ** -0.5)
    checks[f"merge_{blocks}_shards_{queries}_queries_vs_reference"] = {
        "rel_err_o": relative_error(merged_o, ref_o), "max_abs_err_lse": max_lse_error(merged_lse, ref_lse)}

    with torch.inference_mode():
        per_host = [model(*inp.tensors())[1][-1]
                    for inp in host_inputs(assemble(ids, length // blocks, mode="pulsar", sink=sink,
                                                    chunk=chunk), ids, False, device)]
        spine = model(*spine_input.tensors())[1][-1]
    checks["spine_vs_per_host_kept_kv_last_layer"] = {
        "rel_err_k": relative_error(spine[0], torch.cat([x[0] for x in per_host], dim=2)),
        "rel_err_v": relative_error(spine[1], torch.cat([x[1] for x in per_host], dim=2))}
    for check in checks.values():
        check["ok"] = all(err == err and err < 1e-2 for err in check.values())
    return checks


def ceilings(device, dtype) -> dict:
    """Measured bf16 matmul rate (8192^3) and torch's flash attention rate, causal 32K x 32 heads."""
    if device.type != "cuda":
        return {}
    n = 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms = harness.measure(lambda: a @ b, device, 10).ms
    out = {"matmul_bf16_8192_tflops": 2 * n ** 3 / ms / 1e9}
    s, h, d = 32768, 32, 128
    q, k, v = (torch.randn(1, h, s, d, device=device, dtype=dtype) for _ in range(3))
    causal = torch.zeros(1, s, dtype=torch.int64, device=device)
    flops = 4 * h * d * s * (s + 1) / 2
    ms_sdpa = harness.measure(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device, 10).ms
    ms_ours = harness.measure(lambda: two_interval_attention_triton(q, k, v, causal, causal, scale=d ** -0.5),
                              device, 10).ms
    out.update({"causal_attention_32k_sdpa_ms": ms_sdpa, "causal_attention_32k_sdpa_tflops": flops / ms_sdpa / 1e9,
                "causal_attention_32k_triton_ms": ms_ours,
                "causal_attention_32k_triton_tflops": flops / ms_ours / 1e9})
    return out


def phase1_rows(shape, model, lengths, blocks, sink, chunk, reps, device) -> list[dict]:
    rows = []
    for length in lengths:
        ids = torch.randint(0, shape.vocab, (length,), generator=torch.Generator().manual_seed(length))
        for name, mode, spine in MODES:
            layout = assemble(ids, length // blocks, mode=mode, shared_spine=spine, sink=sink, chunk=chunk)
            inputs = host_inputs(layout, ids, mode == "dense" or spine, device)
            flops = [phase1_flops(shape, inp) for inp in inputs]
            largest = inputs[max(range(len(inputs)), key=flops.__getitem__)]
            with torch.inference_mode():
                ms = harness.measure(lambda: model(*largest.tensors()), device, reps, host_paced=True).ms
            row = {"mode": name, "L": length, "blocks": blocks, "devices": len(inputs),
                   "tokens_per_device": largest.token_ids.numel(),
                   "phase1_flops_per_device": max(flops), "phase1_ms": ms,
                   "achieved_tflops": max(flops) / ms / 1e9,
                   "phase1_flops_all_devices": sum(flops)}
            rows.append(row)
            print(f"{name:>13} L={length:>6} tokens/device={row['tokens_per_device']:>6} "
                  f"flops/device={row['phase1_flops_per_device']:.3e} {ms:9.2f} ms "
                  f"({row['achieved_tflops']:.0f} TFLOP/s)", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def targets(rows: list[dict], length: int) -> dict:
    """Star / Pulsar ratios at ``length`` against the targets (3x FLOPs, 2.5x time per device)."""
    by_mode = {r["mode"]: r for r in rows if r["L"] == length}
    star, pulsar = by_mode["star"], by_mode["pulsar"]
    flops_ratio = star["phase1_flops_per_device"] / pulsar["phase1_flops_per_device"]
    time_ratio = star["phase1_ms"] / pulsar["phase1_ms"]
    return {"L": length, "star_over_pulsar_flops_per_device": flops_ratio,
            "star_over_pulsar_time_per_device": time_ratio,
            "flops_target_3x_met": flops_ratio >= 3.0, "time_target_2_5x_met": time_ratio >= 2.5,
            "star_all_devices_over_pulsar_spine_flops":
                star["phase1_flops_all_devices"] / by_mode["pulsar+spine"]["phase1_flops_all_devices"]}


def markdown(result: dict) -> str:
    """The result as Markdown: setup, table, ceilings, checks and the targets with their bound."""
    m, v = result["model"], harness.versions_of(result)
    lines = [f"Phase 1 on {result['device']} (torch {v['torch']}, triton {v.get('triton')}): "
             f"{m['layers']} decoder layers of Llama-3.1-8B shape (hidden {m['hidden']}, {m['heads']} heads, "
             f"{m['kv_heads']} KV heads, head dim {m['head_dim']}, MLP {m['mlp']}), bf16, random weights; "
             f"{result['blocks']} blocks, sink {result['sink']}, chunk {result['chunk']}, summary ratio "
             f"{result['summary_ratio']}, {result['heuristic']}, {result['positions']} positions; "
             f"median of {result['reps']} runs after a warm-up. Per device = the largest per-host input "
             "(dense and pulsar+spine: everything on one device).", "",
             "| mode | L | blocks | tokens/device | phase-1 FLOPs/device | phase-1 ms | TFLOP/s "
             "| FLOPs, all devices |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['mode']} | {r['L']} | {r['blocks']} | {r['tokens_per_device']} | "
                     f"{r['phase1_flops_per_device']:.3e} | {r['phase1_ms']:.1f} | {r['achieved_tflops']:.0f} | "
                     f"{r['phase1_flops_all_devices']:.3e} |")
    c = result["ceilings"]
    if c:
        lines += ["", f"Ceilings: bf16 matmul 8192^3 {c['matmul_bf16_8192_tflops']:.0f} TFLOP/s; causal "
                  f"attention 32K tokens x 32 heads x 128: torch SDPA {c['causal_attention_32k_sdpa_ms']:.1f} ms "
                  f"({c['causal_attention_32k_sdpa_tflops']:.0f} TFLOP/s), two-interval Triton kernel "
                  f"{c['causal_attention_32k_triton_ms']:.1f} ms ({c['causal_attention_32k_triton_tflops']:.0f} TFLOP/s)."]
    lines += ["", "Checks (relative error ||out - ref|| / ||ref||, lse absolute error):", ""]
    for name, check in result["checks"].items():
        errors = ", ".join(f"{k} {v:.2e}" for k, v in check.items() if k != "ok")
        lines.append(f"- {name}: {errors} ({'ok' if check['ok'] else 'FAILED'})")
    t = result["targets"]
    sigma, n = result["summary_ratio"], result["blocks"]
    token_ratio = 2 / (1 + (n - 1) * sigma)
    lines += ["", f"Targets at L={t['L']}: Star/Pulsar phase-1 FLOPs per device "
              f"{t['star_over_pulsar_flops_per_device']:.2f}x (target 3x: "
              f"{'met' if t['flops_target_3x_met'] else 'not met'}), time per device "
              f"{t['star_over_pulsar_time_per_device']:.2f}x (target 2.5x: "
              f"{'met' if t['time_target_2_5x_met'] else 'not met'}). Bound: the largest Pulsar input "
              f"is about (1 + (n-1)σ)|B| tokens against Star's 2|B|, so per device the linear FLOPs fall "
              f"by at most {token_ratio:.2f}x and the attention FLOPs by at most {token_ratio ** 2:.2f}x "
              f"(n = {n}, σ = {sigma}); no mix of the two reaches 3x. Star on all devices over "
              f"Pulsar with the shared spine on one device: {t['star_all_devices_over_pulsar_spine_flops']:.2f}x "
              "FLOPs."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[32768, 65536, 131072])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sink", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--check-length", type=int, default=8192)
    parser.add_argument("--tiny", action="store_true", help="tiny model and lengths (CPU smoke run)")
    parser.add_argument("--out", default=None, help="JSON result path")
    parser.add_argument("--md", default=None, help="Markdown table path")
    parser.add_argument("--render", default=None, metavar="JSON",
                        help="only write the Markdown (--md, else stdout) of an earlier result file")
    args = parser.parse_args()
    if args.render:
        with open(args.render, encoding="utf-8") as fh:
            text = markdown(json.load(fh))
        if args.md:
            with open(args.md, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            print(text)
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    if args.tiny:
        args.lengths, args.sink, args.chunk, args.check_length, args.reps = [256, 512], 8, 8, 256, 1
    shape = ModelShape(layers=args.layers, **(TINY if args.tiny else LLAMA_8B))
    model = LlamaShapedStack(shape, device, dtype)
    result = harness.header(device, model=asdict(shape), blocks=args.blocks, sink=args.sink, chunk=args.chunk,
                            summary_ratio=0.125, heuristic="max_idf", positions="sparse", reps=args.reps)
    result["ceilings"] = ceilings(device, dtype)
    print("ceilings:", json.dumps(result["ceilings"]), flush=True)
    result["checks"] = correctness_checks(shape, model, args.check_length, args.blocks, args.sink,
                                          args.chunk, device, dtype)
    print("checks:", json.dumps(result["checks"]), flush=True)
    result["rows"] = phase1_rows(shape, model, args.lengths, args.blocks, args.sink, args.chunk,
                                 args.reps, device)
    result["targets"] = targets(result["rows"], max(args.lengths))
    print(markdown(result))
    if args.out:
        harness.write_json(args.out, result)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as fh:
            fh.write(markdown(result))


if __name__ == "__main__":
    main()
