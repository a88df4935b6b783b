"""The distributed driver (gloo, 2 and 3 CPU processes) gives the single-process tokens and kept KV;
ranks given different or bad arguments all raise a clear error instead of failing in a collective."""
import datetime
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

from runtime.distributed import encode_rank_context, generate_distributed, rank_blocks, restrict_layout
from runtime.pulsar import PulsarConfig, encode_context, generate
from runtime.summaries import num_blocks

CONTEXT_LENGTH = 100
CONFIGS = {
    "pulsar": PulsarConfig(32, sink=4, chunk=4, ratio=0.25),
    "pulsar_contiguous": PulsarConfig(32, sink=4, chunk=4, ratio=0.25, positions="contiguous"),
    "star": PulsarConfig(32, mode="star"),
    "pulsar_five_blocks": PulsarConfig(20, sink=4, chunk=4, ratio=0.25),
}
NEW_TOKENS = 6


def tiny_llama(layers=2):
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def inputs():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 256, (CONTEXT_LENGTH,), generator=g), torch.randint(0, 256, (5,), generator=g)


def worker(rank, world_size, port, workdir):
    """One rank: for every configuration, its kept KV and the generated tokens (with 2 ranks, also
    the errors of ``mismatch_errors`` and a run after them), saved for the parent."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=120))
    try:
        model = tiny_llama()
        model.load_state_dict(torch.load(os.path.join(workdir, "model.pt")))
        context_ids, query_ids = inputs()
        results = {}
        for name, config in CONFIGS.items():
            kept, _, _ = encode_rank_context(model, context_ids, config)
            tokens = generate_distributed(model, context_ids, query_ids, config, max_new_tokens=NEW_TOKENS)
            results[name] = {"kept": kept, "tokens": tokens}
        if world_size == 2:
            results["mismatch_errors"] = mismatch_errors(rank, model, context_ids, query_ids)
            results["then_agreeing"] = generate_distributed(model, context_ids[None], query_ids, CONFIGS["pulsar"],
                                                            max_new_tokens=NEW_TOKENS,
                                                            stop_ids=iter([model.generation_config.eos_token_id]))
        torch.save(results, os.path.join(workdir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


MISMATCHES = {  # case -> (what rank 1 is given instead, the argument every rank's error must name)
    "context": (lambda ids, query: dict(context_ids=ids.flip(0)), "context_ids differ"),
    "query": (lambda ids, query: dict(query_ids=query[:-1]), "query_ids differ"),
    "config": (lambda ids, query: dict(config=CONFIGS["star"]), "config differ"),
    "max_new_tokens": (lambda ids, query: dict(max_new_tokens=3), "max_new_tokens differ"),
    "stop_ids": (lambda ids, query: dict(stop_ids=[7]), "stop_ids differ"),
    "model": (lambda ids, query: dict(model=tiny_llama(layers=1)), "model differ"),
    "bad_ids": (lambda ids, query: dict(context_ids=ids + 256), "context_ids holds token id"),
}


def mismatch_errors(rank, model, context_ids, query_ids):
    """Every case of MISMATCHES (rank 1 given other arguments): the message each call raised here."""
    errors = {}
    for case, (change, _) in MISMATCHES.items():
        args = dict(model=model, context_ids=context_ids, query_ids=query_ids, config=CONFIGS["pulsar"],
                    max_new_tokens=2, stop_ids=())
        if rank == 1:
            args.update(change(context_ids, query_ids))
        try:
            generate_distributed(args.pop("model"), args.pop("context_ids"), args.pop("query_ids"),
                                 args.pop("config"), **args)
            errors[case] = None
        except (TypeError, ValueError) as error:
            errors[case] = str(error)
    return errors


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    torch.manual_seed(0)
    model = tiny_llama()
    workdir = tmp_path_factory.mktemp("pulsar_distributed")
    torch.save(model.state_dict(), workdir / "model.pt")
    context_ids, query_ids = inputs()
    truth = {}
    for name, config in CONFIGS.items():
        truth[name] = {"kept": encode_context(model, context_ids, config.layout(context_ids)),
                       "tokens": generate(model, context_ids, query_ids, config, max_new_tokens=NEW_TOKENS)}
    return model, workdir, truth


@pytest.fixture(scope="module")
def spawned(single_process):
    """``spawned(world_size)``: every rank's saved results of one gloo run of ``worker`` (cached)."""
    _, workdir, _ = single_process
    runs = {}

    def run(world_size):
        if world_size not in runs:
            mp.spawn(worker, args=(world_size, free_port(), str(workdir)), nprocs=world_size, join=True)
            runs[world_size] = [torch.load(workdir / f"rank{r}.pt") for r in range(world_size)]
        return runs[world_size]
    return run


@pytest.mark.parametrize("world_size", [2, 3])
def test_gloo_ranks_give_the_single_process_tokens_and_kept_kv(single_process, spawned, world_size):
    _, _, truth = single_process
    ranks = spawned(world_size)
    for name in CONFIGS:
        for rank in ranks:
            assert torch.equal(rank[name]["tokens"], truth[name]["tokens"]), name
        for layer, (keys, values) in enumerate(truth[name]["kept"]):
            torch.testing.assert_close(torch.cat([r[name]["kept"][layer][0] for r in ranks], 2), keys,
                                       atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(torch.cat([r[name]["kept"][layer][1] for r in ranks], 2), values,
                                       atol=1e-5, rtol=1e-5)


def test_ranks_given_different_or_bad_arguments_all_raise_before_any_model_work(single_process, spawned):
    _, _, truth = single_process
    ranks = spawned(2)
    for case, (_, message) in MISMATCHES.items():
        for rank, results in enumerate(ranks):
            error = results["mismatch_errors"][case]
            assert error is not None and message in error, (case, rank, error)
    assert "bad arguments on rank(s) 1: ValueError: context_ids holds token id" in ranks[0]["mismatch_errors"]["bad_ids"]
    assert "context_ids differ (context_ids: ranks [0], ranks [1])" in ranks[0]["mismatch_errors"]["context"]
    for results in ranks:  # the ranks still work together afterwards ([1, L] ids, an iterator of the eos id)
        assert torch.equal(results["then_agreeing"], truth["pulsar"]["tokens"])


def test_blocks_are_dealt_in_contiguous_balanced_runs():
    assert [rank_blocks(5, 3, r) for r in range(3)] == [range(0, 2), range(2, 4), range(4, 5)]
    assert [rank_blocks(4, 4, r) for r in range(4)] == [range(r, r + 1) for r in range(4)]
    with pytest.raises(ValueError, match="world_size"):
        rank_blocks(2, 3, 0)


def test_restricted_layout_keeps_exactly_its_blocks_and_their_visible_keys(single_process):
    model, _, truth = single_process
    context_ids, _ = inputs()
    config = CONFIGS["pulsar"]
    layout = config.layout(context_ids)
    blocks = range(2, 4)
    local = restrict_layout(layout, blocks)
    assert torch.equal(local.source_index[local.keep], torch.arange(64, CONTEXT_LENGTH))
    assert local.source_index.numel() < layout.source_index.numel()
    kept = encode_context(model, context_ids, local)
    for (keys, values), (want_keys, want_values) in zip(kept, truth["pulsar"]["kept"]):
        torch.testing.assert_close(keys, want_keys[:, :, 64:], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(values, want_values[:, :, 64:], atol=1e-5, rtol=1e-5)
    whole = restrict_layout(layout, range(num_blocks(CONTEXT_LENGTH, 32)))
    for field in ("source_index", "position_ids", "keep", "segment_start", "prefix_end", "cu_seqlens"):
        assert torch.equal(getattr(whole, field), getattr(layout, field)), field


def test_a_group_that_is_not_an_initialised_process_group_is_named_before_any_model_work(tmp_path):
    model, (context_ids, query_ids) = tiny_llama(), inputs()
    forwards = []
    hook = model.register_forward_pre_hook(lambda module, args: forwards.append(module))
    try:
        with pytest.raises(ValueError, match="group: expected an initialised torch.distributed process group"):
            generate_distributed(model, context_ids, query_ids, CONFIGS["star"], max_new_tokens=1)
        with pytest.raises(TypeError, match="group: expected a torch.distributed ProcessGroup or None"):
            generate_distributed(model, context_ids, query_ids, CONFIGS["star"], max_new_tokens=1, group="x")
        assert forwards == []
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        try:
            with pytest.raises(TypeError, match="group: expected a torch.distributed ProcessGroup or None"):
                generate_distributed(model, context_ids, query_ids, CONFIGS["star"], max_new_tokens=1, group="x")
            assert forwards == []
            assert torch.equal(generate_distributed(model, context_ids, query_ids, CONFIGS["star"], max_new_tokens=2),
                               generate(model, context_ids, query_ids, CONFIGS["star"], max_new_tokens=2))
        finally:
            dist.destroy_process_group()
    finally:
        hook.remove()
