"""The geometry zoo: shapes, determinism, parameters, and the structure each family claims."""
import numpy as np
import pytest
import torch

from runtime.dense_scorer import dense_topk
from runtime.indexer_zoo import FAMILIES, HELD_OUT_TOKENS, TRAINED_MODEL, _trained_model, zoo_inputs

B, S, T, H, D = 1, 24, 512, 8, 32


GENERATED = sorted(set(FAMILIES) - {"trained"})


@pytest.mark.parametrize("family", GENERATED)
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
        zoo_inputs("learned", B, S, T, H, D)
    with pytest.raises(ValueError, match="S: expected at most T"):
        zoo_inputs("mixture", B, T + 1, T, H, D)
    with pytest.raises(ValueError, match="H: expected a positive int"):
        zoo_inputs("mixture", B, S, T, 0, D)


def test_trained_family_captures_the_models_own_indexer_selection(monkeypatch):
    """q, k, weights of the trained checkpoint select, by the project's dense scorer, the keys the
    transformers indexer of that layer selects on the same window."""
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as modeling

    S_, T_, layer, kk = 16, 256, 1, 8
    q, k, w, params = zoo_inputs("trained", 1, S_, T_, 64, 128, seed=5, layer=layer)
    assert (q.shape, k.shape, w.shape) == ((1, S_, 64, 128), (1, T_, 128), (1, S_, 64)) and params["layer"] == layer
    assert torch.equal(q, zoo_inputs("trained", 1, S_, T_, 64, 128, seed=5, layer=layer)[0])
    _, ours = dense_topk(q, k, w, kk, torch.ones(S_, T_, dtype=torch.bool).tril(T_ - S_)[None])

    picked, original = [], modeling.DeepseekV32Indexer.forward

    def spy(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if self.layer_idx == layer:
            picked.append(out)
        return out

    model = _trained_model(str(TRAINED_MODEL), "cpu")
    tokens = np.load(HELD_OUT_TOKENS)
    start = int(np.random.default_rng(5).integers(0, tokens.size - T_ + 1, 1)[0])
    monkeypatch.setattr(modeling.DeepseekV32Indexer, "forward", spy)
    monkeypatch.setattr(model.model.layers[layer].self_attn.indexer, "index_topk", kk)  # earlier layers: dense
    with torch.no_grad():
        model(torch.from_numpy(tokens[start:start + T_].astype(np.int64))[None])
    theirs = picked[0][0, T_ - S_:]
    overlap = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(ours[0], theirs)) / (S_ * kk)
    assert overlap >= 0.95  # bf16 rounding may swap near-tied keys, nothing more


def test_trained_family_names_a_wrong_geometry():
    with pytest.raises(ValueError, match="H, D, layer"):
        zoo_inputs("trained", 1, S, T, H, D)
