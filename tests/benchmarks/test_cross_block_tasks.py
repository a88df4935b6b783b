"""benchmarks/cross_block_tasks.py: trials from held-out text, deterministic, each instance's lines
in the context and in distinct blocks, its answer implied by them, and the files the CLI writes."""
import json

import numpy as np
import pytest
import torch

from benchmarks import cross_block_tasks as cbt

LENGTH, BLOCKS = 4096, 4


@pytest.fixture(scope="module")
def encoder():
    return cbt.tokenizer_encoder(cbt.MODELS / "tokenizer")


@pytest.fixture(scope="module")
def tokens():
    return cbt.load_tokens(cbt.HELDOUT)


def occurrences(ids: list[int], line: list[int]) -> int:
    return sum(ids[i:i + len(line)] == line for i in range(len(ids) - len(line) + 1))


def test_trials_are_deterministic_from_seed_length_and_index(encoder, tokens):
    a, b = (cbt.make_trial(tokens, encoder, LENGTH, BLOCKS, 3, seed=1) for _ in range(2))
    assert torch.equal(a.context_ids, b.context_ids)
    assert [(x.prompt, x.answer, x.line_starts) for x in a.instances] == \
        [(x.prompt, x.answer, x.line_starts) for x in b.instances]
    other = cbt.make_trial(tokens, encoder, LENGTH, BLOCKS, 4, seed=1)
    reseeded = cbt.make_trial(tokens, encoder, LENGTH, BLOCKS, 3, seed=2)
    assert not torch.equal(a.context_ids, other.context_ids) and not torch.equal(a.context_ids, reseeded.context_ids)


@pytest.mark.parametrize("index", range(4))
def test_each_instance_needs_lines_in_distinct_blocks_that_imply_its_answer(encoder, tokens, index):
    trial = cbt.make_trial(tokens, encoder, LENGTH, BLOCKS, index)
    context = trial.context_ids.tolist()
    assert len(context) == LENGTH and [x.kind for x in trial.instances] == ["single", "two_hop", "count"]
    for x in trial.instances:
        assert x.query_ids.tolist() == encoder.encode(x.prompt)
        assert x.answer_ids.tolist() == encoder.encode(x.prompt + x.answer)[x.query_ids.numel():]
        assert x.line_blocks == tuple(s // (LENGTH // BLOCKS) for s in x.line_starts)
        question = x.prompt.split("\n")[-1]
        if x.kind == "single":
            line = encoder.encode(f"\n{question}{x.answer}\n")
            assert context[x.line_starts[0]:x.line_starts[0] + len(line)] == line
        elif x.kind == "two_hop":
            assert len(set(x.line_blocks)) == 2
            name = question.split()[1]
            room = next(w for w in ("\n" + encoder.tokenizer.decode(context)).split("\n")
                        if w.startswith(f"# {name} is in room ")).split()[-1]
            code = encoder.encode(f"\n# room {room} code ={x.answer}\n")
            assert code in [context[s:s + len(code)] for s in x.line_starts]
        else:
            word = question.split()[2]
            assert occurrences(context, encoder.encode(f"\n# seen {word}\n")) == int(x.answer) == len(x.line_starts)
            assert len(set(x.line_blocks)) == min(BLOCKS, int(x.answer))
    # every block count that divides the placement's blocks keeps a two-hop's lines apart
    hop = trial.instances[1]
    for finer in (8, 16):
        assert len({s // (LENGTH // finer) for s in hop.line_starts}) == 2


def test_the_primer_is_planted_and_answered_in_the_query(encoder, tokens):
    trial = cbt.make_trial(tokens, encoder, LENGTH, BLOCKS, 0)
    primer = trial.instances[0].prompt.split("\n")[1]  # "# fact <name> = <value>"
    assert occurrences(trial.context_ids.tolist(), encoder.encode(f"\n{primer}\n")) == 1
    assert all(x.prompt.split("\n")[1] == primer for x in trial.instances)


def test_a_length_that_the_blocks_do_not_divide_is_refused(encoder, tokens):
    with pytest.raises(ValueError, match="multiple"):
        cbt.make_trial(tokens, encoder, 4097, 4, 0)


def test_the_script_writes_contexts_and_instances(tmp_path, encoder, tokens):
    cbt.main(["--length", "2048", "--blocks", "2", "--trials", "2", "--first", "5", "--seed", "3",
              "--out", str(tmp_path)])
    contexts = np.load(tmp_path / "contexts.npy")
    doc = json.loads((tmp_path / "instances.json").read_text())
    assert contexts.shape == (2, 2048) and contexts.dtype == np.uint16
    assert doc["length"] == 2048 and len(doc["instances"]) == 6 and doc["tokens_sha256"]
    trial = cbt.make_trial(tokens, encoder, 2048, 2, 6, seed=3)
    assert np.array_equal(contexts[1], trial.context_ids.numpy())
    assert doc["instances"][3]["trial"] == 6 and doc["instances"][3]["answer_ids"] == trial.instances[0].answer_ids.tolist()
