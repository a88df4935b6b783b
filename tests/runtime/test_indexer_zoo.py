"""The geometry zoo: shapes, determinism, parameters, and the structure each family claims."""
import pytest
import torch

from runtime.dense_scorer import dense_topk
from runtime.indexer_zoo import FAMILIES, zoo_inputs

B, S, T, H, D = 1, 24, 512, 8, 32


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_is_finite_shaped_and_deterministic_per_seed(family):
    q, k, w, params = zoo_inputs(family, B, S, T, H, D, seed=3, dtype=torch.bfloat16)
    assert (q.shape, k.shape, w.shape) == ((B, S, H, D), (B, T, D), (B, S, H))
    assert q.dtype == k.dtype == torch.bfloat16 and w.dtype == torch.float32
    assert all(bool(torch.isfinite(x.float()).all()) for x in (q, k, w))
    again = zoo_inputs(family, B, S, T, H, D, seed=3, dtype=torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip((q, k, w), again[:3]))
    other = zoo_inputs(family, B, S, T, H, D, seed=4, dtype=torch.bfloat16)
    assert not torch.equal(q, other[0])
    assert params["family"] == family and params["seed"] == 3 and params["T"] == T


def test_no_family_runs_its_queries_in_steps_of_the_anchor_stride():
    runs = [f.params["query_run"] for f in FAMILIES.values() if "query_run" in f.params]
    assert runs and all(run % 16 for run in runs)  # an anchor group never lies inside one run


def _neighbour_overlap(family, **params):
    q, k, w, _ = zoo_inputs(family, 1, 64, 2048, H, D, seed=0, **params)
    _, idx = dense_topk(q, k, w, 64)
    sets = [set(row.tolist()) for row in idx[0]]
    return sum(len(a & b) for a, b in zip(sets, sets[1:])) / (64 * 63)


def test_locality_correlation_length_sets_how_much_neighbouring_queries_share():
    assert _neighbour_overlap("locality_512") > _neighbour_overlap("locality_64") > 0.1


def test_parameters_override_the_family_defaults():
    _, _, _, params = zoo_inputs("locality_512", B, S, T, H, D, corr_length=32)
    assert params["corr_length"] == 32
    a = zoo_inputs("misaligned_runs", B, S, T, H, D, query_run=7)[0]
    assert not torch.equal(a, zoo_inputs("misaligned_runs", B, S, T, H, D)[0])


def test_bad_arguments_are_rejected_naming_them():
    with pytest.raises(ValueError, match="family: expected one of"):
        zoo_inputs("trained", B, S, T, H, D)
    with pytest.raises(ValueError, match="S: expected at most T"):
        zoo_inputs("mixture", B, T + 1, T, H, D)
    with pytest.raises(ValueError, match="H: expected a positive int"):
        zoo_inputs("mixture", B, S, T, 0, D)
