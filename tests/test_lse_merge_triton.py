"""The Triton LSE merge kernel (under TRITON_INTERPRET=1) against the torch reference."""
import pytest
import torch

from compiler.lowering.flash_attention_triton import two_interval_attention_triton
from compiler.lowering.lse_merge_triton import merge_partials_triton
from runtime.attention_reference import two_interval_attention
from runtime.lse_merge import merge_partials

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0:DeprecationWarning")  # Triton interpreter internals

INF = float("inf")
NAN = float("nan")


def random_partials(n, rows_shape, d, dtype, seed, spread=4.0):
    gen = torch.Generator().manual_seed(seed)
    outputs = torch.randn(n, *rows_shape, d, generator=gen).to(dtype)
    lses = torch.randn(n, *rows_shape, generator=gen) * spread
    return outputs, lses


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matches_reference_in_every_output_dtype(dtype):
    outputs, lses = random_partials(3, (2, 3, 7), 24, dtype, seed=1)
    o, lse = merge_partials_triton(outputs, lses)
    ref_o, ref_lse = merge_partials(outputs, lses)
    assert o.dtype == dtype and o.shape == outputs.shape[1:]
    assert lse.dtype == torch.float32 and lse.shape == lses.shape[1:]
    atol = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(o.float(), ref_o.float(), rtol=0, atol=atol)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-6)


def test_merging_attention_over_disjoint_key_ranges_gives_attention_over_all_keys():
    gen = torch.Generator().manual_seed(2)
    sq, sk, d = 12, 40, 16
    q = torch.randn(1, 4, sq, d, generator=gen)
    k = torch.randn(1, 2, sk, d, generator=gen)
    v = torch.randn(1, 2, sk, d, generator=gen)
    sees_all = torch.full((1, sq), sk)
    whole = two_interval_attention(q, k, v, sees_all, sees_all, scale=0.25)
    parts = [two_interval_attention_triton(q, k[:, :, a:b], v[:, :, a:b], torch.full((1, sq), b - a),
                                           torch.full((1, sq), b - a), scale=0.25)
             for a, b in ((0, 13), (13, 14), (14, 40))]
    o, lse = merge_partials_triton(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    torch.testing.assert_close(o, whole[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(lse, whole[1], rtol=0, atol=1e-5)


def test_minus_infinite_partials_contribute_nothing_even_with_nan_outputs():
    outputs, lses = random_partials(3, (5,), 16, torch.float32, seed=3)
    lses[1] = -INF
    outputs[1] = NAN
    o, lse = merge_partials_triton(outputs, lses)
    expected = merge_partials(outputs[[0, 2]], lses[[0, 2]])
    torch.testing.assert_close(o, expected[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(lse, expected[1], rtol=0, atol=1e-6)


def test_all_partials_empty_gives_zero_output_and_minus_infinite_lse():
    outputs, lses = random_partials(2, (3,), 16, torch.bfloat16, seed=4)
    lses[:, 1] = -INF
    o, lse = merge_partials_triton(outputs, lses)
    assert torch.all(o[1] == 0) and torch.isneginf(lse[1])
    assert torch.isfinite(lse[[0, 2]]).all()


def test_huge_log_sum_exps_do_not_overflow():
    outputs, lses = random_partials(2, (4,), 16, torch.float32, seed=5)
    lses[0] = 1.0e4
    lses[1] = 1.0e4 + 1.0
    o, lse = merge_partials_triton(outputs, lses)
    weight_1 = torch.sigmoid(torch.tensor(1.0))  # exp(l1) / (exp(l0) + exp(l1))
    torch.testing.assert_close(o, (1 - weight_1) * outputs[0] + weight_1 * outputs[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(lse, lses[1] + torch.log1p(torch.exp(torch.tensor(-1.0))), rtol=1e-6, atol=0)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf, on purpose
def test_nan_or_plus_infinite_lse_makes_its_row_nan_like_the_reference():
    outputs, lses = random_partials(3, (4,), 16, torch.float32, seed=6)
    lses[1, 0] = NAN
    lses[2, 2] = INF
    o, lse = merge_partials_triton(outputs, lses)
    ref_o, ref_lse = merge_partials(outputs, lses)
    bad = torch.tensor([True, False, True, False])
    assert torch.isnan(lse[bad]).all() and torch.isnan(o[bad]).all()
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse))
    torch.testing.assert_close(o[~bad], ref_o[~bad], rtol=0, atol=1e-6)


def test_single_partial_is_returned_unchanged():
    outputs, lses = random_partials(1, (2, 5), 16, torch.float32, seed=7)
    o, lse = merge_partials_triton(outputs, lses)
    torch.testing.assert_close(o, outputs[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(lse, lses[0], rtol=0, atol=1e-6)


def test_custom_op_passes_opcheck():
    outputs, lses = random_partials(2, (3, 4), 16, torch.float32, seed=8)
    torch.library.opcheck(torch.ops.pulsar_dosa.merge_partials_triton, (outputs, lses),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("outputs, lses, error, words", [
    ([torch.zeros(2, 3, 16)], torch.zeros(2, 3), TypeError, "outputs and lses"),
    (torch.zeros(2, 3, 16, dtype=torch.float64), torch.zeros(2, 3), TypeError, "outputs must be"),
    (torch.zeros(2, 3, 16), torch.zeros(2, 3, dtype=torch.int64), TypeError, "lses must be"),
    (torch.zeros(16), torch.zeros(()), ValueError, r"outputs must be \[n"),
    (torch.zeros(2, 3, 16), torch.zeros(2, 4), ValueError, "lses must have shape"),
    (torch.zeros(0, 3, 16), torch.zeros(0, 3), ValueError, "at least one partial"),
])
def test_bad_inputs_raise_errors_naming_the_argument(outputs, lses, error, words):
    with pytest.raises(error, match=words):
        merge_partials_triton(outputs, lses)
