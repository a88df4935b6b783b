"""``compiler.ops.sparse_form``: the per-call choice between the absorbed and union forms, and the
absorbed op's CUDA kernel running the chosen one (under TRITON_INTERPRET=1)."""
import pytest
import torch

from compiler.cost_model import absorbed_attention_time, union_attention_time, union_ratio_crossover
from compiler.lowering.defaults import ABSORBED_BLOCK_HEADS
from compiler.ops.absorbed_sparse_attention import absorbed_sparse_attention_cuda
from compiler.ops.sparse_form import call_sparse_form, choose_form
from runtime.absorbed_attention import absorbed_sparse_attention

from tests.lowering.attention.test_absorbed_attention import causal, mla_inputs

V32 = (512, 128, 64, 128)  # Dc, Dn, Dr, Dv


def choose(heads, s, ratio=None, *, t=None, topk=2048, fits=True, may_measure=True, ws=True):
    calls = []

    def measure():
        calls.append(1)
        if ratio is None:
            raise AssertionError("the ratio was measured where the bounds decide")
        return ratio

    form, reason = call_sparse_form(batch=1, queries=s, topk=topk, heads=heads, tile=64, warp_specialised=ws,
                                    expand=(t or s, *V32), union_fits=fits, may_measure=may_measure,
                                    measure_ratio=measure)
    return form, reason, len(calls)


@pytest.mark.parametrize("heads,s,ratio,want", [
    (128, 32768, 1.03, "union"),  # a shared window: the union is the selection
    (128, 32768, 2.1, "absorbed"),  # 16 neighbours share half their keys
    (128, 65536, 15.1, "absorbed"),  # uniform over the visible keys
    (16, 16384, 4.07, "union"),
    (16, 32768, 8.0, "absorbed"),
])
def test_the_measured_overlap_decides_where_the_bounds_do_not(heads, s, ratio, want):
    form, reason, measured = choose(heads, s, ratio)
    assert (form, measured) == (want, 1) and "crossover" in reason


def test_the_crossover_is_where_the_predicted_times_meet():
    expand = (32768, *V32)
    x = union_ratio_crossover(1, 32768, 2048, 128, True, expand=expand)
    union = union_attention_time(1, 32768, 2048, 128, x, expand=expand)
    assert union == pytest.approx(absorbed_attention_time(1, 32768, 2048, 128, True), rel=1e-9)
    assert 1 < x < 2
    assert union_attention_time(1, 32768, 2048, 128, x + 1, expand=expand) > union


def test_bounds_decide_without_measuring():
    # 4096 keys of 2048-wide selections: a tile's union is at most 2 x topk, below the crossover at 8 heads.
    assert choose(8, 4096, t=4096, ws=False)[::2] == ("union", 0)
    # One query row over many keys: expanding them all costs more than the absorbed form at any overlap.
    assert choose(128, 16, t=131072, topk=2048)[::2] == ("absorbed", 0)


def test_without_memory_or_while_capturing():
    assert choose(16, 16384, fits=False)[::2] == ("absorbed", 0)
    assert choose(ABSORBED_BLOCK_HEADS, 32768, may_measure=False)[::2] == ("absorbed", 0)
    assert choose(ABSORBED_BLOCK_HEADS - 1, 32768, may_measure=False)[::2] == ("union", 0)


def test_the_cost_model_refuses_bad_sizes():
    with pytest.raises(ValueError, match="ratio"):
        union_attention_time(1, 8, 8, 8, -1.0)
    with pytest.raises(TypeError, match="heads"):
        absorbed_attention_time(1, 8, 8, 8.0, True)


def test_attention_constants_must_be_positive_and_finite():
    import dataclasses
    import math

    from compiler.cost_model import H200_ATTENTION

    for field in ("absorbed_s", "union_s", "copy_bytes_per_s"):
        for bad in (0.0, -1e-12, math.inf, math.nan, True):
            with pytest.raises(ValueError, match=field):
                dataclasses.replace(H200_ATTENTION, **{field: bad})
    with pytest.raises(TypeError, match="source"):
        dataclasses.replace(H200_ATTENTION, source=None)


def test_records_keep_the_last_measurement_per_key():
    from compiler.ops.sparse_form import OverlapRecords

    records, calls = OverlapRecords(), []

    def measure(value):
        def run():
            calls.append(value)
            return torch.tensor(value)
        return run

    assert records.ratio("a", measure(2.0)) == 2.0  # the first call of a key measures and waits
    assert records.ratio("a", measure(3.0)) == 3.0  # off CUDA a later measurement is read at once
    assert records.ratio("b", measure(5.0)) == 5.0 and calls == [2.0, 3.0, 5.0]
    records.clear()
    assert records.ratio("a", measure(7.0)) == 7.0


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")  # Triton interpreter
@pytest.mark.parametrize("heads,s,t,width,want", [(2, 40, 40, 8, "union"), (16, 16, 4096, 4, "absorbed")])
@pytest.mark.parametrize("masked_rows", ["zero", "mean"])
def test_an_auto_call_runs_the_chosen_form_and_matches_the_reference(heads, s, t, width, want, masked_rows):
    q, latent, rope_key, weight, indices = mla_inputs(2, heads, s, t, width, seed=heads)
    indices[0, :3] = -1  # rows without a key
    mask = causal(2, s, t)
    form, reason = choose_form(q, latent, rope_key, weight, indices, mask)
    assert form == want and "any overlap" in reason
    ref, _ = absorbed_sparse_attention(q, latent, rope_key, weight, indices, mask, scale=0.3,
                                       masked_rows=masked_rows)
    for form in ("auto", "absorbed"):
        got = absorbed_sparse_attention_cuda(q, latent, rope_key, weight, indices, mask, 0.3, masked_rows, False,
                                             form, "")
        torch.testing.assert_close(got, ref, rtol=0, atol=2e-5)


def test_a_bad_form_is_named_before_any_work():
    q, latent, rope_key, weight, indices = mla_inputs(1, 2, 4, 7, 2)
    with pytest.raises(ValueError, match="form must be one of"):
        absorbed_sparse_attention_cuda(q, latent, rope_key, weight, indices, None, 0.3, "zero", False, "union", "")
    with pytest.raises(ValueError, match="masked_rows"):
        absorbed_sparse_attention_cuda(q, latent, rope_key, weight, indices, None, 0.3, "nan", False, "auto", "")
