"""tile_arith's interpreter forms are the loops they stand for: a dot summed from 0 in ascending d
and a group sum from 0 in ascending rows, every product and partial sum rounded to fp32, to the bit
(signed zeros, infinities and NaN included), also where the dot's products are taken in chunks."""
import pytest
import torch
import triton
import triton.language as tl

from compiler.lowering.scoring.tile_arith import sequential_dot, sequential_group_sum


@triton.jit
def _forms_kernel(a_ptr, b_ptr, c_ptr, dot_ptr, sum_ptr, n, D: tl.constexpr, M: tl.constexpr, N: tl.constexpr,
                  G: tl.constexpr):
    i = tl.arange(0, M)
    j = tl.arange(0, N)
    x = sequential_dot(a_ptr, i * D, i < M - 1, b_ptr, j * D, j < N - 1, D, M, N)  # last rows masked
    tl.store(dot_ptr + i[:, None] * N + j[None, :], x)
    g = tl.arange(0, G)
    y = x * tl.load(c_ptr + i)[:, None]  # row scales of both signs: -0 where x is +0
    tl.store(sum_ptr + g[:, None] * N + j[None, :], sequential_group_sum(y, n, G, M // G, N))


def loop_dot(a, b):
    """[M, N]: sum over d ascending from 0 of a[i, d] * b[j, d] in fp32, the masked last rows 0."""
    a, b = a.float().clone(), b.float().clone()
    a[-1], b[-1] = 0, 0
    x = torch.zeros(a.shape[0], b.shape[0])
    for d in range(a.shape[1]):
        x = x + a[:, d, None] * b[None, :, d]
    return x


def loop_group_sum(x, n, G):
    y = x.view(G, x.shape[0] // G, -1)
    s = torch.zeros(G, x.shape[1])
    for r in range(n):
        s = s + y[:, r]
    return s


def bits(x):
    return torch.where(x.isnan(), torch.full_like(x, float("nan")), x).view(torch.int32)


@pytest.mark.parametrize("kind", ["general", "signed_zeros", "non_finite", "overflow"])
@pytest.mark.parametrize("D,M,N,G", [(16, 32, 16, 4), (1, 4, 2, 4), (128, 128, 128, 8)])
def test_forms_equal_their_loops_to_the_bit(kind, D, M, N, G):
    g = torch.Generator().manual_seed(D + M)
    a = torch.randn(M, D, generator=g) * torch.exp(torch.randn(1, D, generator=g) * 3)
    b = torch.randn(N, D, generator=g)
    if kind == "signed_zeros":  # products of -0 and +0, row scales of both signs on zero sums
        a = -a.abs().round()
        b = torch.where(torch.rand(N, D, generator=g) < 0.7, 0.0, 1.0)
        a[: M // 2] = -0.0
    elif kind == "non_finite":
        a.view(-1)[torch.randint(0, M * D, (5,), generator=g)] = float("inf")
        b.view(-1)[torch.randint(0, N * D, (3,), generator=g)] = float("nan")
    elif kind == "overflow":
        a, b = a * 1e25, b * 1e20
    c = torch.randn(M, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        ad, bd = a.to(dtype), b.to(dtype)
        dot, group = torch.empty(M, N), torch.empty(G, N)
        for n in sorted({0, 1, M // G}):
            _forms_kernel[(1,)](ad, bd, c, dot, group, n, D, M, N, G)
            want = loop_dot(ad, bd)
            assert torch.equal(bits(dot), bits(want))
            assert torch.equal(bits(group), bits(loop_group_sum(want * c[:, None], n, G)))
