"""benchmarks/models/train_long_context.py on the CPU at a smoke size (1 step a phase, lengths
/128, batch 1): a run split by --max-phases resumes to the same weights as one run straight through, the
checkpoint loads with from_pretrained under the raised RoPE base, with its config and log; a
deadline pauses before a phase; a finished run is left alone; other settings are refused."""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

MODELS = Path(__file__).resolve().parents[3] / "benchmarks" / "models"
sys.path.insert(0, str(MODELS))
import train_long_context as stage  # noqa: E402

SMOKE = ["--steps", "1", "1", "1", "1", "1", "--scale", "128", "--log-every", "1", "--device", "cpu"]


@pytest.fixture(autouse=True)
def batch_of_one(monkeypatch):
    monkeypatch.setattr(stage, "PHASES", tuple((name, length, 1, lr) for name, length, _, lr in stage.PHASES))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    shutil.copy(MODELS / "heldout_tokens.npy", folder / "train.npy")
    (folder / "manifest.json").write_text(json.dumps({"train": {"tokens": 1}}))
    return folder


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def log_records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "train_log_part4.jsonl").read_text().splitlines()]


def test_a_split_run_resumes_to_the_weights_of_one_run_and_saves_a_loadable_checkpoint(tmp_path, corpus):
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert stage.main(SMOKE + ["--corpus", str(corpus), "--out", str(whole)]) == 0
    assert stage.main(SMOKE + ["--corpus", str(corpus), "--out", str(split), "--max-phases", "2"]) == stage.EXIT_PHASES_LEFT
    progress = json.loads((split / "train_progress_part4.json").read_text())
    assert [d["phase"] for d in progress["done"]] == ["long_4k", "long_16k"]
    assert not (split / "train_config_part4.json").exists()
    with pytest.raises(SystemExit, match="other settings"):
        stage.main(SMOKE + ["--corpus", str(corpus), "--out", str(split), "--seed", "1"])
    assert stage.main(SMOKE + ["--corpus", str(corpus), "--out", str(split)]) == 0
    a, b, init = weights(whole), weights(split), weights(MODELS / "tiny-llama")
    assert a.keys() == b.keys() == init.keys()
    assert all((a[k] == b[k]).all() for k in a)
    assert any((a[k] != init[k]).any() for k in a)  # it trained
    records = log_records(split)
    assert [r["paused_before"] for r in records if "paused_before" in r] == ["long_32k"]
    assert [r["resumed_after"] for r in records if "resumed_after" in r] == [[], ["long_4k", "long_16k"]]
    assert not (split / "train_progress_part4.json").exists()
    config = json.loads((split / "train_config_part4.json").read_text())
    assert config["steps"] == [1] * 5 and config["rope_theta"] == stage.ROPE_THETA
    assert {"train_config_part1.json", "train_config_part2.json", "train_log_part1.jsonl"} <= {p.name for p in split.iterdir()}
    assert sum(p.stat().st_size for p in split.iterdir()) <= 24 * 2 ** 20
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    model = AutoModelForCausalLM.from_pretrained(split)
    assert isinstance(model, LlamaForCausalLM)
    assert model.config.rope_parameters["rope_theta"] == stage.ROPE_THETA
    assert stage.main(SMOKE + ["--corpus", str(corpus), "--out", str(split)]) == 0  # done: nothing to run
    assert len(log_records(split)) == len(records)


def test_a_deadline_pauses_before_a_phase_that_could_end_after_it(tmp_path, corpus):
    out = tmp_path / "late"
    args = ["--corpus", str(corpus), "--out", str(out), "--scale", "128", "--device", "cpu",
            "--budget-s", "60", "60", "60", "60", "60", "--deadline-s", "50"]
    assert stage.main(args) == stage.EXIT_PHASES_LEFT
    assert [r.get("paused_before") for r in log_records(out)][-1] == "long_4k"
    assert json.loads((out / "train_progress_part4.json").read_text())["done"] == []


def test_answer_loss_reads_the_logits_before_each_answer_token_and_weighs_tasks_alike():
    import torch

    ids = torch.tensor([[5, 6, 7, 8, 9]])
    answers = torch.tensor([[[2, 3], [4, -1]]])  # a task of two tokens, one of one
    logits = torch.full((1, 5, 10), -30.0)
    logits[0, 1, 7] = logits[0, 2, 8] = logits[0, 3, 9] = 30.0
    assert stage.answer_loss(logits, ids, answers).item() == pytest.approx(0.0, abs=1e-6)
    logits[0, 2, 8], logits[0, 2, 0] = -30.0, 30.0  # the first task's second token now costs 60 nats
    assert stage.answer_loss(logits, ids, answers).item() == pytest.approx((60 / 2 + 0) / 2, abs=1e-4)
    logits[0, 3, 9], logits[0, 3, 0] = -30.0, 30.0  # and the second task's only token
    assert stage.answer_loss(logits, ids, answers).item() == pytest.approx((60 / 2 + 60) / 2, abs=1e-4)
