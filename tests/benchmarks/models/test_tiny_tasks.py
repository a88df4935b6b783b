"""benchmarks/models/tiny_tasks.py: task formats, planting inside blocks, training sequences."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

MODELS = Path(__file__).resolve().parents[3] / "benchmarks" / "models"
sys.path.insert(0, str(MODELS))
import tiny_tasks  # noqa: E402
from tiny_tasks import Composition, TaskTokens, answer_hits, plant, sample_tasks, task_sequence  # noqa: E402


@pytest.fixture(scope="module")
def encoder():
    from transformers import AutoTokenizer

    return TaskTokens(AutoTokenizer.from_pretrained(MODELS / "tokenizer"))


@pytest.fixture(scope="module")
def tokens():
    return np.load(MODELS / "heldout_tokens.npy")


def test_sampled_tasks_have_distinct_subjects_and_answers_that_follow_from_their_lines():
    tasks = sample_tasks(np.random.default_rng(3), Composition(single=4, two_hop=4, count=3))
    assert [t.kind for t in tasks] == ["single"] * 4 + ["two_hop"] * 4 + ["count"] * 3
    subjects = [t.question.split()[1 if t.kind == "two_hop" else 2] for t in tasks]
    assert len(set(subjects)) == len(subjects)
    rooms = [line.split()[-1] for t in tasks if t.kind == "two_hop" for line in t.lines if " is in room " in line]
    counted = [t.question.split()[2] for t in tasks if t.kind == "count"]
    assert len(set(rooms + counted)) == len(rooms) + len(counted)
    for task in tasks:
        if task.kind == "single":
            assert task.lines == (f"\n# fact {task.question.split()[2]} = {task.answer.strip()}\n",)
        elif task.kind == "two_hop":
            link = next(line for line in task.lines if " is in room " in line)
            code = next(line for line in task.lines if " code = " in line)
            assert link.split()[1] == task.question.split()[1]
            assert code.split()[2] == link.split()[-1] and code.split()[-1] == task.answer.strip()
        else:
            assert 1 <= len(task.lines) <= tiny_tasks.MAX_COUNT and task.answer == f" {len(task.lines)}"
            assert set(task.lines) == {f"\n# seen {task.question.split()[2]}\n"}


def test_sampling_is_deterministic_from_the_generator():
    a = sample_tasks(np.random.default_rng(7), Composition(2, 2, 2))
    b = sample_tasks(np.random.default_rng(7), Composition(2, 2, 2))
    c = sample_tasks(np.random.default_rng(8), Composition(2, 2, 2))
    assert a == b and a != c


def test_questions_and_answers_split_at_the_answer(encoder):
    for task in sample_tasks(np.random.default_rng(0), Composition(1, 1, 1)):
        query, answer = encoder.question(task)
        assert query + answer == encoder.encode(task.question + task.answer)
        assert len(answer) == (2 if task.kind == "count" else tiny_tasks.ANSWER_TOKENS)


def test_plant_puts_every_line_whole_in_its_block_and_a_tasks_lines_in_distinct_blocks(encoder, tokens):
    rng = np.random.default_rng(1)
    tasks = sample_tasks(rng, Composition(3, 3, 2))
    lines = [encoder.lines(t) for t in tasks]
    ids, starts = plant(rng, tokens, 4000, 1000, lines)
    assert ids.shape == (4000,) and ids.dtype == torch.int64
    covered = np.zeros(4000, dtype=int)
    for task_lines, task_starts in zip(lines, starts):
        blocks = [s // 1000 for s in task_starts]
        assert len(set(blocks)) == min(len(task_lines), 4)
        for line, at in zip(task_lines, task_starts):
            assert ids[at:at + len(line)].tolist() == line
            assert at // 1000 == (at + len(line) - 1) // 1000
            covered[at:at + len(line)] += 1
    assert covered.max() == 1
    hay = ids[torch.from_numpy(covered == 0)].numpy()  # the rest: one run of corpus tokens, in order
    candidates = np.flatnonzero(tokens[:tokens.size - hay.size + 1] == hay[0])
    assert any(np.array_equal(tokens[c:c + hay.size], hay) for c in candidates)


def test_plant_refuses_a_line_longer_than_a_block(encoder, tokens):
    tasks = sample_tasks(np.random.default_rng(2), Composition(1, 0, 0))
    with pytest.raises(ValueError, match="does not fit"):
        plant(np.random.default_rng(2), tokens, 40, 10, [encoder.lines(t) for t in tasks])


def test_a_training_sequence_ends_with_every_question_and_its_answer(encoder, tokens):
    seq = task_sequence(np.random.default_rng(5), tokens, 2048, 512, Composition(2, 2, 2), encoder)
    assert seq.ids.shape == (2048,) and seq.kinds.tolist() == [0, 0, 1, 1, 2, 2]
    for task, positions in zip(seq.tasks, seq.answers):
        got = seq.ids[positions[positions >= 0]].tolist()
        query, answer = encoder.question(task)
        assert got == answer
        start = int(positions[0]) - len(query)
        assert seq.ids[start:start + len(query)].tolist() == query
    assert int(seq.answers.max()) == 2047
    perfect = seq.ids.roll(-1)[None]  # predicted[p] = ids[p + 1]: every answer right
    assert answer_hits(perfect, seq.ids[None], seq.answers[None]).all()
    wrong = perfect.clone()
    wrong[0, int(seq.answers[3, 1]) - 1] += 1
    assert answer_hits(wrong, seq.ids[None], seq.answers[None]).tolist() == [[True, True, True, False, True, True]]
