"""DSA sparse attention of MLA in its absorbed form, in Triton: every query's heads on the MMA's
rows, its selected latent rows gathered in tiles.

Contract: ``runtime.absorbed_attention.absorbed_sparse_attention`` (q ``[B, H, S, Dn+Dr]``,
latent ``[B, T, Dc]``, rope_key ``[B, T, Dr]``, kv_b_weight ``[H·(Dn+Dv), Dc]``, indices
``[B, S, K]``, mask None or bool broadcastable to ``[B, 1, S, T]``; o ``[B, H, S, Dv]`` in q's
dtype). bf16, fp16 or fp32, one dtype.

Why this form (FlashMLA's sparse prefill and decode). transformers expands the latent into per-head
keys and values (192 + 128 dims per head at DeepSeek-V3.2), so a query's 2048 selected keys cost
H·2048·320·2 bytes to read, once per head. Here a key is one latent row of Dc + Dr = 576 values
shared by all heads: the query's nope part is moved into the latent space, q_lat = q_nope W_UK
(Dc = 512), and one program takes BLOCK_H heads of one query as the rows of the matrix products:

    S = q_lat · cᵀ + q_rope · krᵀ     [BLOCK_H, BLOCK_N]     (gathered c [BLOCK_N, Dc], kr [BLOCK_N, Dr])
    o_lat += softmax-weights · c      [BLOCK_H, Dc]          (online softmax in base 2, fp32)

then out = o_lat W_UVᵀ per head. 2·H·K·(Dc + Dr + Dc) FLOPs per query whatever the selection: the
tile walks only the query's own K indices, so how the queries' selections overlap does not matter.
The two weight products are batched matmuls over the heads around the kernel (q_lat and o_lat are
kept head-major, ``[H, B, chunk, Dc]``), on the weight the graph holds, at every call (nothing is
cached). Queries are processed in chunks so that q_lat and o_lat stay below ``CHUNK_ELEMENTS``.

Masking: an index outside ``[0, T)``, a repeat and a key the mask hides get score -inf and their
latent row is not loaded (0 in its place), so a value such a key holds (inf, NaN) never reaches the
output. Where there is a mask or repeats may occur (``distinct`` False: the indices are sorted per
row first and a key equal to its predecessor is a repeat), ``_visible_indices_kernel`` first
writes each row's index list with -1 for every such key, so that the attention loop gathers
through one level of indirection. Rows without a visible key get o_lat = 0 or the mean latent row
(``masked_rows="mean"``, the mean of v over all keys once multiplied by W_UV).

On sm_90 with bf16/fp16 operands the same loop runs as a warp-specialised Gluon kernel instead
(``absorbed_attention_ws``, form WARP_SPECIALISED): a producer partition gathers the latent rows
while the consumers multiply; same numerics.

Split decode. When ``B·S·ceil(H/BLOCK_H)`` programs are too few to fill the GPU, each query's
indices are split over several programs writing fp32 partials (o_lat, lse), merged by log-sum-exp
in ``_merge_splits_kernel``: the Gluon kernel's split form (``warp_specialised_splits``), else the
Triton kernel's (``attention_splits``). No host synchronisation anywhere: a call can be captured
in a CUDA graph.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from compiler.autotune import LaunchConfig, graph_capturing, interpreter_active, multiprocessor_count
from compiler.lowering.attention.online_softmax import (LOG2_E, attention_splits, merge_split_partials,
                                                        online_softmax_step, split_partials)
try:  # Gluon's API is experimental: a Triton whose Gluon lacks what the kernel uses runs the Triton chain
    from compiler.lowering.attention import absorbed_attention_ws
except (ImportError, AttributeError):
    absorbed_attention_ws = None
from runtime.absorbed_attention import absorbed_dims, checked_absorbed_inputs, head_weights
from runtime.signature_check import checked_on_meta
from runtime.workspace import check_workspace
from compiler.lowering.host_ints import cdiv, next_power_of_2

_INTERPRETED = interpreter_active()
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

CHUNK_ELEMENTS = 1 << 28
"""Most elements of q_lat (and of o_lat) held at once: B·H·chunk·Dc."""
MAX_CHUNK = 32768
"""Most queries per launch (the grid's second axis)."""

CONFIGS = {
    "h64_n64_w8_s2": LaunchConfig.of(num_warps=8, num_stages=2, BLOCK_H=64, BLOCK_N=64),
    "h64_n32_w8_s3": LaunchConfig.of(num_warps=8, num_stages=3, BLOCK_H=64, BLOCK_N=32),
    "h32_n32_w8_s4": LaunchConfig.of(num_warps=8, num_stages=4, BLOCK_H=32, BLOCK_N=32),
}
"""Launch configurations on a GPU, by name (heads per program, indices per tile, warps, stages).
At Dc = 512 a program's fp32 accumulator is BLOCK_H·512·4 bytes (128 KB at 64 heads: 128
registers a thread over 8 warps; 64 at 32 heads) and its shared memory holds q_lat
(BLOCK_H·512·2 bytes) and ``num_stages`` gathered tiles of BLOCK_N·576·2 bytes. 64 heads fill
Hopper's 64-row warpgroup products; 32 heads halve the accumulator's registers. Not offered: 128
heads a program (ptxas rejects it), and 64 heads over 16 warps (it spills and runs at half the
8-warp form's rate: sparse_attention_configs_h200.md)."""
DEFAULT_CONFIG = "h64_n64_w8_s2"
"""The Triton configuration for more than FEW_QUERIES queries where WARP_SPECIALISED does not apply
(its split decode, fewer heads, fp32, off sm_90): sparse_attention_h200.md."""
FEW_QUERIES_CONFIG = "h32_n32_w8_s4"
"""The Triton configuration tried first on at most FEW_QUERIES queries (decode) where WARP_SPECIALISED
does not apply, whose programs are few and short: at B = 1 over 131072 keys 0.40 ms against the
default's 1.14 (sparse_attention_configs_h200.md)."""
FEW_QUERIES = 8
"""Most queries (B·S) of a call whose Triton chain starts with FEW_QUERIES_CONFIG: it wins at B = 1
and loses at B = 64 (0.89 ms against the default's 0.75, sparse_attention_configs_h200.md); between
them the crossover has not been measured, and 8 keeps the small batches on the form that won at 1."""
FALLBACK_CONFIGS = ("h64_n32_w8_s3", "h32_n32_w8_s4")
"""Tried in turn, for the op only, when the default configuration does not compile or launch on the
device (e.g. its shared memory exceeds the device's); the first that does is kept per kernel shape."""
TRITON_CHAIN = (DEFAULT_CONFIG, *FALLBACK_CONFIGS)
"""The Triton configurations tried in turn after a form that does not apply or does not run."""
WARP_SPECIALISED = "ws"
"""The form name of ``absorbed_attention_ws``'s Gluon kernel (sm_90, bf16/fp16, calls that need no
split), the first form for more than FEW_QUERIES queries: 1.47-1.52x DEFAULT_CONFIG's speed at 128
heads on uniform selections at 16-64K and on the trained ones (sparse_attention_h200.md). Where it
does not apply, or does not compile, the op runs DEFAULT_CONFIG and its fallbacks instead."""
WARP_SPECIALISED_MIN_HEADS = 16
"""Fewest heads the Gluon kernel takes: its 64-row products idle 3/4 of their rows at 16 heads and it
still wins there (1.10-1.18x DEFAULT_CONFIG's speed, sparse_attention_h200.md); at 8 heads
the two tie (1.00-1.02x, sparse_attention_auto_h200.md)."""
WARP_SPECIALISED_MIN_SPLIT = 256
"""Fewest indices of a split of the Gluon kernel's split form (a multiple of its tile pairs): a split
also writes, and the merge reads, a [BLOCK_H, Dc] fp32 partial (128 KB at 64 heads: together the
bytes of about 220 gathered latent rows). Of 128, 256 and 512, 256 replayed fastest on one to four
queries (benchmarks/README.md, What the anchors showed: the decode bullet)."""
SPLIT_UNDER_GRAPHS_ONLY = True
"""The Gluon kernel's split form runs only in calls captured into a CUDA graph. Its merge is one more
launch and two more allocations a call, host time that outweighs the device time it saves where the
host sets the pace, as it does for a decode-sized call issued eagerly (the op's host issue time is
several times its device time: benchmarks/README.md, What the anchors showed: the decode bullet);
under a graph the host cost is paid once, at capture."""
MERGE_BLOCK_H = 16
"""Heads per program of ``_merge_splits_kernel`` after the Gluon kernel's split form (its fp32
[MERGE_BLOCK_H, Dc] accumulator: 64 registers a thread over 4 warps at Dc = 512)."""
CONFIG_NAMES = (*CONFIGS, WARP_SPECIALISED)
"""Every name ``config`` takes: the Triton launch configurations and the Gluon kernel."""
INTERPRETER_CONFIG = LaunchConfig.of(num_warps=1, num_stages=1, BLOCK_H=16, BLOCK_N=16)
"""The configuration under the CPU interpreter (every name maps to it there)."""


@triton.jit
def _visible_indices_kernel(idx_ptr, mask_ptr, out_ptr,
                            stride_ib, stride_is, stride_ik, stride_mb, stride_ms, stride_mt,
                            seq_k, width, HAS_MASK: tl.constexpr, DEDUP: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program: BLOCK_K indices of one query row -> the index where its key counts, else -1
    (out of range, a repeat of its predecessor in a sorted row under DEDUP, hidden by the mask)."""
    row = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    offs = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    live = offs < width
    idx_row = idx_ptr + batch * stride_ib + row * stride_is
    key = tl.load(idx_row + offs * stride_ik, mask=live, other=-1).to(tl.int64)
    ok = live & (key >= 0) & (key < seq_k)
    if DEDUP:
        prev = tl.load(idx_row + (offs - 1) * stride_ik, mask=live & (offs > 0), other=-1).to(tl.int64)
        ok = ok & (key != prev)
    if HAS_MASK:
        seen = tl.load(mask_ptr + batch * stride_mb + row * stride_ms + tl.where(ok, key, 0) * stride_mt,
                       mask=ok, other=0)
        ok = ok & (seen != 0)
    tl.store(out_ptr + (batch * tl.num_programs(1) + row) * width + offs, tl.where(ok, key, -1).to(tl.int32),
             mask=live)


@triton.jit
def _absorbed_attention_kernel(
        qlat_ptr, qrope_ptr, lat_ptr, rope_ptr, idx_ptr, mean_ptr, o_ptr, part_o_ptr, part_lse_ptr,
        stride_qb, stride_qh, stride_qs, stride_qc,
        stride_rb, stride_rh, stride_rs, stride_rd,
        stride_lb, stride_lt, stride_lc,
        stride_kb, stride_kt, stride_kd,
        stride_ib, stride_is, stride_ik,
        stride_ob, stride_oh, stride_os, stride_oc,
        heads, seq_q, seq_k, width, num_splits, split_len, qk_scale_log2,
        lat_dim: tl.constexpr, rope_dim: tl.constexpr,
        MEAN_ROWS: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
        BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr):
    """One program: BLOCK_H heads of one query against its share of the query's indices (an index
    counts when it lies in [0, T): the index list is the visible one where a mask or repeats apply)."""
    head_block = tl.program_id(0) // num_splits
    split = tl.program_id(0) % num_splits
    row = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    offs_h = (head_block * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)  # q's head stride reaches 2^31
    h_ok = offs_h < heads
    offs_c = tl.arange(0, BLOCK_C)
    c_ok = offs_c < lat_dim
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < rope_dim

    q = tl.load(qlat_ptr + batch * stride_qb + offs_h[:, None] * stride_qh + row * stride_qs
                + offs_c[None, :] * stride_qc, mask=h_ok[:, None] & c_ok[None, :], other=0.0)
    qr = tl.load(qrope_ptr + batch * stride_rb + offs_h[:, None] * stride_rh + row * stride_rs
                 + offs_r[None, :] * stride_rd, mask=h_ok[:, None] & r_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        qr = qr.to(tl.float32)
    idx_row = idx_ptr + batch * stride_ib + row * stride_is
    lat_rows = lat_ptr + batch * stride_lb
    rope_rows = rope_ptr + batch * stride_kb

    acc = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    start = split * split_len
    stop = tl.minimum(width, start + split_len)
    for k0 in range(start, stop, BLOCK_N):
        offs_n = k0 + tl.arange(0, BLOCK_N)
        key = tl.load(idx_row + offs_n * stride_ik, mask=offs_n < stop, other=-1).to(tl.int64)
        ok = (key >= 0) & (key < seq_k)
        key = tl.where(ok, key, 0)
        c = tl.load(lat_rows + key[:, None] * stride_lt + offs_c[None, :] * stride_lc,
                    mask=ok[:, None] & c_ok[None, :], other=0.0)
        kr = tl.load(rope_rows + key[:, None] * stride_kt + offs_r[None, :] * stride_kd,
                     mask=ok[:, None] & r_ok[None, :], other=0.0)
        if UPCAST:
            c = c.to(tl.float32)
            kr = kr.to(tl.float32)
        scores = tl.dot(qr, tl.trans(kr), input_precision=DOT_PRECISION)
        scores = tl.dot(q, tl.trans(c), scores, input_precision=DOT_PRECISION)
        scores = tl.where(ok[None, :], scores * qk_scale_log2, float("-inf"))
        acc, m_i, l_i = online_softmax_step(scores, c, acc, m_i, l_i, DOT_PRECISION)

    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    if SPLIT:
        part = ((split * tl.num_programs(2) + batch) * heads + offs_h) * seq_q + row
        tl.store(part_o_ptr + part[:, None] * BLOCK_C + offs_c[None, :], o, mask=h_ok[:, None])
        tl.store(part_lse_ptr + part, tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i))),
                 mask=h_ok)
    else:
        _write_latent_rows(o, empty, batch, row, offs_h, h_ok, offs_c, c_ok, mean_ptr, o_ptr,
                           stride_ob, stride_oh, stride_os, stride_oc, lat_dim, MEAN_ROWS)


@triton.jit
def _write_latent_rows(o, empty, batch, row, offs_h, h_ok, offs_c, c_ok, mean_ptr, o_ptr,
                       stride_ob, stride_oh, stride_os, stride_oc, lat_dim: tl.constexpr, MEAN_ROWS: tl.constexpr):
    """Store o_lat of one query's heads; rows without a visible key take the mean latent row under MEAN_ROWS."""
    if MEAN_ROWS:
        mean = tl.load(mean_ptr + batch * lat_dim + offs_c, mask=c_ok, other=0.0)
        o = tl.where(empty[:, None], mean[None, :], o)
    tl.store(o_ptr + batch * stride_ob + offs_h[:, None] * stride_oh + row * stride_os + offs_c[None, :] * stride_oc,
             o.to(o_ptr.dtype.element_ty), mask=h_ok[:, None] & c_ok[None, :])


@triton.jit(do_not_specialize=["num_splits"])
def _merge_splits_kernel(part_o_ptr, part_lse_ptr, mean_ptr, o_ptr,
                         stride_ob, stride_oh, stride_os, stride_oc,
                         num_batch, heads, seq_q, num_splits, lat_dim: tl.constexpr,
                         MEAN_ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr):
    """One program: BLOCK_H heads of one query, merged over the splits by log-sum-exp (base 2)."""
    row = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    offs_h = (tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    h_ok = offs_h < heads
    offs_c = tl.arange(0, BLOCK_C)
    c_ok = offs_c < lat_dim
    o, empty, _ = merge_split_partials(part_o_ptr, part_lse_ptr, (batch * heads + offs_h) * seq_q + row,
                                       num_batch * heads * seq_q, num_splits, h_ok, offs_c, BLOCK_C)
    _write_latent_rows(o, empty, batch, row, offs_h, h_ok, offs_c, c_ok, mean_ptr, o_ptr,
                       stride_ob, stride_oh, stride_os, stride_oc, lat_dim, MEAN_ROWS)


_WORKING: dict[tuple, str] = {}
"""(configurations asked for, kernel shape) -> the one that compiled and launched there."""
_WS_FAILED: set[tuple] = set()
"""(device, dtype, Dc, mean rows, split) where the Gluon kernel did not compile or launch: the Triton
chain runs there."""


def check_config_name(name: str) -> None:
    """ValueError naming the known configurations unless ``name`` is one of CONFIG_NAMES."""
    if name not in CONFIG_NAMES:
        raise ValueError(f"config must be one of {sorted(CONFIG_NAMES)}, got {name!r}")


def launch_config(name: str) -> LaunchConfig:
    """The configuration ``name`` of CONFIGS (INTERPRETER_CONFIG under the interpreter)."""
    return INTERPRETER_CONFIG if _INTERPRETED else CONFIGS[name]


def _launch_failures() -> tuple[type[BaseException], ...]:
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    return CompilationError, OutOfResources


def _run_with_fallback(shape: tuple, names: tuple[str, ...], launch) -> None:
    """``launch(config)`` with the configuration remembered for ``shape``, else with the first of
    ``names`` that compiles and launches (remembered); the last failure when none does."""
    if shape in _WORKING:
        launch(launch_config(_WORKING[shape]))
        return
    for number, name in enumerate(names):
        try:
            launch(launch_config(name))
        except _launch_failures():
            if number == len(names) - 1:
                raise
            continue
        _WORKING[shape] = name
        return


def _visible_indices(indices: torch.Tensor, mask: Optional[torch.Tensor], seq_k: int, dedup: bool) -> torch.Tensor:
    """``[B, n, K]`` int32: each index where its key counts, else -1 (``_visible_indices_kernel``)."""
    b, n, width = indices.shape
    out = torch.empty((b, n, width), dtype=torch.int32, device=indices.device)
    if mask is None:
        mask_arg, mask_strides = indices, (0, 0, 0)
    else:
        expanded = mask.expand(b, 1, n, seq_k)
        mask_arg, mask_strides = expanded, (expanded.stride(0), expanded.stride(2), expanded.stride(3))
    block_k = max(16, min(1024, next_power_of_2(width)))
    _visible_indices_kernel[(cdiv(width, block_k), n, b)](
        indices, mask_arg, out, *indices.stride(), *mask_strides, seq_k, width,
        HAS_MASK=mask is not None, DEDUP=dedup, BLOCK_K=block_k, num_warps=4)
    return out


def default_configs(queries: int) -> tuple[str, ...]:
    """The forms the op tries in turn for a call of ``queries`` queries (B·S): WARP_SPECIALISED
    (which runs the rest where it does not apply), then the Triton chain: FEW_QUERIES_CONFIG first
    for at most FEW_QUERIES queries, else DEFAULT_CONFIG, then the fallbacks."""
    first = FEW_QUERIES_CONFIG if queries <= FEW_QUERIES else DEFAULT_CONFIG
    return (WARP_SPECIALISED, first, *(name for name in TRITON_CHAIN if name != first))


def _attend_latent(q_lat, q_rope, latent, rope_key, indices, mean, o_lat, scale: float, names: tuple[str, ...],
                   splits: Optional[int]) -> None:
    """o_lat ``[B, H, n, Dc]`` of n queries: the attention kernel (and the merge when split), in the
    first configuration of ``names`` that runs (``_run_with_fallback``); WARP_SPECIALISED first runs
    the Gluon kernel where it applies (``_warp_specialised_applies``), else the names after it
    (DEFAULT_CONFIG's chain when it is alone)."""
    if names[0] == WARP_SPECIALISED:
        if _warp_specialised_applies(q_lat, q_rope, latent, rope_key, o_lat):
            b, heads, n, _ = q_lat.shape
            n_split, split_len = warp_specialised_splits(cdiv(heads, absorbed_attention_ws.BLOCK_H) * n * b,
                                                         indices.shape[2], q_lat.device, splits)
            key = (q_lat.device, q_lat.dtype, q_lat.shape[3], mean is not None, n_split > 1)
            if key not in _WS_FAILED:
                try:
                    _attend_warp_specialised(q_lat, q_rope, latent, rope_key, indices, mean, o_lat, scale, n_split,
                                             split_len)
                    return
                except _launch_failures():
                    _WS_FAILED.add(key)
        names = names[1:] or TRITON_CHAIN
    shape = (names, q_lat.device, q_lat.dtype, q_lat.shape[1], q_lat.shape[3], rope_key.shape[2], splits is None)
    _run_with_fallback(shape, names, lambda config: _attend_with(
        q_lat, q_rope, latent, rope_key, indices, mean, o_lat, scale, config, splits))


def _warp_specialised_applies(q_lat, q_rope, latent, rope_key, o_lat) -> bool:
    """Whether the Gluon kernel takes a call: not interpreted, at least WARP_SPECIALISED_MIN_HEADS
    heads, and its inputs (``absorbed_attention_ws.usable``)."""
    return not _INTERPRETED and absorbed_attention_ws is not None and q_lat.shape[1] >= WARP_SPECIALISED_MIN_HEADS \
        and absorbed_attention_ws.usable(q_lat, q_rope, latent, rope_key, o_lat)


def warp_specialised_splits(programs: int, width: int, device: torch.device,
                            splits: Optional[int] = None) -> tuple[int, int]:
    """(number of splits, indices per split) of the Gluon kernel's rows of ``width`` indices run by
    ``programs`` programs: ``splits`` when given; else on CUDA while a CUDA graph is captured, or
    always unless SPLIT_UNDER_GRAPHS_ONLY: as many as leave every program a streaming multiprocessor
    of its own (its shared memory holds one program an SM), with at least WARP_SPECIALISED_MIN_SPLIT
    indices a split; else 1. A split's length is a whole number of tile pairs. The split kernels'
    first build and load may happen inside the capture."""
    if splits is None:
        splits = 1
        if device.type == "cuda" and (graph_capturing(device) or not SPLIT_UNDER_GRAPHS_ONLY):
            splits = max(1, min(multiprocessor_count(device) // programs, width // WARP_SPECIALISED_MIN_SPLIT))
    return attention_splits(programs, width, 2 * absorbed_attention_ws.BLOCK_N, device, splits)


def _attend_warp_specialised(q_lat, q_rope, latent, rope_key, indices, mean, o_lat, scale: float, n_split: int,
                             split_len: int) -> None:
    """``_attend_latent`` by the Gluon kernel, in ``n_split`` splits of ``split_len`` indices (merged
    by ``_merge_splits_kernel``) when there are more than one."""
    b, heads, n, lat_dim = q_lat.shape
    part_o, part_lse = split_partials(n_split, (b, heads, n), lat_dim, q_lat.device, o_lat)
    absorbed_attention_ws.attend_latent_ws(q_lat, q_rope, latent, rope_key, indices, mean, o_lat, scale * LOG2_E,
                                           (part_o, part_lse, split_len) if n_split > 1 else None)
    _merge_splits(part_o, part_lse, mean, o_lat, n_split, MERGE_BLOCK_H, lat_dim)


def _merge_splits(part_o, part_lse, mean, o_lat, n_split: int, block_h: int, block_c: int) -> None:
    """o_lat from the ``n_split`` partials (``_merge_splits_kernel``, ``block_h`` heads a program);
    nothing to do for one split."""
    if n_split > 1:
        b, heads, n, lat_dim = o_lat.shape
        _merge_splits_kernel[(cdiv(heads, block_h), n, b)](
            part_o, part_lse, mean if mean is not None else o_lat, o_lat, *o_lat.stride(), b, heads, n, n_split,
            lat_dim=lat_dim, MEAN_ROWS=mean is not None, BLOCK_H=block_h, BLOCK_C=block_c, num_warps=4)


def _attend_with(q_lat, q_rope, latent, rope_key, indices, mean, o_lat, scale: float, config: LaunchConfig,
                 splits: Optional[int]) -> None:
    """``_attend_latent`` in one configuration."""
    b, heads, n, lat_dim = q_lat.shape
    seq_k, rope_dim, width = latent.shape[1], rope_key.shape[2], indices.shape[2]
    meta = dict(config.meta)
    block_h = min(meta["BLOCK_H"], max(16, next_power_of_2(heads)))
    block_n = meta["BLOCK_N"]
    block_c = max(16, next_power_of_2(lat_dim))
    head_blocks = cdiv(heads, block_h)
    n_split, split_len = attention_splits(head_blocks * n * b, width, block_n, q_lat.device, splits)
    part_o, part_lse = split_partials(n_split, (b, heads, n), block_c, q_lat.device, o_lat)
    mean_arg = mean if mean is not None else o_lat
    _absorbed_attention_kernel[(head_blocks * n_split, n, b)](
        q_lat, q_rope, latent, rope_key, indices, mean_arg, o_lat, part_o, part_lse,
        *q_lat.stride(), *q_rope.stride(), *latent.stride(), *rope_key.stride(), *indices.stride(),
        *o_lat.stride(), heads, n, seq_k, width, n_split, split_len, scale * LOG2_E,
        rope_dim=rope_dim, SPLIT=n_split > 1, UPCAST=_INTERPRETED,
        DOT_PRECISION="ieee" if q_lat.dtype == torch.float32 else "tf32", BLOCK_N=block_n,
        BLOCK_R=max(16, next_power_of_2(rope_dim)), num_warps=config.num_warps,
        num_stages=config.num_stages, lat_dim=lat_dim, MEAN_ROWS=mean is not None, BLOCK_H=block_h, BLOCK_C=block_c)
    _merge_splits(part_o, part_lse, mean, o_lat, n_split, block_h, block_c)


def workspace_bytes(q: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor, kv_b_weight: torch.Tensor,
                    indices: torch.Tensor) -> int:
    """Bytes a call allocates at most: the sorted indices (16 per index), one chunk's visible
    indices, q_lat, o_lat and their product with W_UV, the output and the mean latent row."""
    b, heads, s, _ = q.shape
    width, lat_dim = indices.shape[2], latent.shape[2]
    v_dim = absorbed_dims(q, rope_key, kv_b_weight)[2]
    chunk = min(s, max(1, min(MAX_CHUNK, CHUNK_ELEMENTS // max(1, b * heads * lat_dim))))
    per_chunk = 4 * b * chunk * (width + heads * (2 * lat_dim + v_dim))
    return 16 * b * s * width + per_chunk + b * heads * s * v_dim * q.element_size() + 4 * b * lat_dim


def _check_kernel_inputs(q: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor, kv_b_weight: torch.Tensor,
                         indices: torch.Tensor) -> None:
    """Raise TypeError/ValueError for checked inputs the kernels cannot take (dtype, length, grid,
    workspace), once per signature and device (``runtime.signature_check``)."""
    checked_on_meta(_kernel_limits, (q, latent, rope_key, kv_b_weight, indices), (q.device,))


def _kernel_limits(q, latent, rope_key, kv_b_weight, indices, device: torch.device) -> None:
    if q.dtype not in _KERNEL_DTYPES:
        raise TypeError(f"q must be bfloat16, float16 or float32, got {q.dtype}")
    if latent.shape[1] >= 2 ** 31 or q.shape[2] >= 2 ** 31:
        raise ValueError(f"q and latent must have fewer than 2^31 tokens, got {q.shape[2]} and {latent.shape[1]}")
    if q.shape[0] > 65535:
        raise ValueError(f"q must have a batch of at most 65535 (a grid axis), got {q.shape[0]}")
    check_workspace(workspace_bytes(q, latent, rope_key, kv_b_weight, indices), device, "q, latent, indices",
                    f"B={q.shape[0]}, H={q.shape[1]}, S={q.shape[2]}, K={indices.shape[2]}")


def absorbed_sparse_attention_triton(q: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor,
                                     kv_b_weight: torch.Tensor, indices: torch.Tensor,
                                     mask: Optional[torch.Tensor] = None, *, scale: float, masked_rows: str = "zero",
                                     distinct: bool = False, config: Optional[str] = None,
                                     splits: Optional[int] = None) -> torch.Tensor:
    """Sparse attention o ``[B, H, S, Dv]`` in the absorbed form (contract in the module doc).

    ``distinct``: the caller guarantees that no row repeats an in-range index (indices from a
    top-K), so the per-row sort that removes repeats is skipped; with repeats the result would
    count a repeated key more than once. ``config`` names one of CONFIG_NAMES (None: ``default_configs``,
    each tried where the one before does not compile); ``splits`` forces the number of programs each
    query's indices are split over (default: enough to fill the GPU).
    Runs on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1``. Raises
    TypeError/ValueError naming the argument for a bad shape, dtype, device or scalar.
    """
    checked_absorbed_inputs(q, latent, rope_key, kv_b_weight, indices, mask, scale, masked_rows)
    _check_kernel_inputs(q, latent, rope_key, kv_b_weight, indices)
    if not isinstance(distinct, bool):
        raise TypeError(f"distinct must be a bool, got {type(distinct).__name__}")
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits must be None or an int >= 1, got {splits!r}")
    b, heads, s, _ = q.shape
    names = default_configs(b * s) if config is None else (config,)
    check_config_name(names[0])  # a ValueError for an unknown name, before any work
    t_len, lat_dim = latent.shape[1], latent.shape[2]
    nope_dim, _, v_dim = absorbed_dims(q, rope_key, kv_b_weight)
    w_uk, w_uv = head_weights(kv_b_weight, heads, nope_dim)
    out = torch.empty((b, heads, s, v_dim), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    mean = latent.float().mean(dim=1).contiguous() if masked_rows == "mean" and t_len else None
    if t_len == 0 or indices.shape[2] == 0:
        o_lat = mean[:, None, None, :].expand(b, heads, s, lat_dim) if mean is not None else \
            q.new_zeros((b, heads, s, lat_dim), dtype=torch.float32)
        return out.copy_(torch.matmul(o_lat, w_uv.float().transpose(1, 2)))
    if not distinct:
        indices = torch.sort(indices, dim=-1).values
    chunk = max(1, min(MAX_CHUNK, CHUNK_ELEMENTS // (b * heads * lat_dim)))
    w_uv_t = w_uv.transpose(1, 2)
    for start in range(0, s, chunk):
        stop = min(start + chunk, s)
        n = stop - start
        rows = indices[:, start:stop]
        if mask is not None or not distinct:
            rows_mask = mask if mask is None or mask.shape[2] == 1 else mask[:, :, start:stop]
            rows = _visible_indices(rows, rows_mask, t_len, dedup=not distinct)
        # Head-major [H, B, n, Dc]: the weight products are batched over the heads.
        q_nope = q[:, :, start:stop, :nope_dim].transpose(0, 1).reshape(heads, b * n, nope_dim)
        q_lat = torch.bmm(q_nope, w_uk).view(heads, b, n, lat_dim)
        o_lat = torch.empty_like(q_lat)
        _attend_latent(q_lat.transpose(0, 1), q[:, :, start:stop, nope_dim:], latent, rope_key, rows, mean,
                       o_lat.transpose(0, 1), float(scale), names, splits)
        if b == 1:  # the product straight into out's rows (batch stride S·Dv): no copy
            torch.bmm(o_lat.view(heads, n, lat_dim), w_uv_t, out=out[0, :, start:stop])
        else:
            out[:, :, start:stop] = torch.bmm(o_lat.view(heads, b * n, lat_dim), w_uv_t) \
                .view(heads, b, n, v_dim).transpose(0, 1)
    return out
