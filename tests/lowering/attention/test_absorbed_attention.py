"""The absorbed-form Triton kernels (under TRITON_INTERPRET=1) against the plain-torch reference."""
import pytest
import torch

import compiler.lowering.attention.absorbed_attention as lowering
from compiler.lowering.attention.absorbed_attention import absorbed_sparse_attention_triton
from runtime.absorbed_attention import absorbed_sparse_attention

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0:DeprecationWarning")  # Triton interpreter internals

# The kernel and the reference both accumulate in fp32; the gap is the rounding of q_lat, o_lat and o.
O_ATOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
HOST_READS = ("item", "tolist", "nonzero", "__bool__", "__int__", "__float__", "__index__")


def mla_inputs(b, heads, s, t, width, dn=6, dr=4, dv=5, dc=24, dtype=torch.float32, seed=0, low=-1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, heads, s, dn + dr, generator=g).to(dtype)
    latent = torch.randn(b, t, dc, generator=g).to(dtype)
    rope_key = torch.randn(b, t, dr, generator=g).to(dtype)
    weight = (0.3 * torch.randn(heads * (dn + dv), dc, generator=g)).to(dtype)
    return q, latent, rope_key, weight, torch.randint(low, t, (b, s, width), generator=g)


def causal(b, s, t):
    return (torch.arange(t)[None, :] <= torch.arange(t - s, t)[:, None]).expand(b, 1, s, t)


def assert_matches_reference(q, latent, rope_key, weight, indices, mask, masked_rows="zero", **kwargs):
    o = absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, mask, scale=0.3,
                                         masked_rows=masked_rows, **kwargs)
    want, _ = absorbed_sparse_attention(q, latent, rope_key, weight, indices, mask, scale=0.3, masked_rows=masked_rows)
    assert o.dtype == q.dtype and o.shape == want.shape
    torch.testing.assert_close(o.float(), want.float(), rtol=0, atol=O_ATOL[q.dtype])
    return o


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_with_a_causal_mask_repeats_and_padding(dtype):
    q, latent, rope_key, weight, indices = mla_inputs(2, 3, 20, 40, 24, dtype=dtype, seed=1)
    indices[0, 5, :6] = 17  # repeats count once
    indices[1, 3] = 45  # out of range: selects nothing
    mask = causal(2, 20, 40).clone()
    mask[1, 0, :4] = False  # padded query rows
    assert_matches_reference(q, latent, rope_key, weight, indices, mask, masked_rows="mean")


def test_distinct_indices_skip_the_sort_and_agree():
    q, latent, rope_key, weight, _ = mla_inputs(1, 2, 6, 50, 1, seed=2)
    g = torch.Generator().manual_seed(2)
    indices = torch.stack([torch.randperm(50, generator=g)[:20] for _ in range(6)])[None]
    sorted_once = assert_matches_reference(q, latent, rope_key, weight, indices, None)
    unsorted = absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, None, scale=0.3, distinct=True)
    torch.testing.assert_close(unsorted, sorted_once, rtol=0, atol=2e-6)


@pytest.mark.parametrize("splits,masked_rows", [(1, "zero"), (2, "mean"), (5, "zero")])
def test_decode_split_over_programs_and_merged(splits, masked_rows):
    q, latent, rope_key, weight, indices = mla_inputs(2, 3, 1, 300, 80, seed=3)
    mask = causal(2, 1, 300).clone()
    mask[1, 0, 0, :] = False  # a row with no visible key
    assert_matches_reference(q, latent, rope_key, weight, indices, mask, masked_rows=masked_rows, splits=splits)


def test_a_key_that_does_not_count_never_reaches_the_output():
    q, latent, rope_key, weight, indices = mla_inputs(1, 2, 8, 120, 20, seed=4, low=0)
    mask = causal(1, 8, 120).clone()
    mask[..., 3] = False  # key 3 hidden from every query
    indices[0, :, 0] = 3
    counted = torch.zeros(120, dtype=torch.bool)
    counted[indices.flatten()] = True
    counted[3] = False
    assert (~counted).sum() > 10
    clean = absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, mask, scale=0.3)
    poisoned = latent.clone()
    poisoned[0, ~counted] = float("inf")
    rope_poisoned = rope_key.clone()
    rope_poisoned[0, ~counted] = float("nan")
    for splits in (1, 2):
        got = absorbed_sparse_attention_triton(q, poisoned, rope_poisoned, weight, indices, mask, scale=0.3,
                                               splits=splits)
        torch.testing.assert_close(got, clean, rtol=0, atol=2e-6)


@pytest.mark.parametrize("batch", [1, 2])  # one batch row: the products are written into out's rows in place
def test_queries_in_several_chunks(monkeypatch, batch):
    q, latent, rope_key, weight, indices = mla_inputs(batch, 3, 21, 30, 9, seed=5)
    whole = assert_matches_reference(q, latent, rope_key, weight, indices, causal(batch, 21, 30))
    monkeypatch.setattr(lowering, "CHUNK_ELEMENTS", batch * 3 * 24 * 8)  # 8 queries per chunk
    chunked = absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, causal(batch, 21, 30),
                                               scale=0.3)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=2e-6)


def test_empty_selection_and_empty_key_axis():
    q, latent, rope_key, weight, _ = mla_inputs(1, 2, 3, 10, 1, seed=6)
    assert_matches_reference(q, latent, rope_key, weight, torch.zeros(1, 3, 0, dtype=torch.int64), None,
                             masked_rows="mean")
    none = torch.full((1, 3, 4), -1)
    assert (absorbed_sparse_attention_triton(q, latent[:, :0], rope_key[:, :0], weight, none, None, scale=0.3)
            == 0).all()


def test_never_reads_a_value_back_to_the_host():
    q, latent, rope_key, weight, indices = mla_inputs(1, 2, 12, 64, 40, seed=7)
    mask = causal(1, 12, 64)
    want = [absorbed_sparse_attention(q, latent, rope_key, weight, indices, mask, scale=0.3, masked_rows=rows)[0]
            for rows in ("zero", "mean")]
    with pytest.MonkeyPatch.context() as patch:
        for name in HOST_READS:
            patch.setattr(torch.Tensor, name, _host_read)
        got = [absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, mask, scale=0.3,
                                                masked_rows=rows, splits=splits)
               for rows, splits in (("zero", 1), ("mean", 2))]
    for out, ref in zip(got, want):
        torch.testing.assert_close(out, ref, rtol=0, atol=2e-5)


def test_kernel_input_errors_name_the_argument():
    q, latent, rope_key, weight, indices = mla_inputs(1, 2, 3, 10, 4)
    with pytest.raises(ValueError, match="config must be one of"):
        absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, None, scale=0.3, config="fast")
    with pytest.raises(ValueError, match="splits must be"):
        absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, None, scale=0.3, splits=0)
    with pytest.raises(TypeError, match="distinct must be a bool"):
        absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, None, scale=0.3, distinct=1)
    with pytest.raises(TypeError, match="q must be bfloat16, float16 or float32"):
        absorbed_sparse_attention_triton(*(x.double() for x in (q, latent, rope_key, weight)), indices, None,
                                         scale=0.3)
    huge = torch.zeros(1, 1, 1, dtype=torch.int64).expand(1, 3_000_000, 200_000)
    with pytest.raises(ValueError, match="q, latent, indices: B=1, H=2, S=3000000, K=200000 need about .* GiB"):
        absorbed_sparse_attention_triton(q[:, :, :1].expand(1, 2, 3_000_000, 10), latent, rope_key, weight, huge,
                                         None, scale=0.3)


def _host_read(*args, **kwargs):
    raise AssertionError("a tensor value was read back to the host")


def test_a_configuration_that_does_not_compile_falls_back_for_the_op_only(monkeypatch):
    from triton.runtime.errors import OutOfResources

    q, latent, rope_key, weight, indices = mla_inputs(1, 2, 5, 30, 8, seed=9)
    tried = []

    def attend_with(*args):
        tried.append(args[8])
        if len(tried) == 1:
            raise OutOfResources(300000, 232448, "shared memory")
        return real(*args)

    real = lowering._attend_with
    monkeypatch.setattr(lowering, "_attend_with", attend_with)
    monkeypatch.setattr(lowering, "_WORKING", {})
    assert_matches_reference(q, latent, rope_key, weight, indices, None)
    assert len(tried) == 2
    assert_matches_reference(q, latent, rope_key, weight, indices, None)  # the working one is remembered
    assert len(tried) == 3
    with pytest.raises(OutOfResources):
        tried.clear()
        absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, None, scale=0.3,
                                         config="h32_n32_w8_s4")


def test_every_call_tries_the_warp_specialised_kernel_first_then_the_triton_chain_for_its_size():
    from compiler.lowering.attention.absorbed_attention import (CONFIGS, DEFAULT_CONFIG, FEW_QUERIES,
                                                                FEW_QUERIES_CONFIG, CONFIG_NAMES, WARP_SPECIALISED,
                                                                default_configs)

    few, many = default_configs(FEW_QUERIES), default_configs(FEW_QUERIES + 1)
    assert few[0] == many[0] == WARP_SPECIALISED
    assert few[1] == FEW_QUERIES_CONFIG and many[1] == DEFAULT_CONFIG
    for names in (few, many):
        assert set(names[1:]) <= set(CONFIGS)
        assert len(set(names)) == len(names) and set(names) <= set(CONFIG_NAMES)
        assert DEFAULT_CONFIG in names and FEW_QUERIES_CONFIG in names


def test_the_warp_specialised_kernel_splits_rows_only_where_its_programs_leave_multiprocessors_idle(monkeypatch):
    """One Gluon program an SM: under a CUDA graph a grid of P programs splits its rows into at most
    SMs // P splits of at least WARP_SPECIALISED_MIN_SPLIT indices, each a whole number of tile pairs,
    none empty; a split count asked for is kept (trimmed so that no split is empty)."""
    from types import SimpleNamespace

    monkeypatch.setattr(lowering, "absorbed_attention_ws", SimpleNamespace(BLOCK_H=64, BLOCK_N=64))
    monkeypatch.setattr(lowering, "multiprocessor_count", lambda device: 132)
    monkeypatch.setattr(lowering, "WARP_SPECIALISED_MIN_SPLIT", 256)
    monkeypatch.setattr(lowering, "graph_capturing", lambda device: True)
    cuda = torch.device("cuda")
    splits = lowering.warp_specialised_splits
    assert splits(2, 2048, cuda) == (8, 256)  # one query of 128 heads: 16 of 132 SMs busy
    assert splits(16, 2048, cuda) == (8, 256)
    assert splits(64, 2048, cuda) == (2, 1024)
    assert splits(128, 2048, cuda) == (1, 2048)  # 128 programs: no split
    assert splits(2, 4096, cuda) == (16, 256)
    assert splits(2, 300, cuda) == (1, 384)  # too short to split: one split, rounded up to tile pairs
    assert splits(2, 600, cuda) == (2, 384)
    assert splits(2, 2048, cuda, 3) == (3, 768)  # asked for: 3 splits of whole pairs
    assert splits(2, 200, cuda, 4) == (2, 128)  # asked for 4, trimmed: no split left empty
    assert splits(2, 2048, cuda, 1) == (1, 2048)
    for programs in range(1, 300, 7):
        for width in (1, 128, 129, 1000, 2048, 8192):
            n, length = splits(programs, width, cuda)
            assert length % 128 == 0 and (n - 1) * length < width <= n * length
            assert n == 1 or (programs * n <= 132 and length >= 256)
    # Issued eagerly the host sets a decode call's pace: no split unless asked for (SPLIT_UNDER_GRAPHS_ONLY).
    monkeypatch.setattr(lowering, "graph_capturing", lambda device: False)
    assert splits(2, 2048, cuda) == (1, 2048) and splits(2, 2048, cuda, 8) == (8, 256)
    monkeypatch.setattr(lowering, "SPLIT_UNDER_GRAPHS_ONLY", False)
    assert splits(2, 2048, cuda) == (8, 256)
    assert splits(2, 2048, torch.device("cpu")) == (1, 2048)


def test_the_op_splits_the_gluon_kernel_under_a_capture_only(monkeypatch):
    """Outside a CUDA graph the Gluon kernel runs unsplit; under a capture a small grid splits (a grid
    that fills the GPU never does)."""
    from types import SimpleNamespace

    ran = []
    capturing = [False]
    real = lowering.warp_specialised_splits
    monkeypatch.setattr(lowering, "absorbed_attention_ws", SimpleNamespace(BLOCK_H=64, BLOCK_N=64))
    monkeypatch.setattr(lowering, "_warp_specialised_applies", lambda *args: True)
    monkeypatch.setattr(lowering, "multiprocessor_count", lambda device: 132)
    monkeypatch.setattr(lowering, "graph_capturing", lambda device: capturing[0])
    monkeypatch.setattr(lowering, "warp_specialised_splits", lambda programs, width, device, splits=None:
                        real(programs, width, torch.device("cuda"), splits))  # CPU tensors standing in
    monkeypatch.setattr(lowering, "_attend_warp_specialised", lambda *args: ran.append(args[-2:]))
    q_lat, indices = torch.empty(1, 128, 1, 512), torch.empty(1, 1, 2048, dtype=torch.int32)

    def call(mean=None, queries=1):
        q = q_lat.expand(1, 128, queries, 512)
        lowering._attend_latent(q, q, q, q, indices.expand(1, queries, 2048), mean, q, 0.1,
                                (lowering.WARP_SPECIALISED,), None)
        return ran[-1][0]

    assert [call(), call(), call(mean=torch.empty(1, 512))] == [1, 1, 1]
    capturing[0] = True
    assert [call(), call(), call(mean=torch.empty(1, 512))] == [8, 8, 8]
    assert call(queries=128) == 1  # a grid that fills the GPU never splits


def test_the_warp_specialised_kernel_applies_on_its_inputs_whatever_the_grid_and_the_width(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(lowering, "absorbed_attention_ws", SimpleNamespace(usable=lambda *a: True))
    monkeypatch.setattr(lowering, "_INTERPRETED", False)
    q_lat = torch.empty(1, lowering.WARP_SPECIALISED_MIN_HEADS, 1, 512)
    assert lowering._warp_specialised_applies(q_lat, q_lat, q_lat, q_lat, q_lat)
    few = torch.empty(1, lowering.WARP_SPECIALISED_MIN_HEADS - 1, 1, 512)
    assert not lowering._warp_specialised_applies(few, few, few, few, few)
    monkeypatch.setattr(lowering, "absorbed_attention_ws", SimpleNamespace(usable=lambda *a: False))
    assert not lowering._warp_specialised_applies(q_lat, q_lat, q_lat, q_lat, q_lat)


def test_the_warp_specialised_form_runs_the_triton_chain_where_it_does_not_apply():
    # Under the interpreter (and off sm_90, for fp32, with fewer than WARP_SPECIALISED_MIN_HEADS heads
    # or a split grid) the Gluon kernel does not apply: "ws" gives DEFAULT_CONFIG's result, bitwise.
    q, latent, rope_key, weight, indices = mla_inputs(1, 16, 12, 40, 10, dtype=torch.bfloat16, seed=7)
    mask = causal(1, 12, 40)
    ws = assert_matches_reference(q, latent, rope_key, weight, indices, mask, masked_rows="mean", config="ws")
    default = absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, mask, scale=0.3,
                                               masked_rows="mean", config=lowering.DEFAULT_CONFIG)
    assert torch.equal(ws, default)
    b, heads, s, _ = q.shape
    q_lat = torch.empty(b, heads, s, latent.shape[2], dtype=q.dtype)
    assert not lowering._warp_specialised_applies(q_lat, q[..., 6:], latent, rope_key, q_lat)
    with pytest.raises(ValueError, match="config must be one of .*'ws'"):
        absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, mask, scale=0.3, config="wss")


def test_a_warp_specialised_kernel_that_does_not_launch_leaves_the_triton_chain_for_good(monkeypatch):
    from triton.runtime.errors import OutOfResources

    calls = []

    def fails(*args):
        calls.append(args)
        raise OutOfResources(300000, 232448, "shared memory")

    monkeypatch.setattr(lowering, "_warp_specialised_applies", lambda *args: True)
    monkeypatch.setattr(lowering.absorbed_attention_ws, "attend_latent_ws", fails)
    monkeypatch.setattr(lowering, "_WS_FAILED", set())
    q, latent, rope_key, weight, indices = mla_inputs(1, 16, 9, 30, 8, dtype=torch.bfloat16, seed=8)
    want = absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, None, scale=0.3,
                                            config=lowering.DEFAULT_CONFIG)
    for _ in range(2):
        got = absorbed_sparse_attention_triton(q, latent, rope_key, weight, indices, None, scale=0.3, config="ws")
        assert torch.equal(got, want)
    assert len(calls) == 1 and len(lowering._WS_FAILED) == 1
