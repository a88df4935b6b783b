"""The plan CLI end to end on a tiny random-init DeepseekV32ForCausalLM, and the plan applied to it."""
import json

import pytest
import torch
from transformers import LlamaConfig

from compiler.cost_model import CPU_REFERENCE, H200_FITTED, IndexerShape, crossover_length
from compiler.plan.cli import layer_candidates, main, parse_args
from compiler.plan.schema import PLAN_VERSION, load_plan
from compiler.report import collecting
from compiler.topk_settings import TopkSettings

LAYERS = ["model.layers.0.self_attn.indexer", "model.layers.1.self_attn.indexer"]
TOKENS = 620  # more than topk + sink + window (16 + 64 + 512) keys, so the certificate screens keys


def tiny_config():
    from transformers import DeepseekV32Config

    return DeepseekV32Config(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                             n_routed_experts=2, kv_lora_rank=8, q_lora_rank=16, qk_rope_head_dim=8,
                             v_head_dim=8, qk_nope_head_dim=8, n_group=1, topk_group=1, num_experts_per_tok=1,
                             first_k_dense_replace=1, index_topk=16, index_head_dim=16, index_n_heads=32,
                             max_position_embeddings=1024)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    tiny_config().save_pretrained(root / "model")
    ids = torch.randint(0, 128, (TOKENS,), generator=torch.Generator().manual_seed(0))
    (root / "ids.txt").write_text(" ".join(str(int(i)) for i in ids))
    args = ["--model", str(root / "model"), "--tokens", str(root / "ids.txt"), "--out", str(root / "plan.json"),
            "--candidates", "4,8", "--constants", "h200", "--seed", "1", "--plot", str(root / "plan.png")]
    assert main(args) == 0
    return root


def test_plan_has_one_entry_per_indexer_layer_with_measurements_and_inputs(generated):
    plan = load_plan(generated / "plan.json")
    assert plan.version == PLAN_VERSION
    assert [e.layer for e in plan.layers] == LAYERS
    for e in plan.layers:
        assert (e.heads, e.head_dim, e.topk) == (32, 16, 16)
        assert [(c.r, c.witnesses) for c in e.candidates[:2]] == [(4, None), (8, None)]
        best = min(e.candidates[:2], key=lambda c: (c.survival if c.ms is None else c.ms, c.r))
        assert [(c.r, c.list_queries, c.witnesses) for c in e.candidates[2:]] == [(best.r, None, False),
                                                                                 (best.r, None, True)]
        assert all(c.queries == TOKENS and c.keys_screened > 0 for c in e.candidates)
        assert e.seed_gap.count > 0 and e.seed_gap.min >= 0
        assert e.slack.count > 0 and e.slack.min >= 0
    assert plan.inputs["tokens"] == TOKENS and plan.inputs["sequences"] == 1
    assert plan.model["weights"] == "random init, seed 1"


def test_random_init_indexers_prune_too_little_at_small_budgets_so_every_layer_is_planned_dense(generated):
    plan = load_plan(generated / "plan.json")
    assert plan.constants == H200_FITTED
    for e in plan.layers:
        shape = IndexerShape(heads=e.heads, head_dim=e.head_dim, topk=e.topk)
        assert all(c.survival > 0.5 for c in e.candidates)  # fewer than half the screened keys pruned
        assert all(crossover_length(c.r, c.survival, shape, plan.constants) is None for c in e.candidates)
        assert (e.settings, e.predicted_speedup) == (TopkSettings("dense"), 1.0)


def test_plot_is_a_png(generated):
    assert (generated / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_generated_plan_is_applied_and_reported_per_layer(generated):
    from transformers import DeepseekV32ForCausalLM

    torch.manual_seed(1)
    model = DeepseekV32ForCausalLM(tiny_config()).eval()
    torch._dynamo.reset()
    with collecting() as report, torch.no_grad():
        compiled = torch.compile(model, backend="pulsar_dosa",
                                 options={"plan": str(generated / "plan.json"), "downstream": "eager", "stock_below": 0})
        compiled(torch.randint(0, 128, (1, 24)))
    torch._dynamo.reset()
    assert sorted((rw.module, rw.path, rw.r) for rw in report.rewrites if rw.kind == "dsa_indexer") == \
        [(n, "dense", None) for n in LAYERS]


def test_a_plan_whose_layers_do_not_match_the_model_is_rejected(generated, tmp_path):
    from transformers import DeepseekV32ForCausalLM

    data = json.loads((generated / "plan.json").read_text())
    data["layers"][1]["layer"] = "model.layers.7.self_attn.indexer"
    (tmp_path / "other.json").write_text(json.dumps(data))
    model = DeepseekV32ForCausalLM(tiny_config()).eval()
    torch._dynamo.reset()
    with pytest.raises(Exception, match="plan has no layer 'model.layers.1.self_attn.indexer'"), torch.no_grad():
        torch.compile(model, backend="pulsar_dosa",
                      options={"plan": str(tmp_path / "other.json"), "downstream": "eager"})(
            torch.randint(0, 128, (1, 24)))
    torch._dynamo.reset()


def test_a_model_without_an_indexer_is_rejected(tmp_path):
    (tmp_path / "ids.txt").write_text("1 2 3 4")
    with pytest.raises(ValueError, match="has no DSA indexer"):
        main(["--model", "torch.nn:Identity", "--tokens", str(tmp_path / "ids.txt"),
              "--out", str(tmp_path / "plan.json")])
    assert not (tmp_path / "plan.json").exists()


def usage_error(capsys, argv):
    """main(argv)'s exit code and the last line of what it wrote to stderr."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err.strip().splitlines()[-1]


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    """A tiny model directory (a config.json, vocabulary 128) and token ids; loading or building a
    model fails the test: every check below must come first."""
    import compiler.plan.inputs as inputs

    tiny_config().save_pretrained(tmp_path / "model")
    (tmp_path / "ids.txt").write_text("1 2 3 4 5 6 7 8")

    def no_model_work(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(inputs, "load_model", no_model_work)
    return tmp_path


BAD_FLAGS = [
    (["--out", "{d}/missing/plan.json"], "--out: directory {d}/missing does not exist"),
    (["--out", "{d}"], "--out: {d} is a directory"),
    (["--plot", "{d}/missing/plan.png"], "--plot: directory {d}/missing does not exist"),
    (["--design-length", "0"], "argument --design-length: expected an int >= 1, got '0'"),
    (["--queries", "-1"], "argument --queries: expected an int >= 1, got '-1'"),
    (["--queries", "200000"], "--queries: expected at most --design-length (131072) queries, got 200000"),
    (["--seq-len", "0"], "argument --seq-len: expected an int >= 1, got '0'"),
    (["--batch-size", "x"], "argument --batch-size: expected an int >= 1, got 'x'"),
    (["--seed", "-1"], "argument --seed: expected an int in [0, 2^63), got '-1'"),
    (["--candidates", "0,4"], "--candidates: expected budgets >= 1, got '0,4'"),
    (["--candidates", "4,x"], "--candidates: expected comma-separated ints or 'all', got '4,x'"),
    (["--device", "cuda:99"], "--device: cuda:99 is not available"),
    (["--device", "meta"], "--device: expected cpu or an available cuda device, got 'meta'"),
    (["--device", "gpu0"], "--device: expected cpu or an available cuda device, got 'gpu0'"),
    (["--constants", "{d}/corrupt.json"], "--constants: cannot read KernelConstants from {d}/corrupt.json"),
    (["--constants", "{d}/none.json"], "--constants: expected 'cpu', 'h200', 'measure' or a JSON file"),
    (["--tokens", "{d}/big.txt"], "--tokens: token id 128 is outside the model's vocabulary of 128 ids"),
    (["--tokens", "{d}/none.txt"], "--tokens: no file {d}/none.txt"),
    (["--model", "{d}/none"], "--model: model '{d}/none': expected a transformers model directory, a config.json"),
    (["--model", "{d}/corrupt.json"], "--model: model '{d}/corrupt.json': cannot read a transformers configuration"),
    (["--model", "{d}"], "--model: model '{d}': directory has no config.json"),
    (["--model", "no_such_module_xyz:make"], "--model: model 'no_such_module_xyz:make': cannot import the factory"),
    (["--model", "{d}/llama/config.json"], "--model: {d}/llama/config.json configures no DSA indexer (model type "
                                           "'llama' has no index_n_heads)"),
    (["--candidates", "4,32"], "--candidates: expected budgets below the layer's 32 heads, got [4, 32]"),
]


@pytest.mark.parametrize("change,message", BAD_FLAGS)
def test_every_flag_is_checked_before_any_model_work_with_an_argparse_error(model_dir, capsys, change, message):
    d = str(model_dir)
    (model_dir / "corrupt.json").write_text('{"dense_macs_per_s": ')
    (model_dir / "big.txt").write_text("1 2 127 128")
    LlamaConfig(vocab_size=128, num_hidden_layers=1).save_pretrained(model_dir / "llama")
    argv = {"--model": f"{d}/model", "--tokens": f"{d}/ids.txt", "--out": f"{d}/plan.json"}
    argv.update(zip(change[::2], (c.format(d=d) for c in change[1::2])))
    code, last = usage_error(capsys, [x for kv in argv.items() for x in kv])
    assert code == 2 and message.format(d=d) in last
    assert not (model_dir / "plan.json").exists()


def test_structured_geometry_is_checked_as_a_flag(tmp_path, capsys):
    for spec, message in (("1,8,64", "--structured: expected six ints B,S,T,H,D,K, got '1,8,64'"),
                          ("1,8,64,4,8,0", "--structured: expected B,S,T,H,D,K >= 1"),
                          ("1,80,64,4,8,4", "--structured: expected S <= T, got S=80, T=64")):
        code, last = usage_error(capsys, ["--structured", spec, "--out", str(tmp_path / "p.json")])
        assert code == 2 and message in last


def test_layer_candidates_default_to_the_short_list_and_stay_below_the_head_count():
    assert layer_candidates([4, 12], 32, CPU_REFERENCE) == [4, 12]
    assert layer_candidates(None, 32, H200_FITTED) == [1, 3, 7, 15]
    assert layer_candidates(None, 4, H200_FITTED) == [1]
    assert layer_candidates("all", 32, H200_FITTED) == [1, 3, 7, 15, 31]
    with pytest.raises(ValueError, match="below the layer's 32 heads"):
        layer_candidates([4, 32], 32, CPU_REFERENCE)


STRUCTURED = ["--structured", "1,48,1200,16,16,64", "--candidates", "3,7", "--constants", "h200",
              "--design-length", "1048576"]


def test_a_layer_without_enough_evidence_is_planned_dense_and_the_cli_says_why(tmp_path, capsys):
    out = tmp_path / "structured.json"
    assert main([*STRUCTURED, "--out", str(out)]) == 0
    (entry,) = load_plan(out).layers
    assert entry.settings == TopkSettings("dense")
    assert entry.reason.startswith("not enough evidence")
    assert "structured: path=dense" in capsys.readouterr().err and "not enough evidence" in entry.reason


def test_structured_geometry_gets_a_certified_plan(tmp_path, monkeypatch):
    from compiler import defaults

    # 48 queries of 1200 keys are enough to certify once the evidence thresholds are lowered to them.
    monkeypatch.setattr(defaults, "MIN_SCREENED_KEYS", 20_000)
    monkeypatch.setattr(defaults, "MIN_CERTIFIED_QUERIES", 32)
    out = tmp_path / "structured.json"
    assert main([*STRUCTURED, "--out", str(out)]) == 0
    (entry,) = load_plan(out).layers
    assert entry.layer == "structured" and (entry.heads, entry.head_dim, entry.topk) == (16, 16, 64)
    assert entry.settings.path == "auto" and entry.settings.r in (3, 7) and entry.predicted_pruned_frac > 0.9
    assert all(c.ms is None for c in entry.candidates) and entry.dense_ms is None  # h200 constants on a CPU
    assert load_plan(out).inputs["parameters"]["T"] == 1200


def test_structured_and_model_inputs_are_exclusive(tmp_path):
    with pytest.raises(SystemExit):
        main(["--structured", "1,8,64,4,8,4", "--model", "x", "--out", str(tmp_path / "p.json")])
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "p.json")])


class _Embedder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 4)

    def get_input_embeddings(self):
        return self.embed


def small_vocabulary_model():
    """A factory model (module:function): its vocabulary is known only once it is built."""
    return _Embedder()


def test_a_factory_model_s_vocabulary_is_checked_once_built_before_any_capture(tmp_path, capsys):
    (tmp_path / "ids.txt").write_text("1 2 3 20")
    code, last = usage_error(capsys, ["--model", f"{__name__}:small_vocabulary_model", "--tokens",
                                      str(tmp_path / "ids.txt"), "--out", str(tmp_path / "plan.json")])
    assert code == 2 and "--tokens: token id 20 is outside the model's vocabulary of 16 ids" in last


def save_word_tokenizer(directory, words):
    """A word-level tokenizer of ``words`` (ids 1.., 0 unknown) saved in ``directory``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(directory)


def test_text_needs_a_readable_file_and_the_model_directory_s_tokenizer_before_any_model_work(model_dir, capsys):
    d = str(model_dir)
    (model_dir / "t.txt").write_text("a b c a")
    for model, text, message in ((f"{d}/model", f"{d}/none.txt", f"--text: no file {d}/none.txt"),
                                 (f"{d}/model", f"{d}/t.txt", f"--text: the model {d}/model has no tokenizer"),
                                 (f"{d}/model/config.json", f"{d}/t.txt",
                                  f"--text: the model {d}/model/config.json has no tokenizer")):
        code, last = usage_error(capsys, ["--model", model, "--text", text, "--out", f"{d}/plan.json"])
        assert code == 2 and message in last
    save_word_tokenizer(model_dir / "model", ["a", "b", "c"])
    args = parse_args(["--model", f"{d}/model", "--text", f"{d}/t.txt", "--out", f"{d}/plan.json"])
    assert args.token_ids.tolist() == [1, 2, 3, 1]  # tokenised while the flags are checked
