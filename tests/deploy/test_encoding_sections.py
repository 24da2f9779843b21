"""docs/ENCODINGS.md is cited by section number (`ENCODINGS.md §1.2`, `(§8)`): every citation in the code and
the docs names a section the page has, and docs/reference.md lists exactly the page's sections."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENCODINGS = ROOT / "docs" / "ENCODINGS.md"
REFERENCE = ROOT / "docs" / "reference.md"
THIS = Path(__file__).resolve()
FOLDERS = ("models", "service", "posenc", "tests", "bench", "scripts", "docs", "clients", "deploy", "onnx")
SUFFIXES = {".py", ".md", ".html", ".js", ".sh", ".yml", ".yaml", ".toml", ".json", ".go", ".rs", ".java",
            ".hpp", ".cpp", ".ts"}
SKIPPED_PARTS = {"node_modules", "target", "build", "site", "__pycache__"}
CITATION = re.compile(r"§\s?(\d+(?:\.\d+)*)")
# a section of a paper, not of ENCODINGS.md: "Vaswani et al. §3.5", "arXiv:1803.02155 §3.2", "RoFormer §3.4.3"
PAPER = re.compile(r"et al\.|arXiv|Attention Is All You Need|RoFormer")
OURS = re.compile(r"ENCODINGS(?:\.md)?\s+$")  # right before the §


def sections() -> set[str]:
    """'0', '1', '1.1', ...: the numbered headings of ENCODINGS.md."""
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)*)\.? ", ENCODINGS.read_text(), re.M))


def cited() -> list[tuple[str, int, str]]:
    """(file, line, section) of every ENCODINGS.md citation in the repository's code and docs."""
    out = []
    files = [ROOT / "README.md", *(p for folder in FOLDERS for p in (ROOT / folder).rglob("*"))]
    for path in files:
        if path.suffix not in SUFFIXES or not path.is_file() or SKIPPED_PARTS & set(path.parts) or path == THIS:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            out += [(str(path.relative_to(ROOT)), number, section) for section in section_citations(line)]
    return out


def section_citations(line: str) -> list[str]:
    """The ENCODINGS.md sections a line cites: on a line that cites a paper, only those written right after
    `ENCODINGS.md`; elsewhere every `§N`."""
    paper = PAPER.search(line) is not None
    return [m.group(1) for m in CITATION.finditer(line) if not paper or OURS.search(line[:m.start()])]


def test_every_cited_section_exists() -> None:
    citations = cited()
    assert len(citations) > 50  # code and docs cite it widely: an empty scan would prove nothing
    have = sections()
    missing = [f"{file}:{line} cites §{number}" for file, line, number in citations if number not in have]
    assert not missing, "ENCODINGS.md has no such section: " + "; ".join(missing)


def test_the_reference_page_lists_every_section() -> None:
    have = sections()
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", REFERENCE.read_text(), re.M)
    assert [number for number, _ in rows] == sorted((s for s in have if "." not in s), key=int)
    for number, topic in rows:
        listed = set(re.findall(rf"\b({number}\.\d+) ", topic))
        assert listed == {s for s in have if s.startswith(f"{number}.")}, f"§{number}: {topic}"
    assert "(not served)" not in dict(rows)["8"]


def test_paper_sections_are_told_from_ours() -> None:
    assert section_citations("see ENCODINGS.md §1.2 and §15, and Vaswani et al. §3.5") == ["1.2"]
    assert section_citations("the bucket function (§3.1) and the bias (§3.2)") == ["3.1", "3.2"]
    assert "3.9" not in sections() and "15" not in sections() and {"8", "12", "13", "14", "1.2"} <= sections()
