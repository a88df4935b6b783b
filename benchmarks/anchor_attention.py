"""``anchors.py``'s attention rows: FlashMLA's sparse prefill against the project's absorbed sparse
attention on one ``anchor_inputs.AbsorbedCase``.

Variants (each checked on sampled query rows against an fp32 reference, then timed):
  flashmla           flash_mla_sparse_fwd(q_abs [B·S, H, 576], kv [B·T, 1, 576], flat_indices
                     [B·S, 1, K]) -> o_lat [B·S, H, 512]; for B > 1 the B caches lie end to end in
                     kv and each query's indices are offset by b·T (``FLASHMLA_ENTRY``)
  project_ws         the project's Gluon kernel (absorbed_attention_ws.attend_latent_ws) on views of
                     the same q_abs and kv, in launches of at most MAX_CHUNK queries
  project_dispatch   absorbed_attention._attend_latent with the op's default_configs(B·S): what the op
                     runs on these absorbed inputs (the Gluon kernel; on small grids replayed from a
                     CUDA graph, its split form)
  project_op         torch.ops.pulsar_dosa.absorbed_sparse_attention(q [B, H, S, 192], latent,
                     rope_key, kv_b_weight, indices, None, scale, "zero", distinct, "absorbed"): the
                     whole op, q_nope W_UK and o_lat W_UV^T included -> [B, H, S, 128]
  flashmla_pipeline  the same whole computation around FlashMLA: q_abs absorbed, flash_mla_sparse_fwd,
                     o_lat W_UV^T per head
Latent variants are compared with ``reference_latent``, whole ones with ``reference_output``.
FLOPs of a call: 2·B·S·H·K·(576 + 512), every index slot counted (FlashMLA's own count).
"""
from __future__ import annotations

from typing import Callable

import torch

from benchmarks import harness
from benchmarks.anchor_inputs import (LATENT, QK_DIM, SCALE, V_DIM, AbsorbedCase, absorbed_case, case_bytes,
                                      max_abs_error, reference_latent, reference_output, sample_rows)
from benchmarks.anchor_runs import Calls, Deadline, memory_shortfall, ratios, run_variants
from compiler.lowering.attention import absorbed_attention as dispatch
from compiler.lowering.attention.online_softmax import LOG2_E

VARIANTS = ("flashmla", "project_ws", "project_dispatch", "project_op", "flashmla_pipeline")
RATIOS = {"ws_speed_vs_flashmla": ("flashmla", "project_ws"),
          "dispatch_speed_vs_flashmla": ("flashmla", "project_dispatch"),
          "op_over_dispatch": ("project_op", "project_dispatch"),
          "op_over_flashmla": ("project_op", "flashmla"),
          "op_over_pipeline": ("project_op", "flashmla_pipeline")}
"""The issue's measures (each a ratio of median ms): FlashMLA's time over the project kernel's and
the dispatcher's (speed relative to FlashMLA, target >= 1), the op over the dispatcher (its overhead,
target <= 1.05), the op over FlashMLA (decode target <= 1.25) and over the FlashMLA pipeline."""
GRAPH_RATIOS = {"op_graph_over_flashmla_graph": ("project_op", "flashmla"),
                "ws_graph_over_flashmla_graph": ("project_ws", "flashmla")}
"""Decode rows: the op's and the Gluon kernel's device time (CUDA-graph replay) over FlashMLA's, what
the op would cost where the host stays ahead (a decode loop replayed from CUDA graphs)."""
FLASHMLA_ENTRY = ("flash_mla_sparse_fwd (FlashMLA's SM90 sparse prefill, the anchors' build; for B > 1 the B "
                  "caches end to end as one kv of B*T rows, each query's indices offset by b*T)")
"""The FlashMLA entry point every attention row uses (FlashMLA's decode entry, flash_mla_with_kvcache,
is not in the anchors' build)."""


def latent_kernel_call(case: AbsorbedCase, launch: Callable[..., None]) -> Callable[[], torch.Tensor]:
    """A call of ``launch(q_lat, q_rope, latent, rope_key, indices, o_lat)`` over the case's queries
    in chunks of at most MAX_CHUNK (a grid axis), writing ``case.o_buf``."""
    def call():
        for a in range(0, case.S, dispatch.MAX_CHUNK):
            sl = slice(a, a + dispatch.MAX_CHUNK)
            launch(case.q_lat[:, :, sl], case.q_rope[:, :, sl], case.latent, case.rope_key, case.indices[:, sl],
                   case.o_lat[:, :, sl])
        return case.o_buf
    return call


def ws_kernel_call(case: AbsorbedCase, ws) -> Callable[[], torch.Tensor]:
    """A call of the Gluon kernel of module ``ws`` (``absorbed_attention_ws`` or a file in its place)
    over the case, as ``latent_kernel_call`` chunks it (no mean rows)."""
    return latent_kernel_call(case, lambda *a: ws.attend_latent_ws(*a[:5], None, a[5], SCALE * LOG2_E))


def _pipeline(case: AbsorbedCase, flash_mla) -> Callable[[], torch.Tensor]:
    """The whole computation around FlashMLA (module docstring), output [B, H, S, 128] (a view)."""
    w_uv_t = case.weights()[1].transpose(1, 2)
    rows = case.B * case.S
    step = max(1, (1 << 28) // (case.heads * LATENT))

    def call():
        o = flash_mla.flash_mla_sparse_fwd(case.absorb(), case.kv, case.flat_indices, SCALE, LATENT)[0]
        out = torch.empty((case.heads, rows, V_DIM), dtype=o.dtype, device=o.device)
        for a in range(0, rows, step):
            torch.bmm(o[a:a + step].transpose(0, 1), w_uv_t, out=out[:, a:a + step])
        return out.view(case.heads, case.B, case.S, V_DIM).transpose(0, 1)
    return call


def variant_calls(case: AbsorbedCase, flash_mla, flash_mla_missing: str | None) -> Calls:
    """``Calls`` of every variant: kind "latent" or "output"."""
    n = case.B * case.S * case.heads
    calls: Calls = {}
    if flash_mla is None:
        for name in ("flashmla", "flashmla_pipeline"):
            calls[name] = (None, f"FlashMLA {flash_mla_missing}", 0)
    else:
        calls["flashmla"] = (lambda: flash_mla.flash_mla_sparse_fwd(case.q_abs, case.kv, case.flat_indices, SCALE,
                                                                    LATENT)[0], "latent", n * (2 * LATENT + 8))
        calls["flashmla_pipeline"] = (_pipeline(case, flash_mla), "output",
                                      n * (2 * LATENT + 2 * V_DIM + 8) + 4 * (1 << 28))
    ws = dispatch.absorbed_attention_ws
    if ws is None or not ws.usable(case.q_lat, case.q_rope, case.latent, case.rope_key, case.o_lat):
        calls["project_ws"] = (None, "the Gluon kernel does not take these inputs here (it needs sm_90)", 0)
    else:
        calls["project_ws"] = (ws_kernel_call(case, ws), "latent", 0)
    configs = dispatch.default_configs(case.B * case.S)
    calls["project_dispatch"] = (latent_kernel_call(case, lambda *a: dispatch._attend_latent(
        *a[:5], None, a[5], SCALE, configs, None)), "latent", 0)
    op = torch.ops.pulsar_dosa.absorbed_sparse_attention
    calls["project_op"] = (lambda: op(case.q, case.latent, case.rope_key, case.weight, case.indices, None, SCALE,
                                      "zero", True, "absorbed", "anchors"), "output",
                           dispatch.workspace_bytes(case.q, case.latent, case.rope_key, case.weight, case.indices))
    return calls


def attention_row(case: AbsorbedCase, flash_mla, flash_mla_missing: str | None, reps: int, warmup: int,
                  check_rows: int, seed: int, host_and_graph: bool = False) -> dict:
    """Every variant on one case: the row's sizes, ``results`` per variant and the ratios; with
    ``host_and_graph`` each variant's host issue time and CUDA-graph replay too, GRAPH_RATIOS, and
    ``op_host_profile``: where the whole op's host time goes (``harness.host_profile``)."""
    device = case.kv.device
    rows = sample_rows(case.B * case.S, check_rows, seed)
    rows_d = rows.to(device)
    b, s = rows_d // case.S, rows_d % case.S
    refs = {"latent": reference_latent(case, rows), "output": reference_output(case, rows)}
    pick = {"latent": lambda out: out[rows_d], "output": lambda out: out[b, :, s]}
    row = {"B": case.B, "S": case.S, "T": case.T, "heads": case.heads, "topk": case.topk, "kind": case.kind,
           "flops": 2.0 * case.B * case.S * case.heads * case.topk * (QK_DIM + LATENT), "rows_checked": rows.numel()}
    check = (lambda kind, out: {"err_vs_fp32": max_abs_error(pick[kind](out), refs[kind])})
    # o_buf zeroed ahead of each variant: a latent kernel that wrote nothing is not credited with another's output
    calls = variant_calls(case, flash_mla, flash_mla_missing)
    row["results"] = run_variants(calls, check, device, reps, warmup, row["flops"], "tflops", before=case.o_buf.zero_,
                                  host_and_graph=host_and_graph)
    row.update(ratios(row["results"], RATIOS))
    if host_and_graph:
        row.update(ratios(row["results"], GRAPH_RATIOS, "graph_ms"))
        if "ms" in row["results"]["project_op"]:
            row["op_host_profile"] = harness.host_profile(calls["project_op"][0], device)
    return row


def attention_rows(emit: Callable[[dict], None], part: str, shapes: list[tuple[int, int, int]], kinds: list[str],
                   heads: int, topk: int, device, flash_mla, flash_mla_missing: str | None, deadline: Deadline,
                   reps: int, warmup: int, check_rows: int, seed: int) -> None:
    """``emit`` one row per (B, S, T) of ``shapes`` and selection kind, in that order; a case past
    the deadline, or whose inputs would not fit, is emitted with the reason (``skipped``). Decode
    rows (``part`` "decode") also time each variant's host issue and CUDA-graph replay."""
    for B, S, T in shapes:
        for kind in kinds:
            head = {"part": part, "B": B, "S": S, "T": T, "heads": heads, "topk": topk, "kind": kind}
            if deadline.passed():
                emit({**head, "skipped": "deadline"})
                continue
            # the case's tensors, and the selection's draw ([B, S, K] int64 several times over)
            shortfall = memory_shortfall(case_bytes(B, S, T, heads, topk) + 40 * B * S * topk, device)
            if shortfall is not None:
                emit({**head, "skipped": f"inputs: {shortfall}"})
                continue
            case = absorbed_case(B, S, T, heads, topk, kind, device, seed + S + T + B)
            emit({"part": part, **attention_row(case, flash_mla, flash_mla_missing, reps, warmup, check_rows, seed,
                                                host_and_graph=part == "decode")})
            del case
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
