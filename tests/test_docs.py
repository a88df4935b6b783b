"""The documents the code cites are in the repository: every "SPEC A.x" citation names a section
of docs/SPEC.md."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"SPEC ([ABC])\.(\d+)(?:\s*[-–]\s*(?:[ABC]\.)?(\d+))?")


def test_every_spec_citation_names_a_section_of_docs_spec():
    sections = set(re.findall(r"^### ([ABC]\.\d+) ", (ROOT / "docs" / "SPEC.md").read_text(), flags=re.M))
    assert {"A.1", "A.8", "B.2", "B.5", "C.1", "C.10"} <= sections
    cited = {}
    for folder in ("compiler", "runtime", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for part, first, last in CITATION.findall(path.read_text()):
                for n in range(int(first), int(last or first) + 1):
                    cited.setdefault(f"{part}.{n}", path.relative_to(ROOT))
    assert len(cited) >= 8
    missing = {section: str(path) for section, path in cited.items() if section not in sections}
    assert not missing


def test_the_design_document_names_existing_folders():
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    for folder in re.findall(r"^\s{4}(compiler/[a-z_]+/|runtime/)", design, flags=re.M):
        assert (ROOT / folder).is_dir(), folder


def test_the_readme_states_the_tie_rule_and_cites_a_test_that_keeps_ties_out():
    # Compiled logits can differ from eager ones when indexer scores tie at the K-th place: the
    # op keeps the lower key indices, torch.topk may keep others. The README says so and names
    # the test that compares logits only on inputs without such ties.
    paragraphs = re.split(r"\n\s*\n|\n\* ", (ROOT / "README.md").read_text())
    stated = [p for p in paragraphs if "torch.topk" in p and "tie" in p.lower() and "logits" in p]
    assert stated, "README: no paragraph on ties at the K-th place"
    cited = re.findall(r"`(tests/[\w/]+\.py)`", stated[0])
    assert cited and all('"tie": 0' in (ROOT / path).read_text() for path in cited)


RESULTS = ROOT / "benchmarks" / "results"
RESULT_FILE = re.compile(r"\b([a-z0-9_]+_(?:h100|h200|cpu))\.(?:json|md|png)\b")
RESULT_NAME = re.compile(r"`([a-z0-9_]+_(?:h100|h200|cpu))(?:\.(?:json|md|png))?`")


def test_every_cited_results_file_exists_and_the_index_names_every_one():
    # The READMEs, docs and the library's docstrings cite results by file name; benchmarks/README.md
    # is the index of benchmarks/results/ and names each result there.
    sources = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
               *(ROOT / "compiler").rglob("*.py"), *(ROOT / "runtime").rglob("*.py")]
    cited = {(name, path.relative_to(ROOT)) for path in sources for name in RESULT_FILE.findall(path.read_text())}
    assert len(cited) >= 10
    stems = {path.stem for path in RESULTS.iterdir()}
    assert not {(name, str(path)) for name, path in cited if name not in stems}
    indexed = set(RESULT_NAME.findall((ROOT / "benchmarks" / "README.md").read_text()))
    assert not indexed - stems, "benchmarks/README.md names a result that is not in benchmarks/results/"
    assert not stems - indexed, "benchmarks/results/ holds a result that benchmarks/README.md does not name"
