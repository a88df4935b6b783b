"""The inputs ``anchors.py`` gives the project and the public anchors, and their fp32 references.

Attention (``absorbed_case``): one draw of an MLA layer's tensors laid out so that FlashMLA's
sparse prefill and the project read the same memory. Queries are flat rows ``r = b·S + s``:
``q_rows [B·S, H, 192]`` (nope 128 + rope 64), the absorbed ``q_abs [B·S, H, 576]``
(``q_nope W_UK`` then the rope part, what FlashMLA takes), ``kv [B·T, 1, 576]`` (each sequence's
latent 512 + rope key 64, the B caches end to end); the project's tensors are views of these
(``q [B, H, S, 192]``, ``latent [B, T, 512]``, ``rope_key [B, T, 64]``, ``q_lat``/``q_rope`` of
``q_abs``, ``o_lat`` of ``o_buf [B·S, H, 512]``). Selections are ``sparse_attention_forms``' kinds
with every key past a query's position replaced by -1: ``indices [B, S, K]`` per sequence (the
project), ``flat_indices [B·S, 1, K]`` the same keys offset by ``b·T`` into ``kv`` (FlashMLA).

Indexer (``indexer_case``): DeepSeek-V3.2's lightning indexer, H = 64, D = 128, S causal queries at
the end of T keys, bf16 q and k, fp32 weights, and their unrotated E4M3 form by the project's
quantiser (``runtime.fp8_quant``, SPEC A.10: per (query, head) scales folded into the weights,
per-key scales kept), which DeepGEMM and the project's FP8 scorer both read.

References: float32 attention / float64 scores on sampled query rows; ``max_abs_error`` and
``relative_error`` summarise a comparison.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmarks.sparse_attention_forms import KINDS, selections
from runtime.absorbed_attention import head_weights
from runtime.fp8_quant import quantize_indexer_inputs

NOPE, ROPE, LATENT, V_DIM = 128, 64, 512, 128
QK_DIM = LATENT + ROPE
"""FlashMLA's absorbed widths: d_qk 576 (latent + rope), d_v 512 (the latent)."""
SCALE = (NOPE + ROPE) ** -0.5
INDEXER_HEADS, INDEXER_DIM = 64, 128
ABSORB_ELEMENTS = 1 << 28
"""Most elements of q_lat made at once when absorbing (the op's own chunk, CHUNK_ELEMENTS)."""


@dataclass
class AbsorbedCase:
    """One attention input (module docstring); ``positions [S]`` are the queries' key positions."""

    B: int
    S: int
    T: int
    heads: int
    topk: int
    kind: str
    q_rows: torch.Tensor
    kv: torch.Tensor
    weight: torch.Tensor
    indices: torch.Tensor
    flat_indices: torch.Tensor
    q_abs: torch.Tensor
    o_buf: torch.Tensor

    @property
    def q(self) -> torch.Tensor:
        return self.q_rows.view(self.B, self.S, self.heads, NOPE + ROPE).transpose(1, 2)

    @property
    def latent(self) -> torch.Tensor:
        return self.kv.view(self.B, self.T, QK_DIM)[..., :LATENT]

    @property
    def rope_key(self) -> torch.Tensor:
        return self.kv.view(self.B, self.T, QK_DIM)[..., LATENT:]

    @property
    def q_lat(self) -> torch.Tensor:
        return self.q_abs.view(self.B, self.S, self.heads, QK_DIM).transpose(1, 2)[..., :LATENT]

    @property
    def q_rope(self) -> torch.Tensor:
        return self.q_abs.view(self.B, self.S, self.heads, QK_DIM).transpose(1, 2)[..., LATENT:]

    @property
    def o_lat(self) -> torch.Tensor:
        return self.o_buf.view(self.B, self.S, self.heads, LATENT).transpose(1, 2)

    def weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, 128, 512], W_UV [H, 128, 512]) of ``weight``."""
        return head_weights(self.weight, self.heads, NOPE)

    def absorb(self) -> torch.Tensor:
        """Write q_nope W_UK and q_rope into ``q_abs`` (in chunks of flat rows); returns it."""
        w_uk = self.weights()[0]
        step = max(1, ABSORB_ELEMENTS // (self.heads * LATENT))
        for a in range(0, self.B * self.S, step):
            rows = self.q_rows[a:a + step]
            q_lat = torch.bmm(rows[..., :NOPE].transpose(0, 1), w_uk)          # [H, n, 512]
            self.q_abs[a:a + step, :, :LATENT].copy_(q_lat.transpose(0, 1))
            self.q_abs[a:a + step, :, LATENT:].copy_(rows[..., NOPE:])
        return self.q_abs


def case_bytes(B: int, S: int, T: int, heads: int, topk: int) -> int:
    """Bytes ``absorbed_case`` holds (bf16 tensors, int32 indices twice)."""
    return 2 * (B * S * heads * (NOPE + ROPE + QK_DIM + LATENT) + B * T * QK_DIM
                + heads * (NOPE + V_DIM) * LATENT) + 8 * B * S * topk


def visible_selection(kind: str, B: int, S: int, T: int, topk: int, device, seed: int) -> torch.Tensor:
    """[B, S, topk] int32: ``sparse_attention_forms``' selection of ``kind`` for S queries at the end
    of T keys, every key past the query's position (causal) replaced by -1."""
    if kind not in KINDS:
        raise ValueError(f"unknown selection kind {kind!r}; one of {sorted(KINDS)}")
    idx = selections(kind, B, S, T, topk, device, seed)
    positions = torch.arange(T - S, T, device=device, dtype=idx.dtype)
    return torch.where(idx > positions[None, :, None], -1, idx)


def absorbed_case(B: int, S: int, T: int, heads: int, topk: int, kind: str, device, seed: int,
                  dtype: torch.dtype = torch.bfloat16) -> AbsorbedCase:
    """A random attention input (module docstring); scores O(1), ``q_abs`` absorbed."""
    if min(B, S, T, heads, topk) < 1 or S > T:
        raise ValueError(f"need B, S, T, heads, topk >= 1 and S <= T, got {B}, {S}, {T}, {heads}, {topk}")
    g = torch.Generator(device=device).manual_seed(seed)
    q_rows = torch.randn((B * S, heads, NOPE + ROPE), generator=g, device=device, dtype=dtype)
    kv = torch.randn((B * T, 1, QK_DIM), generator=g, device=device, dtype=dtype)
    weight = (torch.randn((heads * (NOPE + V_DIM), LATENT), generator=g, device=device) * 0.05).to(dtype)
    indices = visible_selection(kind, B, S, T, topk, device, seed)
    offsets = (torch.arange(B, device=device, dtype=indices.dtype) * T)[:, None, None]
    flat = torch.where(indices >= 0, indices + offsets, -1).view(B * S, 1, topk)
    case = AbsorbedCase(B, S, T, heads, topk, kind, q_rows, kv, weight, indices, flat,
                        torch.empty((B * S, heads, QK_DIM), device=device, dtype=dtype),
                        torch.zeros((B * S, heads, LATENT), device=device, dtype=dtype))
    case.absorb()
    return case


def sample_rows(n: int, count: int, seed: int) -> torch.Tensor:
    """Up to ``count`` distinct rows of n (CPU int64, sorted): the first, middle and last few, the
    rest at random; every row when n <= count."""
    if n <= count:
        return torch.arange(n)
    fixed = {0, 1, n // 2, n - 2, n - 1}
    rest = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:max(0, count - len(fixed))]
    return torch.tensor(sorted(fixed | set(rest.tolist())))


def _attend_rows(case: AbsorbedCase, rows: torch.Tensor, q_lat: torch.Tensor, q_rope: torch.Tensor) -> torch.Tensor:
    """fp32 o_lat [R, H, 512] of flat ``rows`` from fp32 q_lat [R, H, 512], q_rope [R, H, 64]: softmax
    over each row's valid keys (0 where none)."""
    out = torch.zeros((rows.numel(), case.heads, LATENT), device=case.kv.device)
    for i, r in enumerate(rows.tolist()):
        ids = case.flat_indices[r, 0].long()
        ids = ids[ids >= 0]
        if ids.numel():
            c = case.kv[ids, 0].float()                                           # [k, 576]
            s = (torch.cat([q_lat[i], q_rope[i]], -1) @ c.t()) * SCALE            # [H, k]
            out[i] = torch.softmax(s, dim=-1) @ c[:, :LATENT]
    return out


def reference_latent(case: AbsorbedCase, rows: torch.Tensor) -> torch.Tensor:
    """fp32 o_lat [R, H, 512] of the kernels' own input ``q_abs`` (what FlashMLA and the project's
    latent kernels return)."""
    q = case.q_abs[rows.to(case.kv.device)].float()
    return _attend_rows(case, rows, q[..., :LATENT], q[..., LATENT:])


def reference_output(case: AbsorbedCase, rows: torch.Tensor) -> torch.Tensor:
    """fp32 output [R, H, 128] of the whole computation from ``q_rows`` and ``weight`` (q_nope W_UK,
    attention, o_lat W_UV^T), every step in fp32."""
    w_uk, w_uv = (w.float() for w in case.weights())
    q = case.q_rows[rows.to(case.kv.device)].float()
    q_lat = torch.einsum("rhn,hnc->rhc", q[..., :NOPE], w_uk)
    return torch.einsum("rhc,hvc->rhv", _attend_rows(case, rows, q_lat, q[..., NOPE:]), w_uv)


@dataclass
class IndexerCase:
    """One indexer input (module docstring): bf16 ``q [S, H, D]``, ``k [T, D]``, fp32 ``w [S, H]``;
    key t visible to query s iff t < ``ends[s]`` (int32), also as ``mask [1, S, T]``; the FP8 form
    ``q8 [S, H, D]``, ``w8 [S, H]`` (query scales folded in), ``k8 [T, D]``, ``k_scale [T]``."""

    S: int
    T: int
    q: torch.Tensor
    k: torch.Tensor
    w: torch.Tensor
    ends: torch.Tensor
    mask: torch.Tensor
    q8: torch.Tensor
    w8: torch.Tensor
    k8: torch.Tensor
    k_scale: torch.Tensor


def indexer_case(S: int, T: int, device, seed: int, heads: int = INDEXER_HEADS, dim: int = INDEXER_DIM) -> IndexerCase:
    """A random indexer input (module docstring): normal q, k; weights normal / sqrt(H)."""
    if min(S, T, heads, dim) < 1 or S > T:
        raise ValueError(f"need S, T, heads, dim >= 1 and S <= T, got {S}, {T}, {heads}, {dim}")
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn((S, heads, dim), generator=g, device=device, dtype=torch.bfloat16)
    k = torch.randn((T, dim), generator=g, device=device, dtype=torch.bfloat16)
    w = torch.randn((S, heads), generator=g, device=device) * heads ** -0.5
    ends = torch.arange(T - S + 1, T + 1, device=device, dtype=torch.int32)
    mask = (torch.arange(T, device=device)[None, :] < ends[:, None])[None]
    q8, k8, w8, k_scale = quantize_indexer_inputs(q[None], k[None], w[None], "fp8_unrotated")
    return IndexerCase(S, T, q, k, w, ends, mask, q8[0], w8[0], k8[0], k_scale[0])


def reference_scores(case: IndexerCase, rows: torch.Tensor, fp8: bool) -> torch.Tensor:
    """float64 scores [R, T] of ``rows``: sum_h w[h] relu(q[h]·k[t]) (``fp8``: of q8, w8, k8 times
    k_scale[t]), -inf at hidden keys."""
    q, w, k = (case.q8, case.w8, case.k8) if fp8 else (case.q, case.w, case.k)
    kd = k.double()
    out = torch.empty((rows.numel(), case.T), dtype=torch.float64, device=k.device)
    for i, r in enumerate(rows.tolist()):
        s = (w[r].double()[:, None] * (q[r].double() @ kd.t()).clamp_min(0)).sum(0)
        out[i] = s * case.k_scale.double() if fp8 else s
        out[i, int(case.ends[r]):] = float("-inf")
    return out


def max_abs_error(got: torch.Tensor, want: torch.Tensor) -> dict:
    """{"max_abs", "ref_max_abs"} of two tensors of one shape."""
    return {"max_abs": (got.float() - want.float()).abs().max().item(), "ref_max_abs": want.abs().max().item()}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> dict:
    """{"max_rel"}: the largest |got - want| where ``want`` is finite, over the largest finite
    |want|; {"nonfinite"}: entries where ``want`` is finite and ``got`` is not."""
    finite = torch.isfinite(want)
    diff = (got.double() - want)[finite]
    scale = want[finite].abs().max().clamp_min(1e-30)
    return {"max_rel": (diff.abs().max() / scale).item() if diff.numel() else 0.0,
            "nonfinite": int((~torch.isfinite(got.double()[finite])).sum())}


def topk_overlap(indices: torch.Tensor, reference: torch.Tensor, k: int) -> float:
    """The smallest share, over rows, of a row's ``indices`` [R, k] in ``reference``'s top-k [R, T]."""
    want = reference.topk(k, dim=-1).indices
    return min(len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(indices.cpu(), want.cpu()))
