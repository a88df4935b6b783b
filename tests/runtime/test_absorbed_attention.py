"""The absorbed-form reference equals sparse attention over the keys and values kv_b_proj expands
(to fp32 rounding), and names bad arguments before any work."""
import pytest
import torch

from runtime.absorbed_attention import absorbed_dims, absorbed_sparse_attention, checked_absorbed_inputs, head_weights
from runtime.union_attention import sparse_attention

B, H, S, T, DN, DR, DV, DC, K = 2, 3, 10, 20, 6, 4, 5, 7, 6


def mla_inputs(dtype=torch.float32, seed=0, s=S, t=T, width=K, low=-1):
    """q, latent, rope key, kv_b weight and indices of a small MLA layer."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, s, DN + DR, generator=g, dtype=torch.float64).to(dtype)
    latent = torch.randn(B, t, DC, generator=g, dtype=torch.float64).to(dtype)
    rope_key = torch.randn(B, t, DR, generator=g, dtype=torch.float64).to(dtype)
    weight = (torch.randn(H * (DN + DV), DC, generator=g, dtype=torch.float64) * 0.5).to(dtype)
    return q, latent, rope_key, weight, torch.randint(low, t, (B, s, width), generator=g)


def expanded(latent, rope_key, weight, heads=H, nope_dim=DN):
    """(k, v) as transformers' expand_kv builds them: [W_UK c, kr] and W_UV c per head."""
    w_uk, w_uv = head_weights(weight, heads, nope_dim)
    k_nope = torch.einsum("btc,hnc->bhtn", latent, w_uk)
    rope = rope_key[:, None].expand(-1, heads, -1, -1)
    return torch.cat([k_nope, rope], dim=-1), torch.einsum("btc,hvc->bhtv", latent, w_uv)


def causal(s, t):
    return (torch.arange(t)[None, :] <= torch.arange(t - s, t)[:, None]).view(1, 1, s, t)


@pytest.mark.parametrize("masked_rows", ["zero", "mean"])
def test_equals_sparse_attention_over_the_expanded_keys_and_values(masked_rows):
    q, latent, rope_key, weight, indices = mla_inputs()
    indices[0, 4, :3] = 11  # a repeated key counts once
    indices[1, 2] = -1  # a row that selects nothing
    mask = causal(S, T).repeat(B, 1, 1, 1)
    mask[1, 0, :3] = False  # padded query rows
    o, lse = absorbed_sparse_attention(q, latent, rope_key, weight, indices, mask, scale=0.3, masked_rows=masked_rows)
    k, v = expanded(latent, rope_key, weight)
    want, want_lse = sparse_attention(q, k, v, indices, mask, scale=0.3, masked_rows=masked_rows)
    assert o.shape == (B, H, S, DV) and o.dtype == q.dtype
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse)) and torch.isneginf(lse[1, :, :3]).all()
    torch.testing.assert_close(o, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(lse[torch.isfinite(lse)], want_lse[torch.isfinite(want_lse)], rtol=0, atol=1e-5)


def test_dims_follow_from_the_shapes():
    q, latent, rope_key, weight, _ = mla_inputs()
    assert absorbed_dims(q, rope_key, weight) == (DN, DR, DV)
    w_uk, w_uv = head_weights(weight, H, DN)
    assert w_uk.shape == (H, DN, DC) and w_uv.shape == (H, DV, DC)
    assert torch.equal(w_uv[1, 0], weight[(DN + DV) + DN])  # head 1's first value row


def test_bad_arguments_are_named():
    q, latent, rope_key, weight, indices = mla_inputs()

    def call(**changed):
        args = dict(q=q, latent=latent, rope_key=rope_key, kv_b_weight=weight, indices=indices, mask=None)
        args.update(changed)
        absorbed_sparse_attention(**args, scale=0.3)

    with pytest.raises(ValueError, match="kv_b_weight must be"):
        call(kv_b_weight=weight[:-1])
    with pytest.raises(ValueError, match="rope_key must be"):
        call(rope_key=rope_key[:, :-1])
    with pytest.raises(TypeError, match="latent must have q's dtype"):
        call(latent=latent.half())
    with pytest.raises(TypeError, match="q must be bfloat16, float16 or float32"):
        call(q=q.double())
    with pytest.raises(ValueError, match="indices must be"):
        call(indices=indices[:, :-1])
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        call(mask=causal(S, T).float())


def test_remembered_check_names_what_the_full_check_names():
    """``checked_absorbed_inputs``: a signature once accepted is remembered, yet a call at another
    signature, a bad scale, masked_rows, device or argument type is still refused by name, and an
    error is never remembered (the same bad call raises twice)."""
    q, latent, rope_key, weight, indices = mla_inputs()
    good = dict(q=q, latent=latent, rope_key=rope_key, kv_b_weight=weight, indices=indices, mask=None, scale=0.3,
                masked_rows="zero")

    def call(**changed):
        checked_absorbed_inputs(**{**good, **changed})

    call()
    call(q=q + 1)  # same signature, other values: remembered
    for _ in range(2):
        with pytest.raises(ValueError, match="kv_b_weight must be"):
            call(kv_b_weight=weight[:-1])
    with pytest.raises(TypeError, match="scale must be a float"):
        call(scale=True)
    with pytest.raises(ValueError, match="scale must be finite"):
        call(scale=float("nan"))
    with pytest.raises(ValueError, match="masked_rows must be one of"):
        call(masked_rows="max")
    with pytest.raises(ValueError, match="latent must be on q's device"):
        call(latent=latent.to("meta"))
    with pytest.raises(TypeError, match="indices must be a torch.Tensor"):
        call(indices=indices.tolist())
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        call(mask=causal(S, T).float())
