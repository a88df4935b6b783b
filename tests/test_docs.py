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
