"""benchmarks/pulsar_accuracy.py --smoke (the committed Llama model on the CPU, rounds of one
trial): every cell with its trials and Wilson interval, the per-block cost of every configuration, the JSON, tables and
plot; one phase 1 serving several queries decodes what generate gives for each alone."""
import json

import pytest
import torch

from benchmarks import pulsar_accuracy as pa
from benchmarks.phase1_flops import DecoderShape
from runtime.pulsar import PulsarConfig, generate


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("accuracy") / "smoke.json"
    pa.main(["--smoke", "--lengths", "256", "--heuristics", "novelty", "--blocks", "2", "--round", "1", "--out", str(out)])
    return out, json.loads(out.read_text())


def test_every_cell_holds_every_trial_with_its_interval(run):
    _, result = run
    assert result["lengths"] == [256] and result["blocks"] == [2]
    modes = [("dense", None, None), ("star", None, 2), ("pulsar", "novelty", 2)]
    want = {(m, h, length, b, kind) for m, h, b in modes for length in (256,) for kind in ("single", "two_hop", "count")}
    got = {(c["mode"], c["heuristic"], c["length"], c["blocks"], c["kind"]): c for c in result["cells"]}
    assert set(got) == want
    for cell in got.values():
        assert cell["trials"] == 2 and len(cell["outcomes"]) == 2 and cell["correct"] == cell["outcomes"].count("1")
        low, high = cell["wilson_95"]
        assert 0 <= low <= cell["accuracy"] <= high <= 1 and high - low > 0.3  # 2 trials: a wide interval
    assert [r["trials"] for r in result["rounds"]] == [[0], [1]] and "stopped" not in result


def test_the_cost_rows_count_each_hosts_input(run):
    _, result = run
    from transformers import AutoConfig

    shape = DecoderShape.from_config(AutoConfig.from_pretrained(pa.ROOT / "benchmarks" / "models" / "tiny-llama"))
    cost = {(c["mode"], c["heuristic"], c["length"]): c for c in result["cost"]}
    assert len(cost) == 3
    for length in (256,):
        block = length // 2
        assert cost[("dense", None, length)]["tokens_per_block"] == [length]
        assert cost[("star", None, length)]["tokens_per_block"] == [block, 2 * block]
        pulsar = cost[("pulsar", "novelty", length)]["tokens_per_block"]
        assert pulsar[0] == block and block < pulsar[1] < 2 * block
        for c in (cost[(m, h, length)] for m, h in (("star", None), ("pulsar", "novelty"))):
            assert c["flops_per_block"] == [shape.causal_input_flops(n) for n in c["tokens_per_block"]]
            assert all(ms > 0 for ms in c["ms_per_block"]) and c["max_flops"] == max(c["flops_per_block"])
        assert cost[("star", None, length)]["max_flops"] > cost[("pulsar", "novelty", length)]["max_flops"]


def test_the_report_has_a_table_per_kind_the_cost_table_and_the_plot(run):
    out, _ = run
    md = out.with_suffix(".md").read_text()
    for heading in ("### single", "### two_hop", "### count", "## Phase 1 per block"):
        assert heading in md
    assert "| 256 | 2 |" in md and "pulsar:novelty" in md
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_phase_one_serves_each_query_as_generate_does_alone():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(pa.ROOT / "benchmarks" / "models" / "tiny-llama",
                                                 dtype=torch.float32).eval()
    encoder = pa.tokenizer_encoder(pa.ROOT / "benchmarks" / "models" / "tiny-llama")
    trial = pa.make_trial(pa.load_tokens(pa.HELDOUT), encoder, 256, 2, 1)
    config = PulsarConfig(block_size=128, mode="pulsar", sink=16, chunk=8)
    shared = pa.decoded(model, trial, config, torch.device("cpu"))
    alone = [generate(model, trial.context_ids, x.query_ids, config, max_new_tokens=x.answer_ids.numel(), stop_ids=())
             for x in trial.instances]
    assert [t.tolist() for t in shared] == [t.tolist() for t in alone]
    assert [len(t) for t in shared] == [6, 6, 2]
