"""Calibration inputs of the plan CLI: token files, sequence batching, model specs."""
import json

import numpy as np
import pytest
import torch

from compiler.plan.inputs import batch_sequences, describe_tokens, load_model, load_token_ids


def test_token_ids_load_identically_from_txt_npy_and_pt(tmp_path):
    ids = torch.tensor([5, 0, 17, 3, 3, 250])
    (tmp_path / "t.txt").write_text("5 0\n17\t3 3 250\n")
    np.save(tmp_path / "t.npy", ids.numpy().astype(np.int32))
    torch.save(ids.to(torch.int16), tmp_path / "t.pt")
    for name in ("t.txt", "t.npy", "t.pt"):
        loaded = load_token_ids(tmp_path / name)
        assert loaded.dtype == torch.int64 and torch.equal(loaded, ids)


@pytest.mark.parametrize("name, content, message", [
    ("t.txt", "1 2 x", "whitespace-separated integers"),
    ("t.txt", "", "non-empty"),
    ("t.txt", "3 -1", ">= 0"),
    ("t.csv", "1,2", r"\.txt, \.npy or \.pt"),
])
def test_bad_token_files_are_rejected_with_the_reason(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=message):
        load_token_ids(tmp_path / name)


def test_float_arrays_are_not_token_ids(tmp_path):
    np.save(tmp_path / "f.npy", np.zeros(4, dtype=np.float32))
    torch.save(torch.zeros(4), tmp_path / "f.pt")
    for name in ("f.npy", "f.pt"):
        with pytest.raises(TypeError, match="integer"):
            load_token_ids(tmp_path / name)


def test_streams_are_cut_into_sequences_and_batched():
    batches = batch_sequences(torch.arange(23), seq_len=5, batch_size=3)
    assert [tuple(b.shape) for b in batches] == [(3, 5), (1, 5)]
    assert torch.equal(torch.cat(batches).flatten(), torch.arange(20))
    assert [tuple(b.shape) for b in batch_sequences(torch.arange(7), None, 1)] == [(1, 7)]
    rows = torch.arange(12).view(3, 4)
    assert [tuple(b.shape) for b in batch_sequences(rows, 2, 2)] == [(2, 2), (1, 2)]
    desc = describe_tokens(torch.arange(23), "ids.txt", batches)
    assert (desc["tokens"], desc["sequences"], desc["seq_len"], desc["batches"]) == (23, 4, 5, 2)


def tiny_config_dict():
    from transformers import DeepseekV32Config

    return DeepseekV32Config(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                             n_routed_experts=2, kv_lora_rank=8, q_lora_rank=16, qk_rope_head_dim=4,
                             v_head_dim=8, qk_nope_head_dim=8, n_group=1, topk_group=1, num_experts_per_tok=1,
                             index_topk=4, index_head_dim=8, index_n_heads=4).to_dict()


def test_config_json_gives_a_seeded_random_init(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config_dict()))
    a = load_model(str(tmp_path / "config.json"), seed=3)
    b = load_model(str(tmp_path), seed=3)
    c = load_model(str(tmp_path), seed=4)
    wa, wb, wc = (next(m.model.parameters()) for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.description["weights"] == "random init, seed 3"
    assert a.description["config_sha256"] == b.description["config_sha256"]
    assert not a.model.training


def test_saved_weights_are_loaded_from_a_model_directory(tmp_path):
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

    torch.manual_seed(11)
    model = DeepseekV32ForCausalLM(DeepseekV32Config(**tiny_config_dict()))
    model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), seed=0)
    assert loaded.description["weights"] == "loaded"
    assert torch.equal(next(loaded.model.parameters()), next(model.parameters()))


def test_factory_specs_are_called_and_checked():
    loaded = load_model("torch.nn:Identity")
    assert isinstance(loaded.model, torch.nn.Identity) and loaded.tokenizer is None
    with pytest.raises(TypeError, match="expected an nn.Module"):
        load_model("collections:OrderedDict")
    with pytest.raises(ValueError, match="cannot import"):
        load_model("no_such_module_xyz:make")
    with pytest.raises(ValueError, match="expected a transformers model directory"):
        load_model("missing_dir_xyz")

