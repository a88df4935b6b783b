"""Tasks whose answers need lines planted across a long context: formats and planting.

Three kinds (``KINDS``), each a question asked after the context and the lines its answer needs:

* ``single``: ``# fact <name> = <5 digits>``, asked ``# fact <name> =`` (``tiny_data``'s FACT
  and QUERY, the format the measuring models were trained on);
* ``two_hop``: ``# <name> is in room <room>`` and ``# room <room> code = <5 digits>``, asked
  ``# <name> code =``: only the room joins the name to the code (BABILong's chained facts);
* ``count``: ``# seen <word>`` planted k times (1 <= k <= ``max_count``), asked
  ``# count <word> =``: the answer aggregates lines spread over the context.

The model continues a question with the answer (a space and 5 digits, or a space and one digit).
``sample_tasks`` draws tasks with distinct names, rooms and words (so no line answers another
task's question). ``plant`` writes lines whole inside blocks of ``block_size`` tokens of a context
window of corpus tokens: the lines of one task go to distinct blocks while there are enough blocks
(a two-hop task's two lines always sit in different blocks when the context has two or more), so
in a Pulsar or Star layout with that block size, or any size dividing it, no block holds a whole
two-hop chain or every line of a count. ``task_batch`` builds training sequences: a context with
planted tasks, then every question with its answer, in random order. Everything is deterministic
given the numpy generator passed in.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tiny_data import FACT, QUERY, VALUE_DIGITS, WORDS

KINDS = ("single", "two_hop", "count")
LINK = "\n# {name} is in room {room}\n"
CODE = "\n# room {room} code = {value}\n"
HOP_QUERY = "\n# {name} code ="
SEEN = "\n# seen {word}\n"
COUNT_QUERY = "\n# count {word} ="
MAX_COUNT = 5
ANSWER_TOKENS = 1 + VALUE_DIGITS
"""The longest answer in tokens (a space and 5 digits); count answers are a space and one digit."""
MIN_BLOCK = 256
"""The fewest tokens of a block that training spreads lines over."""


@dataclass(frozen=True)
class Task:
    """One question: its kind, the lines planted for it (in planting order), the question and the
    answer text (the model's continuation of the question)."""

    kind: str
    lines: tuple[str, ...]
    question: str
    answer: str


@dataclass(frozen=True)
class Composition:
    """How many tasks of each kind a context holds, and the largest count of a count task."""

    single: int = 1
    two_hop: int = 1
    count: int = 1
    max_count: int = MAX_COUNT

    def __post_init__(self) -> None:
        if min(self.single, self.two_hop, self.count) < 0 or self.single + self.two_hop + self.count == 0:
            raise ValueError(f"a composition needs non-negative task counts, not all zero: {self}")
        if not 1 <= self.max_count <= 9:
            raise ValueError(f"max_count must be in [1, 9] (a one-digit answer), got {self.max_count}")


def training_composition(length: int) -> Composition:
    """The tasks of one training sequence of ``length`` tokens: one of each kind per 2048 tokens,
    at most 6 singles, 5 two-hops and 4 counts, at least one of each."""
    return Composition(single=max(1, min(6, length // 2048)), two_hop=max(1, min(5, length // 2048)),
                       count=max(1, min(4, length // 2048)))


def _value(rng: np.random.Generator) -> str:
    return "".join(str(d) for d in rng.integers(0, 10, VALUE_DIGITS))


def sample_tasks(rng: np.random.Generator, composition: Composition) -> list[Task]:
    """Tasks of ``composition`` (singles, then two-hops, then counts) with distinct subjects: names
    are two words joined by ``_``, rooms and counted words single words, never the same word."""
    words = rng.permutation(len(WORDS))
    rooms_and_words = [WORDS[i] for i in words[:composition.two_hop + composition.count]]
    if len(rooms_and_words) < composition.two_hop + composition.count:
        raise ValueError(f"{composition} needs more distinct words than WORDS holds")
    names: list[str] = []
    while len(names) < composition.single + composition.two_hop:
        a, b = rng.choice(len(WORDS), 2, replace=False)
        name = f"{WORDS[a]}_{WORDS[b]}"
        if name not in names:
            names.append(name)
    tasks = []
    for name in names[:composition.single]:
        value = _value(rng)
        tasks.append(Task("single", (FACT.format(name=name, value=value),), QUERY.format(name=name), f" {value}"))
    for name, room in zip(names[composition.single:], rooms_and_words[:composition.two_hop]):
        value = _value(rng)
        lines = (LINK.format(name=name, room=room), CODE.format(room=room, value=value))
        tasks.append(Task("two_hop", lines if rng.random() < 0.5 else lines[::-1], HOP_QUERY.format(name=name),
                          f" {value}"))
    for word in rooms_and_words[composition.two_hop:]:
        k = int(rng.integers(1, composition.max_count + 1))
        tasks.append(Task("count", (SEEN.format(word=word),) * k, COUNT_QUERY.format(word=word), f" {k}"))
    return tasks


class TaskTokens:
    """Token ids of tasks under one tokenizer: lines, and (question, answer) split so that the
    question's ids followed by the answer's are the ids of the question's text followed by the
    answer's."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def lines(self, task: Task) -> list[list[int]]:
        return [self.encode(line) for line in task.lines]

    def question(self, task: Task) -> tuple[list[int], list[int]]:
        """(question ids, answer ids); ValueError if the tokenizer merges across their boundary."""
        query, full = self.encode(task.question), self.encode(task.question + task.answer)
        if full[:len(query)] != query:
            raise ValueError(f"the tokenizer merges {task.question!r} with its answer {task.answer!r}")
        return query, full[len(query):]


def _line_blocks(rng: np.random.Generator, lines: int, blocks: int) -> list[int]:
    """Blocks for a task's lines: distinct while there are enough, a random order of the blocks
    repeated otherwise."""
    order = rng.permutation(blocks)
    return [int(order[j % blocks]) for j in range(lines)]


def plant(rng: np.random.Generator, tokens: np.ndarray, context_length: int, block_size: int,
          line_ids: list[list[list[int]]], tries: int = 1000) -> tuple[torch.Tensor, list[list[int]]]:
    """A context of ``context_length`` ids: a window of ``tokens`` with every task's lines
    (``line_ids[task][line]``) planted whole inside one block of ``block_size`` tokens (the module
    docstring's rule), the rest corpus tokens in order. Returns the ids (int64) and, per task, the
    first position of each of its lines. ValueError when the lines do not fit."""
    blocks = -(-context_length // block_size)
    taken = np.zeros(context_length, dtype=bool)
    starts: list[list[int]] = []
    for task in line_ids:
        task_starts = []
        for ids, block in zip(task, _line_blocks(rng, len(task), blocks)):
            low, high = block * block_size, min((block + 1) * block_size, context_length) - len(ids)
            if high < low:
                raise ValueError(f"a line of {len(ids)} tokens does not fit in block {block} of a "
                                 f"{context_length}-token context in blocks of {block_size}")
            for _ in range(tries):
                at = int(rng.integers(low, high + 1))
                if not taken[at:at + len(ids)].any():
                    taken[at:at + len(ids)] = True
                    task_starts.append(at)
                    break
            else:
                raise ValueError(f"no room for a line of {len(ids)} tokens in block {block} of {block_size} tokens")
        starts.append(task_starts)
    hay = int((~taken).sum())
    first = int(rng.integers(0, tokens.size - hay))
    ids = np.empty(context_length, dtype=np.int64)
    ids[~taken] = tokens[first:first + hay]
    for task, task_starts in zip(line_ids, starts):
        for line, at in zip(task, task_starts):
            ids[at:at + len(line)] = line
    return torch.from_numpy(ids), starts


@dataclass
class TaskSequence:
    """A training sequence: ``ids`` [L]; per task (in ``tasks`` order) its kind index into
    ``KINDS`` and the positions of its answer tokens, -1 padded to ``ANSWER_TOKENS``."""

    ids: torch.Tensor
    kinds: torch.Tensor
    answers: torch.Tensor
    tasks: list[Task]


def task_sequence(rng: np.random.Generator, tokens: np.ndarray, length: int, block_size: int,
                  composition: Composition, encoder: TaskTokens) -> TaskSequence:
    """``length`` ids: a context with ``composition``'s tasks planted (``plant``), then every
    question followed by its answer, in random order."""
    tasks = sample_tasks(rng, composition)
    questions = [encoder.question(task) for task in tasks]
    order = [int(i) for i in rng.permutation(len(tasks))]
    context = length - sum(len(q) + len(a) for q, a in questions)
    if context <= 0:
        raise ValueError(f"length {length} cannot hold the questions of {composition}")
    ids, _ = plant(rng, tokens, context, block_size, [encoder.lines(task) for task in tasks])
    pieces, at = [ids], context
    answers = torch.full((len(tasks), ANSWER_TOKENS), -1, dtype=torch.int64)
    for i in order:
        query, answer = questions[i]
        answers[i, :len(answer)] = torch.arange(at + len(query), at + len(query) + len(answer))
        pieces.append(torch.tensor(query + answer, dtype=torch.int64))
        at += len(query) + len(answer)
    kinds = torch.tensor([KINDS.index(task.kind) for task in tasks], dtype=torch.int64)
    return TaskSequence(torch.cat(pieces), kinds, answers, tasks)


def task_batch(rng: np.random.Generator, tokens: np.ndarray, length: int, batch: int, blocks: int,
               encoder: TaskTokens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``batch`` training sequences of ``length`` ids with ``training_composition(length)``'s
    tasks spread over ``blocks`` blocks (fewer where a block would hold less than ``MIN_BLOCK``
    tokens): ids [B, L], kinds [B, Q], answer positions [B, Q, A]."""
    composition = training_composition(length)
    block_size = -(-length // max(1, min(blocks, length // MIN_BLOCK)))
    rows = [task_sequence(rng, tokens, length, block_size, composition, encoder) for _ in range(batch)]
    return (torch.stack([r.ids for r in rows]), torch.stack([r.kinds for r in rows]),
            torch.stack([r.answers for r in rows]))


def answer_hits(predicted: torch.Tensor, ids: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """Per task, whether the prediction at every answer position (one position earlier's argmax,
    ``predicted`` [B, L]) is the answer token: bool [B, Q] from ids [B, L], answers [B, Q, A]
    (-1 entries ignored)."""
    b = torch.arange(ids.shape[0], device=ids.device)[:, None, None]
    pos = answers.clamp_min(1)
    hit = predicted[b, pos - 1] == ids[b, pos]
    return (hit | (answers < 0)).all(-1)
