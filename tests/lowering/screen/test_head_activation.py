"""activation_frequency counts, per query and head, the anchor witnesses with a positive product."""
import pytest
import torch

from compiler.lowering.screen.head_activation import activation_frequency

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def reference(q, k, seed_ids, A, samples):
    """The definition, in torch: group g = s // A, witnesses seed_ids[b, g, :samples]."""
    B, S, H, D = q.shape
    out = torch.empty(B, S, H)
    for b in range(B):
        for s in range(S):
            ids = seed_ids[b, s // A, :samples].long()
            out[b, s] = (q[b, s].double() @ k[b, ids].double().T > 0).double().mean(-1).float()
    return out


@pytest.mark.parametrize("B,S,H,D,A,W,samples,dtype", [
    (1, 40, 8, 16, 16, 90, 70, torch.bfloat16),   # a partial last group, witnesses over several steps
    (2, 16, 3, 5, 4, 20, 256, torch.float32),     # H and D not powers of two; fewer witnesses than samples
    (1, 7, 64, 128, 16, 33, 33, torch.float16),   # one group shorter than A
])
def test_activation_frequency_is_the_fraction_of_positive_witness_products(B, S, H, D, A, W, samples, dtype):
    g = torch.Generator().manual_seed(S + W)
    q = torch.randint(-2, 3, (B, S, H, D), generator=g).to(dtype)  # integers: exact products, ties at 0
    k = torch.randint(-2, 3, (B, 300, D), generator=g).to(dtype)
    G = -(-S // A)
    seed_ids = torch.randint(0, 300, (B, G, W), generator=g, dtype=torch.int32)
    got = activation_frequency(q, k, seed_ids, A, samples)
    assert got.dtype == torch.float32 and got.shape == (B, S, H)
    torch.testing.assert_close(got, reference(q, k, seed_ids, A, samples), rtol=0, atol=1e-6)


def test_too_few_groups_are_named():
    q, k = torch.ones(1, 20, 2, 4), torch.ones(1, 8, 4)
    with pytest.raises(ValueError, match="seed_ids"):
        activation_frequency(q, k, torch.zeros(1, 1, 4, dtype=torch.int32), 16, 8)
