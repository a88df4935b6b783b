"""Synthetic lightning-indexer inputs with the geometry DoSA reports for trained indexers (SPEC A.8).

``structured_indexer_inputs(B, S, T, H, D, **knobs)``: keys belong to ``topics`` unit directions in
runs of ``topic_run`` keys, with noise, a shared offset along m (``key_offset``) and log-normal norms
(``norm_sigma``); each query attends to a topic that changes every ``query_run`` queries, its
``positive_heads`` pointing at it (``head_noise``), the other heads along +m or -m with a smaller
negative weight (``negative_scale``), so their activation is stable. Returns q [B,S,H,D], k
[B,T,D], weights [B,S,H] (float32 unless ``dtype``) on ``device``, and the parameter dict.
Deterministic for a given ``seed`` (or ``generator``) and device."""
from __future__ import annotations

import torch

__all__ = ["structured_indexer_inputs"]


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def structured_indexer_inputs(
    B: int,
    S: int,
    T: int,
    H: int,
    D: int,
    *,
    seed: int = 0,
    generator: torch.Generator | None = None,
    topics: int = 8,
    topic_run: int = 64,
    query_run: int = 16,
    positive_heads: int = 3,
    head_noise: float = 0.3,
    norm_sigma: float = 0.5,
    key_offset: float = 0.5,
    negative_scale: float = 0.3,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """Structured indexer inputs (module docstring); all sizes must be positive."""
    for name, value in (("B", B), ("S", S), ("T", T), ("H", H), ("D", D), ("topics", topics),
                        ("topic_run", topic_run), ("query_run", query_run)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    if isinstance(positive_heads, bool) or not isinstance(positive_heads, int) \
            or not 0 <= positive_heads <= H:
        raise ValueError(f"positive_heads: expected an int in [0, H={H}], got {positive_heads!r}")
    device = torch.device(device)
    gen = generator if generator is not None else torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen, device=device)

    def randint(high: int, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randint(high, shape, generator=gen, device=device)

    common = _unit(randn(D))
    topic_dirs = _unit(randn(B, topics, D))
    key_topic = randint(topics, (B, (T + topic_run - 1) // topic_run))
    key_topic = key_topic.repeat_interleave(topic_run, dim=1)[:, :T]
    key_dirs = _unit(topic_dirs.gather(1, key_topic[..., None].expand(B, T, D)) + 0.7 * _unit(randn(B, T, D)))
    key_norms = torch.exp(norm_sigma * randn(B, T))
    k = key_norms[..., None] * (key_dirs + key_offset * common)

    query_topic = randint(topics, (B, (S + query_run - 1) // query_run))
    query_topic = query_topic.repeat_interleave(query_run, dim=1)[:, :S]
    focus = topic_dirs.gather(1, query_topic[..., None].expand(B, S, D))  # [B,S,D]
    positive = torch.argsort(rand(B, S, H), dim=-1) < positive_heads
    positive_q = _unit(focus[:, :, None, :] + head_noise * _unit(randn(B, S, H, D)))
    sign = torch.where(rand(B, 1, H) < 0.5, -1.0, 1.0)
    negative_q = _unit(sign[..., None] * common + 0.5 * _unit(randn(B, S, H, D)))
    q_norms = torch.exp(0.2 * randn(B, S, H))[..., None]
    q = q_norms * torch.where(positive[..., None], positive_q, negative_q)
    weights = torch.where(
        positive,
        0.5 + rand(B, S, H),
        -negative_scale * (0.5 + rand(B, S, H)),
    )
    params = dict(
        B=B, S=S, T=T, H=H, D=D, seed=seed, topics=topics, topic_run=topic_run,
        query_run=query_run, positive_heads=positive_heads, head_noise=head_noise,
        norm_sigma=norm_sigma, key_offset=key_offset, negative_scale=negative_scale,
        dtype=str(dtype),
    )
    return q.to(dtype), k.to(dtype), weights.to(dtype), params
