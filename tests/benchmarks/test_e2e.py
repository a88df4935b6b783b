"""benchmarks/e2e.py --smoke: the prefill rows of stock, the backend's defaults and the FP8 indexer
option (``pulsar_dosa_fp8``) on a tiny DeepSeek-V3.2 model, with the last-token argmax agreement
against stock reported; and --mode generate's rows (time to first token, decode steps, tokens
against eager's, compiles in the timed call)."""
import json

import pytest
import torch

from benchmarks import e2e


def test_smoke_rows_for_stock_bf16_and_fp8_indexers(tmp_path):
    out = tmp_path / "e2e.json"
    assert e2e.main(["--smoke", "--models", "DeepseekV32ForCausalLM", "--methods", "stock", "pulsar_dosa",
                     "pulsar_dosa_fp8", "--lengths", "64", "--reps", "1", "--out", str(out)]) == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"stock", "pulsar_dosa", "pulsar_dosa_fp8"}
    assert all(r["error"] is None and r["ms"] > 0 for r in rows.values())
    for method in ("pulsar_dosa", "pulsar_dosa_fp8"):
        assert isinstance(rows[method]["argmax_agree"], bool) and rows[method]["max_abs_diff"] < 1.0
    assert "pulsar_dosa_fp8" in out.with_suffix(".md").read_text()


def test_generate_smoke_times_ttft_decode_steps_and_total_and_compares_tokens_with_eager(tmp_path):
    """--mode generate on the CPU: one row per method and size, the timed call compiles nothing (one
    graph per cache length would show here), B = 1 generates eager's tokens, B = 2 decodes over a
    grown latent cache of bytes_per_token's size."""
    from transformers import DeepseekV32Config

    from compiler.latent_cache import bytes_per_token

    out = tmp_path / "generate.json"
    assert e2e.main(["--mode", "generate", "--smoke", "--shape", "v32", "--methods", "eager", "stock",
                     "pulsar_dosa_latent", "--lengths", "40", "--batches", "1", "2", "--new-tokens", "3",
                     "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {(r["method"], r["B"]): r for r in doc["rows"]}
    assert set(rows) == {(m, b) for m in ("eager", "stock", "pulsar_dosa_latent") for b in (1, 2)}
    for (method, batch), row in rows.items():
        assert row["error"] is None, row
        assert len(row["decode_ms_all"]) == 2 and 0 < row["ttft_ms"] <= row["total_ms"]
        assert row["compiles"] == 0 and row["synthetic_cache"] == (batch == 2)
        assert (row["first_compiles"] > 0) == (method != "eager")  # the first call compiles (a new batch too)
    assert rows["stock", 1]["tokens_match_eager"] is True
    assert rows["pulsar_dosa_latent", 1]["tokens_match_eager"] is True
    assert rows["pulsar_dosa_latent", 1]["attention_forms"] == ["absorbed at S=1", "auto at S=40"]  # decode, prefill
    assert not rows["pulsar_dosa_latent", 1]["near_misses"]
    config = DeepseekV32Config(num_hidden_layers=1, **e2e.SMOKE_SIZES)
    assert rows["pulsar_dosa_latent", 2]["cache_bytes_per_token"] == bytes_per_token(config, torch.float32)
    assert "| 2 | 40 |" in out.with_suffix(".md").read_text()


def test_the_trained_shape_prompts_with_held_out_text_one_window_per_row():
    import numpy as np

    model, config = e2e.generate_model("tiny-dsa", "cpu", torch.float32)
    ids = e2e.prompt_ids("tiny-dsa", config, 2, 16, "cpu")
    tokens = np.load(e2e.HELDOUT).astype(np.int64)
    assert ids.shape == (2, 16) and ids[1].tolist() == tokens[16:32].tolist()
    assert type(model).__name__ == "DeepseekV32ForCausalLM" and config.index_topk == 2048


def test_a_decode_steps_gpu_time_is_the_profiled_difference_over_the_steps_and_shows_beside_its_wall_time():
    whole, prefill = {"total_ms": 330.0}, {"total_ms": 300.0}
    assert e2e.device_ms_per_step(whole, prefill, 16) == 2.0
    with pytest.raises(ValueError, match="new_tokens"):  # a 1-token generate has no decode step
        e2e.device_ms_per_step(whole, prefill, 1)
    row = {"model": "M", "method": "pulsar_dosa", "B": 1, "S": 64, "error": None, "ttft_ms": 1.0, "decode_ms": 3.19,
           "decode_ms_first": 4.07, "total_ms": 9.0, "compiles": 0, "decode_device_ms": 1.5836}
    text = e2e.render_generate({"device": "d", "versions": {}, "new_tokens": 16, "rows": [row]})
    assert "pulsar_dosa 4.07 / 3.19 (1.58 on the GPU)" in text
    assert "pulsar_dosa 4.07 / 3.19 |" in e2e.render_generate(
        {"device": "d", "versions": {}, "new_tokens": 16, "rows": [{**row, "decode_device_ms": None}]})
