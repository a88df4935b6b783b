"""benchmarks/needle_capture.py and its parts on real text (standard library files) with the real
Tekken and SentencePiece tokenizers of mistral_common: needles, contexts, ranks, the report."""
import random
import sysconfig
from pathlib import Path

import pytest
import torch

from benchmarks.needle_capture import CHUNK, RATIOS, SINK, VARIANTS, capture_rows, value_rank
from benchmarks.needle_contexts import DEV, TEMPLATES, TOKENIZERS, Corpus, Source, Tokenizer, encode_needle, make_context
from benchmarks.needle_report import markdown, summarise, write_report
from runtime.summaries import select_summaries

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module", params=TOKENIZERS)
def tokenizer(request):
    return Tokenizer(request.param)


def small_source(code: bool) -> Source:
    """Real text of a few kilobytes: three standard library modules, read as code (line
    boundaries, comment needles) or as prose (sentence boundaries)."""
    files = ("bisect.py", "colorsys.py", "textwrap.py")
    text = "\n\n".join((STDLIB / f).read_text(encoding="utf-8") for f in files)
    return Source("small_code" if code else "small_prose", DEV, lambda: text, code=code)


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t.name)
@pytest.mark.parametrize("code", [False, True])
def test_value_tokens_spell_the_value(tokenizer, template, code):
    source = small_source(code)
    sentence, value = template.make(random.Random(template.name))
    needle = encode_needle(tokenizer, source.wrap(sentence), value)
    assert needle.value_index == list(range(needle.value_index[0], needle.value_index[-1] + 1))
    spelled = tokenizer.decode([needle.ids[i] for i in needle.value_index])
    assert value in spelled and len(spelled.strip()) <= len(value) + 2  # at most a space or a dash around it


@pytest.mark.parametrize("code", [False, True])
def test_contexts_put_the_needle_at_a_boundary_inside_one_block(tokenizer, code):
    corpus = Corpus(small_source(code), tokenizer)
    boundary = tokenizer.boundary_ids(corpus.ids.tolist(), code)
    rng = random.Random(0)
    starts = set()
    for trial in range(12):
        sentence, value = TEMPLATES[trial % len(TEMPLATES)].make(rng)
        needle = encode_needle(tokenizer, small_source(code).wrap(sentence), value)
        length, block = 2048, 512
        context = make_context(corpus, needle, length, block, SINK, rng)
        at = context.needle_start
        assert context.ids.numel() == length
        assert context.ids[at:at + len(needle.ids)].tolist() == needle.ids
        assert context.ids[:at].tolist() == corpus.ids[context.window_start:context.window_start + at].tolist()
        assert int(context.ids[at - 1]) in boundary and at >= SINK
        assert at // block == (at + len(needle.ids) - 1) // block < (length - 1) // block
        assert context.value_positions.tolist() == [at + i for i in needle.value_index]
        starts.add(at)
    assert len(starts) > 6  # random positions, not a grid


def test_too_short_a_source_is_refused(tokenizer):
    corpus = Corpus(small_source(False), tokenizer)
    needle = encode_needle(tokenizer, " A short needle is: 42.", "42")
    with pytest.raises(ValueError, match="fewer than"):
        make_context(corpus, needle, corpus.ids.numel() + 100, 512, SINK, random.Random(0))


def test_value_rank_orders_by_score_then_secondary_then_position():
    primary = torch.tensor([3.0, 5.0, 5.0, 1.0, 5.0])
    secondary = torch.tensor([0.0, 1.0, 2.0, 0.0, 2.0])
    start, length = torch.arange(5) * 4, torch.full((5,), 4)
    # positions 9, 17 and 1 lie in groups 2, 4 and 0; groups 1, 2, 4 tie on the primary score
    assert value_rank(primary, None, start, length, torch.tensor([9])) == 1  # group 2: after group 1
    assert value_rank(primary, secondary, start, length, torch.tensor([9])) == 0
    assert value_rank(primary, secondary, start, length, torch.tensor([17])) == 1  # group 4: after group 2
    assert value_rank(primary, secondary, start, length, torch.tensor([1, 17])) == 3  # group 0 is fourth


@pytest.mark.parametrize("code", [False, True])
def test_capture_at_every_ratio_matches_select_summaries(tokenizer, code):
    corpus = Corpus(small_source(code), tokenizer)
    rng = random.Random(1)
    for template in TEMPLATES[:4]:
        sentence, value = template.make(rng)
        needle = encode_needle(tokenizer, small_source(code).wrap(sentence), value)
        context = make_context(corpus, needle, 2048, 512, SINK, rng)
        block = context.needle_start // 512
        rows = capture_rows(context.ids, 512, context.value_positions, check=True)
        assert [r["heuristic"] for r in rows] == [label for label, _, _ in VARIANTS]
        for row, (_, heuristic, tie_break) in zip(rows, VARIANTS):
            for ratio in RATIOS:
                summary = select_summaries(context.ids, 512, heuristic=heuristic, chunk=CHUNK, ratio=ratio,
                                           sink=SINK, tie_break=tie_break)[block]
                assert row["captured_at"][str(ratio)] == bool(torch.isin(context.value_positions, summary).all())


def report_rows(captures: dict) -> list[dict]:
    """Rows of two heuristics over two templates: captures[(heuristic, template)] = list of bools."""
    rows = []
    for (heuristic, template), hits in captures.items():
        for trial, hit in enumerate(hits):
            rows.append(dict(heuristic=heuristic, tie_break="position", source="s", source_split="dev",
                             tokenizer="t", length=4096, block_size=1024, template=template,
                             template_split="dev" if template == "a" else "held_out", trial=trial,
                             captured_at={str(r): hit for r in RATIOS}, captured=hit))
    return rows


def report_result(rows: list[dict]) -> dict:
    return dict(rows=rows, settings=dict(ratios=list(RATIOS), main_ratio=0.125, chunk=CHUNK, sink=SINK,
                                         lengths=[4096], block_sizes="L/4", trials=4, captured="all value tokens"),
                packages={}, python="3", tokenizers={"t": "file"}, sources={"s": "dev"},
                templates={"a": "dev", "b": "held_out"}, wall_seconds_cpu=0.0)


def test_report_counts_splits_and_refuses_a_default_that_loses_a_cell(tmp_path):
    # novelty: 4/4 on template a, 1/4 on b; max_idf: 0/4 on a, 2/4 on b -> better overall, worse on b
    rows = report_rows({("max_idf", "a"): [False] * 4, ("max_idf", "b"): [True, True, False, False],
                        ("novelty", "a"): [True] * 4, ("novelty", "b"): [True, False, False, False]})
    summary = summarise(report_result(rows))
    assert summary["capture"]["novelty"]["all"]["0.125"] == 5 / 8
    assert summary["capture"]["novelty"]["dev"]["0.125"] == 1.0
    assert summary["capture"]["max_idf"]["held_out"]["0.125"] == 0.5
    assert summary["best"]["heuristic"] == "novelty" and summary["best"]["target_met"]
    against = summary["against_baseline"]
    assert [(w["template"], w["ratio"]) for w in against["worse"]] == [("b", r) for r in RATIOS]
    assert not against["better_in_every_aggregate"] and not against["beats_everywhere"]
    result = report_result(rows)
    write_report(result, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"needle_capture_cpu.json", "needle_capture_cpu.md", "needle_capture_cpu.png"}
    assert "Beats max_idf everywhere: **no**" in markdown(result)


def test_report_accepts_a_default_that_wins_every_cell():
    rows = report_rows({("max_idf", "a"): [False, False, True, False], ("max_idf", "b"): [True, False, False, False],
                        ("novelty", "a"): [True, False, True, False], ("novelty", "b"): [True, True, False, False]})
    assert summarise(report_result(rows))["against_baseline"]["beats_everywhere"]
