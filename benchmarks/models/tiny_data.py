"""Data for the measuring models: windows of the token corpus and planted key-value facts.

A fact is the line ``# fact <name> = <5 digits>`` planted at a random depth of a corpus window;
its question, at the end of the sequence, repeats the line up to ``=`` and the model must
continue with the digits (``FACT``/``QUERY``; the tokenizer splits digits one per token, so the
answer is a space and 5 digit tokens). Names are two words of ``WORDS`` joined by ``_``; values
are uniform. ``planted_sequence`` returns the ids and, per question, the positions of its answer
tokens (the logits one position earlier predict them).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

WORDS = tuple("""amber anchor apple arrow aspen autumn badger bamboo basil beacon birch bison bramble breeze
bronze cactus canyon cedar cherry cinder clover cobalt comet copper coral cotton crane crimson crystal
cypress dawn delta desert dune eagle ember falcon fern fig flint forest fossil frost garnet glacier
granite harbor hazel heron hollow indigo iris ivory jade jasper juniper kelp kestrel lagoon lantern
larch lemon lilac linen lotus lynx magpie maple marble meadow mesa mint moss nectar nickel oak ocean
olive onyx orchid otter pebble pepper pine plum poplar prairie quartz quill raven reed ridge river
robin saffron sage salmon sapphire scarlet shadow silver slate sparrow spruce stone summit thistle
thunder tide topaz tulip tundra umber valley velvet violet walnut willow winter wren yarrow zephyr""".split())
VALUE_DIGITS = 5
FACT = "\n# fact {name} = {value}\n"
QUERY = "\n# fact {name} ="


@dataclass(frozen=True)
class Fact:
    name: str
    value: str


@dataclass
class Planted:
    """A sequence with planted facts: ``ids`` int64 [L]; ``answers`` [Q, 1 + VALUE_DIGITS] the
    positions of each question's answer tokens; ``questions`` the position where each question
    starts; ``depths`` the relative position of each asked fact in the sequence."""

    ids: torch.Tensor
    answers: torch.Tensor
    questions: list[int]
    depths: list[float]


def load_tokens(path: Path) -> np.ndarray:
    """A uint16 token array written by ``benchmarks/models/tiny_corpus.py``."""
    tokens = np.load(path)
    if tokens.dtype != np.uint16 or tokens.ndim != 1:
        raise ValueError(f"{path}: expected a 1-D uint16 token array, got {tokens.dtype} {tokens.shape}")
    return tokens


def random_facts(rng: np.random.Generator, n: int) -> list[Fact]:
    """``n`` facts with distinct names."""
    names: set[str] = set()
    while len(names) < n:
        a, b = rng.choice(len(WORDS), 2, replace=False)
        names.add(f"{WORDS[a]}_{WORDS[b]}")
    return [Fact(name, "".join(str(d) for d in rng.integers(0, 10, VALUE_DIGITS))) for name in sorted(names)]


class FactTokens:
    """Token ids of facts and questions under one tokenizer (answer = fact minus question)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def fact(self, fact: Fact) -> list[int]:
        return self.encode(FACT.format(name=fact.name, value=fact.value))

    def question(self, fact: Fact) -> tuple[list[int], list[int]]:
        """(question ids, answer ids); the fact's ids are the question's followed by the answer's."""
        full, query = self.fact(fact), self.encode(QUERY.format(name=fact.name))
        if full[:len(query)] != query:
            raise ValueError(f"the tokenizer splits {fact.name!r} differently in fact and question")
        return query, full[len(query):len(query) + 1 + VALUE_DIGITS]


def planted_sequence(rng: np.random.Generator, tokens: np.ndarray, length: int, facts: list[Fact],
                     asked: list[int], encoder: FactTokens, depths: list[float] | None = None) -> Planted:
    """A window of ``tokens`` with ``facts`` planted at random (or given relative) depths and
    questions for ``asked`` (indices into ``facts``) at the end, ``length`` ids in all."""
    fact_ids = [encoder.fact(f) for f in facts]
    questions = [encoder.question(facts[i]) for i in asked]
    tail = sum(len(q) + len(a) for q, a in questions)
    hay = length - tail - sum(len(f) for f in fact_ids)
    if hay <= 0:
        raise ValueError(f"length {length} cannot hold {len(facts)} facts and {len(asked)} questions")
    start = int(rng.integers(0, tokens.size - hay))
    haystack = tokens[start:start + hay].astype(np.int64)
    if depths is None:
        cuts = np.sort(rng.integers(0, hay + 1, len(facts)))
    else:
        cuts = np.asarray([int(round(d * hay)) for d in depths])
    order = np.argsort(cuts, kind="stable")
    pieces, at, where = [], 0, {}
    for i in order:
        pieces.append(haystack[at:cuts[i]])
        where[int(i)] = sum(p.size for p in pieces)
        pieces.append(np.asarray(fact_ids[i], dtype=np.int64))
        at = cuts[i]
    pieces.append(haystack[at:])
    answers, starts = [], []
    for query, answer in questions:
        starts.append(sum(p.size for p in pieces))
        pos = starts[-1] + len(query)
        answers.append(list(range(pos, pos + len(answer))))
        pieces += [np.asarray(query, dtype=np.int64), np.asarray(answer, dtype=np.int64)]
    ids = np.concatenate(pieces)
    assert ids.size == length
    return Planted(torch.from_numpy(ids), torch.tensor(answers, dtype=torch.int64), starts,
                   [where[i] / length for i in asked])


def training_batch(rng: np.random.Generator, tokens: np.ndarray, length: int, batch: int,
                   facts_per_sequence: int, encoder: FactTokens) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [batch, length] with ``facts_per_sequence`` facts each, all asked at the end in random
    order, and the answers' positions [batch, facts, 1 + VALUE_DIGITS]."""
    rows = []
    for _ in range(batch):
        facts = random_facts(rng, facts_per_sequence)
        rows.append(planted_sequence(rng, tokens, length, facts, list(rng.permutation(len(facts))), encoder))
    return torch.stack([r.ids for r in rows]), torch.stack([r.answers for r in rows])


def answer_accuracy(logits: torch.Tensor, ids: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """Per question, whether the argmax at every answer position is the answer token: bool
    [B, Q] from logits [B, L, V] (or [B, L] argmax ids), ids [B, L], answers [B, Q, A]."""
    pred = logits if logits.dim() == 2 else logits.argmax(-1)
    b = torch.arange(ids.shape[0], device=ids.device)[:, None, None]
    return (pred[b, answers - 1] == ids[b, answers]).all(-1)
