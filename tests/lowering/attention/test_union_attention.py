"""The Triton sparse attention kernels (under TRITON_INTERPRET=1) against the plain-torch reference."""
import pytest
import torch

from compiler.lowering.attention.union_attention import build_union, sparse_attention_triton, tile_rows
from runtime.union_attention import selected_keys, sparse_attention

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0:DeprecationWarning")  # Triton interpreter internals

# The kernel and the reference both accumulate in fp32; the gap is the final rounding of o.
O_ATOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
HOST_READS = ("item", "tolist", "nonzero", "__bool__", "__int__", "__float__", "__index__")


def inputs(b, hq, hkv, s, t, width, dqk=24, dv=16, dtype=torch.float32, seed=0, low=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, s, dqk, generator=g).to(dtype)
    k = torch.randn(b, hkv, t, dqk, generator=g).to(dtype)
    v = torch.randn(b, hkv, t, dv, generator=g).to(dtype)
    return q, k, v, torch.randint(low, t, (b, s, width), generator=g)


def causal(b, s, t):
    return (torch.arange(t)[None, :] <= torch.arange(t - s, t)[:, None]).expand(b, 1, s, t)


def assert_matches_reference(q, k, v, indices, mask, scale=0.3, masked_rows="zero", splits=None):
    o, lse = sparse_attention_triton(q, k, v, indices, mask, scale=scale, masked_rows=masked_rows, splits=splits)
    ref_o, ref_lse = sparse_attention(q, k, v, indices, mask, scale=scale, masked_rows=masked_rows)
    assert o.dtype == q.dtype and o.shape == ref_o.shape and lse.shape == ref_lse.shape
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=0, atol=1e-4)
    torch.testing.assert_close(o.float(), ref_o.float(), rtol=0, atol=O_ATOL[q.dtype])
    return o, lse


def test_union_lists_every_visible_selected_key_of_a_tile_once_in_order():
    _, _, _, indices = inputs(2, 1, 1, 70, 300, 9, seed=1, low=-2)
    indices[0, 3, :4] = 17  # repeats
    mask = causal(2, 70, 300)
    words, keys, sizes, cap = build_union(indices, mask, 300, 64)
    key_of, visible = selected_keys(indices, 300, mask)
    for b in range(2):
        for tile in range(2):
            rows = range(64 * tile, min(64 * tile + 64, 70))
            want = sorted({int(key_of[b, r, j]) for r in rows for j in range(9) if visible[b, r, j]})
            tile_id = b * 2 + tile
            assert keys[tile_id, :sizes[tile_id]].tolist() == want
            for key in want:
                bits = int(words[tile_id, key]) & ((1 << 64) - 1)
                assert bits == sum(1 << (r - 64 * tile) for r in rows
                                   if any(visible[b, r, j] and key_of[b, r, j] == key for j in range(9)))
    assert cap == 300 and tile_rows(70) == 64 and tile_rows(1) == 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_tiles_with_gqa_and_mla_head_dims(dtype):
    q, k, v, indices = inputs(2, 4, 2, 70, 70, 12, dtype=dtype, seed=2)
    assert_matches_reference(q, k, v, indices, causal(2, 70, 70))


def test_power_of_two_qk_dim_without_tail_and_no_mask():
    q, k, v, indices = inputs(1, 2, 2, 20, 50, 8, dqk=32, dv=8, seed=3)
    assert_matches_reference(q, k, v, indices, None, scale=0.2)


@pytest.mark.parametrize("splits", [1, 2, 5])
def test_decode_split_over_programs_and_merged(splits):
    q, k, v, indices = inputs(1, 3, 3, 1, 400, 64, dqk=40, dv=24, seed=4, low=-1)
    indices[0, 0, :10] = indices[0, 0, 10:20]  # repeats
    assert_matches_reference(q, k, v, indices, causal(1, 1, 400), splits=splits)


@pytest.mark.parametrize("masked_rows,splits", [("zero", 1), ("mean", 1), ("mean", 3)])
def test_rows_without_a_visible_key_in_split_and_whole_tiles(masked_rows, splits):
    q, k, v, indices = inputs(2, 2, 1, 40, 48, 6, seed=5)
    mask = causal(2, 40, 48).clone()
    mask[1, 0, :5] = False  # padded query rows
    mask[1, 0, :, :12] = False
    indices[0, 7] = -1  # a row that selects nothing
    o, lse = assert_matches_reference(q, k, v, indices, mask, masked_rows=masked_rows, splits=splits)
    assert torch.isneginf(lse[1, :, :5]).all() and torch.isneginf(lse[0, :, 7]).all()


def test_broadcast_mask_strided_values_and_bitwise_repeatable():
    q, k, v, indices = inputs(2, 2, 2, 18, 30, 7, seed=6)
    kv = torch.randn(2, 30, 2, 24 + 16).transpose(1, 2)  # values as a strided slice, like MLA's split
    v = kv[..., 24:]
    mask = torch.rand(1, 1, 1, 30) < 0.8
    first, _ = assert_matches_reference(q, k, v, indices, mask)
    again, _ = sparse_attention_triton(q, k, v, indices, mask, scale=0.3)
    assert torch.equal(first, again)


def test_empty_selection_and_empty_key_axis():
    q, k, v, indices = inputs(1, 2, 2, 3, 10, 4, seed=7)
    none = torch.zeros(1, 3, 0, dtype=torch.int64)
    assert_matches_reference(q, k, v, none, None, masked_rows="mean")
    o, lse = sparse_attention_triton(q, k[:, :, :0], v[:, :, :0], indices.clamp(max=-1), None, scale=0.3)
    assert (o == 0).all() and torch.isneginf(lse).all()


def test_never_reads_a_value_back_to_the_host():
    q, k, v, indices = inputs(1, 2, 2, 20, 64, 8, seed=8)
    mask = causal(1, 20, 64)
    want = [sparse_attention(q, k, v, indices, mask, scale=0.3, masked_rows=rows)[0] for rows in ("zero", "mean")]
    with pytest.MonkeyPatch.context() as patch:
        for name in HOST_READS:
            patch.setattr(torch.Tensor, name, _host_read)
        got = [sparse_attention_triton(q, k, v, indices, mask, scale=0.3, masked_rows=rows, splits=splits)[0]
               for rows, splits in (("zero", 1), ("mean", 2))]
    for out, ref in zip(got, want):
        torch.testing.assert_close(out, ref, rtol=0, atol=2e-5)


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")  # inf rows, by design
@pytest.mark.parametrize("splits", [1, 3])
def test_a_key_that_is_not_attended_to_never_reaches_the_output(splits):
    q, k, v, indices = inputs(1, 2, 1, 20, 40, 5, seed=9, low=4)
    v = v.clone()
    v[0, 0, 0, 0], v[0, 0, 1, 1], v[0, 0, 2, 2] = float("inf"), float("-inf"), float("nan")
    mask = torch.ones(1, 1, 20, 40, dtype=torch.bool)
    mask[0, 0, 6:9, 2] = False
    indices[0, :3, 0] = -1               # padding: selects nothing (and gathers key 0 nowhere)
    indices[0, 3:6, 0] = 0               # key 0 attended: column 0 becomes +inf in rows 3-5
    indices[0, 6:9, 0] = 2               # key 2 selected but hidden by the mask
    indices[0, 9, :2] = torch.tensor([0, 1])  # +inf and -inf in different columns
    indices[0, 10, :2] = torch.tensor([2, 1])
    o, _ = sparse_attention_triton(q, k, v, indices, mask, scale=0.3, splits=splits)
    ref_o, _ = sparse_attention(q, k, v, indices, mask, scale=0.3)
    finite = torch.isfinite(ref_o)
    assert torch.equal(torch.isfinite(o), finite)  # key 0 is in the union of every row of the tile
    assert finite[:, :, :3].all() and finite[:, :, 6:9].all() and not finite[:, :, 3:6, 0].any()
    assert torch.equal(torch.isnan(o), torch.isnan(ref_o)) and torch.isnan(o[0, :, 10, 2]).all()
    torch.testing.assert_close(o[finite], ref_o[finite], rtol=0, atol=2e-5)


def test_kernel_input_errors_name_the_argument():
    q, k, v, indices = inputs(1, 2, 2, 3, 10, 4)
    with pytest.raises(TypeError, match="k must have q's dtype"):
        sparse_attention_triton(q, k.double(), v.double(), indices, None, scale=0.3)
    with pytest.raises(TypeError, match="q must be bfloat16, float16 or float32"):
        sparse_attention_triton(q.double(), k.double(), v.double(), indices, None, scale=0.3)
    with pytest.raises(ValueError, match="k must be on q's device cpu, got meta"):
        sparse_attention_triton(q, k.to("meta"), v, indices, None, scale=0.3)
    huge_q = torch.zeros(1, 1, 1, 24).expand(1, 2, 2**24, 24)
    huge_kv = [torch.zeros(1, 1, 1, d).expand(1, 2, 2**24, d) for d in (24, 16)]
    one = torch.zeros(1, 1, 1, dtype=torch.int64).expand(1, 2**24, 1)
    with pytest.raises(ValueError, match="q, k, indices: B=1, S=16777216, T=16777216 need about .* GiB of workspace"):
        sparse_attention_triton(huge_q, *huge_kv, one, None, scale=0.3)
    with pytest.raises(ValueError, match="splits must be"):
        sparse_attention_triton(q, k, v, indices, None, scale=0.3, splits=0)


def _host_read(*args, **kwargs):
    raise AssertionError("a tensor value was read back to the host")
