"""A zoo of lightning-indexer geometries for testing speed decisions (never correctness).

Each family makes q [B,S,H,D], k [B,T,D], weights [B,S,H] for a chunk of S queries at the end of
T keys (query i sits at position T - S + i; pair it with a causal chunk mask), on ``device``,
deterministically for a seed and device. The families stress what the certified top-K relies
on: neighbouring queries sharing their top keys (the anchor witnesses), a certificate that is
tight (few positive heads, bounded key norms), and thresholds close to the true kk-th score. No
family is aligned to the anchor stride 16: query runs are 1, 3, 5 or 11 long, or there are none.

| family | what changes from query to query | parameters (defaults) |
|---|---|---|
| ``misaligned_runs`` | structured topics in runs of 5 queries: an anchor group of 16 spans ~4 topics | query_run=5, topic_run=48, topics=8, positive_heads=3 |
| ``query_topics`` | every query its own topic among many, 2 positive heads, heavy-tailed key norms | query_run=1, topics=32, positive_heads=2, norm_sigma=1.0 |
| ``locality_512`` | keys follow a latent drifting over positions (correlation length 512); a query reads the latent at its own position | corr_length=512, key_noise=0.5, head_noise=0.3, positive_heads=3 |
| ``locality_64`` | the same with correlation length 64 | corr_length=64 |
| ``heavy_norms`` | structured topics in runs of 11, log-normal key norms with sigma 1.25 (a few keys 100x the median) | query_run=11, topic_run=40, norm_sigma=1.25 |
| ``random_indexer`` | a random-init transformers ``DeepseekV32Indexer`` (rotary positions, LayerNorm keys) on Gaussian hidden states: no structure at all | hidden_size=1024, q_lora_rank=512, rope_dim=min(64, D/2) |
| ``mixture`` | per run of 3 queries one of three modes: a topic (45%), the positional latent (45%), random heads (10%); keys carry a topic and the latent | query_run=3, topics=8, corr_length=256, mix=(0.45, 0.45, 0.10) |
| ``trained`` | the trained DSA measuring model's indexer (``benchmarks/models/tiny-dsa``, H=64, D=128) on held-out text: q, k, weights of one layer captured at T tokens | layer=2 |

The structured families are ``runtime.structured_indexer`` with other parameters. Positive heads
get weights in [0.5, 1.5], the others weights in -0.3 x [0.5, 1.5] and point along a common key
offset direction (stable activation patterns), as in the structured generator. Every family runs
on the GPU at S=16384, T=524288, H=64, D=128 in well under a second (everything is drawn on the
device; no Python loop over queries or keys).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Mapping

import torch

from runtime.structured_indexer import structured_indexer_inputs

__all__ = ["FAMILIES", "ZooFamily", "zoo_inputs"]


@dataclass(frozen=True)
class ZooFamily:
    """One geometry: its name, a one-line description and its default parameters."""

    name: str
    description: str
    params: Mapping[str, object]
    make: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


class _Draw:
    """Random draws on one device from one seeded generator."""

    def __init__(self, seed: int, device: torch.device):
        self.device = device
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, device=self.device)

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=self.gen, device=self.device)


def _structured(**fixed):
    def make(B, S, T, H, D, *, seed, device, **params):
        q, k, w, _ = structured_indexer_inputs(B, S, T, H, D, seed=seed, device=device, **{**fixed, **params})
        return q, k, w
    return make


def _drift(draw: _Draw, B: int, T: int, D: int, corr_length: int) -> torch.Tensor:
    """Unit latents [B,T,D] drifting over positions: linear interpolation between random unit knots
    placed every ``corr_length`` positions (correlation falls to ~0 over ``corr_length``)."""
    knots = _unit(draw.randn(B, T // corr_length + 2, D))
    pos = torch.arange(T, device=draw.device)
    left = pos // corr_length
    frac = ((pos % corr_length).float() / corr_length)[None, :, None]
    z = knots[:, left] * (1 - frac) + knots[:, left + 1] * frac
    return _unit(z)


def _heads(draw: _Draw, focus: torch.Tensor, H: int, positive_heads: int, head_noise: float,
           common: torch.Tensor, negative_scale: float = 0.3):
    """q [B,S,H,D] and weights [B,S,H]: ``positive_heads`` heads per query point at ``focus``
    [B,S,D] (plus noise) with positive weights; the others point along +-common, negative weights."""
    B, S, D = focus.shape
    positive = torch.argsort(draw.rand(B, S, H), dim=-1) < positive_heads
    positive_q = _unit(focus[:, :, None, :] + head_noise * _unit(draw.randn(B, S, H, D)))
    sign = torch.where(draw.rand(B, 1, H) < 0.5, -1.0, 1.0)
    negative_q = _unit(sign[..., None] * common + 0.5 * _unit(draw.randn(B, S, H, D)))
    q = torch.exp(0.2 * draw.randn(B, S, H))[..., None] * torch.where(positive[..., None], positive_q, negative_q)
    w = torch.where(positive, 0.5 + draw.rand(B, S, H), -negative_scale * (0.5 + draw.rand(B, S, H)))
    return q, w


def _locality(B, S, T, H, D, *, seed, device, corr_length=512, key_noise=0.5, head_noise=0.3,
              positive_heads=3, norm_sigma=0.5, key_offset=0.5):
    draw = _Draw(seed, torch.device(device))
    common = _unit(draw.randn(D))
    z = _drift(draw, B, T, D, corr_length)
    k = torch.exp(norm_sigma * draw.randn(B, T))[..., None] * (_unit(z + key_noise * _unit(draw.randn(B, T, D)))
                                                             + key_offset * common)
    q, w = _heads(draw, z[:, T - S:], H, positive_heads, head_noise, common)
    return q, k, w


def _mixture(B, S, T, H, D, *, seed, device, query_run=3, topics=8, corr_length=256, mix=(0.45, 0.45, 0.10),
             positive_heads=3, head_noise=0.3, norm_sigma=0.5, key_offset=0.5):
    draw = _Draw(seed, torch.device(device))
    common = _unit(draw.randn(D))
    topic_dirs = _unit(draw.randn(B, topics, D))
    key_topic = (draw.rand(B, T) * topics).long()
    z = _drift(draw, B, T, D, corr_length)
    key_dirs = _unit(topic_dirs.gather(1, key_topic[..., None].expand(B, T, D)) + z + 0.5 * _unit(draw.randn(B, T, D)))
    k = torch.exp(norm_sigma * draw.randn(B, T))[..., None] * (key_dirs + key_offset * common)
    runs = -(-S // query_run)
    mode = torch.bucketize(draw.rand(B, runs), torch.tensor(mix, device=draw.device).cumsum(0)[:-1])
    mode = mode.repeat_interleave(query_run, dim=1)[:, :S]
    query_topic = (draw.rand(B, runs) * topics).long().repeat_interleave(query_run, dim=1)[:, :S]
    focus = torch.where((mode == 0)[..., None], topic_dirs.gather(1, query_topic[..., None].expand(B, S, D)),
                        torch.where((mode == 1)[..., None], z[:, T - S:], _unit(draw.randn(B, S, D))))
    q, w = _heads(draw, focus, H, positive_heads, head_noise, common)
    diffuse = (mode == 2)[..., None, None]
    q = torch.where(diffuse, draw.randn(B, S, H, D) / D**0.5, q)  # random heads, no shared direction
    return q, k, w


def _random_indexer(B, S, T, H, D, *, seed, device, hidden_size=1024, q_lora_rank=512, rope_dim=None):
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
        DeepseekV32Indexer,
        DeepseekV32RotaryEmbedding,
        apply_rotary_pos_emb,
    )

    device = torch.device(device)
    rope = min(64, D // 2) if rope_dim is None else rope_dim
    cfg = DeepseekV32Config(hidden_size=hidden_size, q_lora_rank=q_lora_rank, index_n_heads=H, index_head_dim=D,
                            qk_rope_head_dim=rope, index_topk=1, num_hidden_layers=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        indexer = DeepseekV32Indexer(cfg, 0)
    indexer = indexer.to(device)
    rotary = DeepseekV32RotaryEmbedding(cfg).to(device)
    draw = _Draw(seed, device)
    with torch.no_grad():
        x = draw.randn(B, T, hidden_size)
        q_resid = draw.randn(B, S, q_lora_rank)
        cos, sin = rotary(x, torch.arange(T, device=device)[None].expand(B, T))
        q = indexer.wq_b(q_resid).view(B, S, H, D)
        k = indexer.k_norm(indexer.wk(x)).unsqueeze(2)
        q_rot, _ = apply_rotary_pos_emb(q[..., :rope], q[..., :rope], cos[:, T - S:], sin[:, T - S:], 2)
        k_rot, _ = apply_rotary_pos_emb(k[..., :rope], k[..., :rope], cos, sin, 2)
        q = torch.cat([q_rot, q[..., rope:]], -1)
        k = torch.cat([k_rot, k[..., rope:]], -1).squeeze(2)
        w = indexer.weights_proj(x[:, T - S:]).float() * H**-0.5 * indexer.softmax_scale
    return q, k, w


TRAINED_MODEL = Path(__file__).resolve().parents[1] / "benchmarks" / "models" / "tiny-dsa"
HELD_OUT_TOKENS = Path(__file__).resolve().parents[1] / "benchmarks" / "models" / "heldout_tokens.npy"


@functools.lru_cache(maxsize=2)
def _trained_model(path: str, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()


def _trained(B, S, T, H, D, *, seed, device, layer=2, model=None):
    """One layer's indexer inputs of the trained DSA model on B held-out windows of T tokens (the
    window start drawn from ``seed``): the last S queries, all T keys."""
    import numpy as np

    from runtime.dsa_forward import dsa_forward, indexer_qkw

    path = Path(model) if model is not None else TRAINED_MODEL
    if not (path / "config.json").is_file() or not HELD_OUT_TOKENS.is_file():
        raise ValueError(f"model: the trained family needs the checkpoint {path} and {HELD_OUT_TOKENS} "
                         "(a source checkout of the repository)")
    net = _trained_model(str(path), str(device))
    if (H, D) != (net.config.index_n_heads, net.config.index_head_dim) or not 0 <= layer < net.config.num_hidden_layers:
        raise ValueError(f"H, D, layer: the trained model's indexer has H={net.config.index_n_heads}, "
                         f"D={net.config.index_head_dim} and {net.config.num_hidden_layers} layers; got H={H}, D={D}, "
                         f"layer={layer}")
    tokens = np.load(HELD_OUT_TOKENS)
    if T > tokens.size:
        raise ValueError(f"T: at most {tokens.size} held-out tokens, got {T}")
    starts = np.random.default_rng(seed).integers(0, tokens.size - T + 1, B)
    ids = torch.from_numpy(np.stack([tokens[s:s + T] for s in starts]).astype(np.int64)).to(device)
    captured = []

    def capture(c):
        if c.index == layer:
            captured.append(indexer_qkw(c.attention.indexer, c.x, c.q_resid, c.cos, c.sin, slice(T - S, T)))

    with torch.no_grad():
        dsa_forward(net, ids, on_layer=capture, hidden_only=True)
    qkw = captured[0]
    return qkw.q, qkw.k, qkw.weights


FAMILIES: dict[str, ZooFamily] = {f.name: f for f in (
    ZooFamily("misaligned_runs", "structured topics in runs of 5 queries (anchor groups span ~4 topics)",
              dict(query_run=5, topic_run=48, topics=8, positive_heads=3),
              _structured(query_run=5, topic_run=48, topics=8, positive_heads=3)),
    ZooFamily("query_topics", "every query its own topic of 32, 2 positive heads, heavy-tailed key norms",
              dict(query_run=1, topics=32, positive_heads=2, norm_sigma=1.0),
              _structured(query_run=1, topics=32, positive_heads=2, norm_sigma=1.0)),
    ZooFamily("locality_512", "keys follow a latent drifting over positions (correlation length 512)",
              dict(corr_length=512), partial(_locality, corr_length=512)),
    ZooFamily("locality_64", "the positional latent with correlation length 64",
              dict(corr_length=64), partial(_locality, corr_length=64)),
    ZooFamily("heavy_norms", "structured topics in runs of 11, log-normal key norms (sigma 1.25)",
              dict(query_run=11, topic_run=40, norm_sigma=1.25),
              _structured(query_run=11, topic_run=40, norm_sigma=1.25)),
    ZooFamily("random_indexer", "a random-init transformers DeepseekV32Indexer on Gaussian hidden states",
              dict(hidden_size=1024, q_lora_rank=512), _random_indexer),
    ZooFamily("mixture", "per run of 3 queries: a topic, the positional latent, or random heads",
              dict(query_run=3, topics=8, corr_length=256, mix=(0.45, 0.45, 0.10)), _mixture),
    ZooFamily("trained", "the trained DSA measuring model's indexer on held-out text (one layer)",
              dict(layer=2), _trained),
)}


def zoo_inputs(family: str, B: int, S: int, T: int, H: int, D: int, *, seed: int = 0,
               device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               **params) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """(q [B,S,H,D], k [B,T,D], weights [B,S,H], parameters) of ``family`` (``FAMILIES``).

    q and k in ``dtype``, weights float32, all on ``device``; the S queries sit at the end of the
    T keys. ``params`` override the family's defaults. ValueError names a bad argument.
    """
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {sorted(FAMILIES)}, got {family!r}")
    for name, value in (("B", B), ("S", S), ("T", T), ("H", H), ("D", D)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    if S > T:
        raise ValueError(f"S: expected at most T={T} queries (they sit at the end of the keys), got {S}")
    spec = FAMILIES[family]
    q, k, w = spec.make(B, S, T, H, D, seed=seed, device=device, **params)
    described = {"family": family, "B": B, "S": S, "T": T, "H": H, "D": D, "seed": seed,
                 **{n: v if isinstance(v, (int, float, str)) else str(v) for n, v in {**spec.params, **params}.items()}}
    return q.to(dtype).contiguous(), k.to(dtype).contiguous(), w.float().contiguous(), described
