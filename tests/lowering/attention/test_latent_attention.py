"""``latent_attention.latent_sparse_attention`` (under TRITON_INTERPRET=1): both forms give the
reference's result."""
import pytest
import torch

from compiler.lowering.attention.latent_attention import latent_sparse_attention
from runtime.absorbed_attention import absorbed_sparse_attention, expand_latent, head_weights

from tests.lowering.attention.test_absorbed_attention import causal, mla_inputs

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0:DeprecationWarning")  # Triton interpreter internals


@pytest.mark.parametrize("heads,s,t,width", [(2, 40, 40, 8), (16, 16, 4096, 4)])
@pytest.mark.parametrize("masked_rows", ["zero", "mean"])
def test_both_forms_match_the_reference(heads, s, t, width, masked_rows):
    q, latent, rope_key, weight, indices = mla_inputs(2, heads, s, t, width, seed=heads)
    indices[0, :3] = -1  # rows without a key
    mask = causal(2, s, t)
    ref, _ = absorbed_sparse_attention(q, latent, rope_key, weight, indices, mask, scale=0.3,
                                       masked_rows=masked_rows)
    for union in (False, True):
        got = latent_sparse_attention(q, latent, rope_key, weight, indices, mask, scale=0.3,
                                      masked_rows=masked_rows, union=union)
        torch.testing.assert_close(got, ref, rtol=0, atol=2e-5)


def test_expand_latent_is_kv_b_projs_expansion():
    q, latent, rope_key, weight, _ = mla_inputs(2, 3, 4, 7, 2)
    k, v = expand_latent(latent, rope_key, weight, 3, 6)
    w_uk, w_uv = head_weights(weight, 3, 6)
    assert k.shape == (2, 3, 7, 10) and v.shape == (2, 3, 7, 5) and k.stride(-1) == v.stride(-1) == 1
    torch.testing.assert_close(k[..., :6], torch.einsum("btc,hnc->bhtn", latent, w_uk))
    assert torch.equal(k[..., 6:], rope_key[:, None].expand(2, 3, 7, 4))
    torch.testing.assert_close(v, torch.einsum("btc,hvc->bhtv", latent, w_uv))


@pytest.mark.parametrize("union", [False, True])
def test_a_bad_argument_is_named_before_any_work(union):
    q, latent, rope_key, weight, indices = mla_inputs(1, 2, 4, 7, 2)
    with pytest.raises(ValueError, match="masked_rows"):
        latent_sparse_attention(q, latent, rope_key, weight, indices, scale=0.3, masked_rows="nan", union=union)
