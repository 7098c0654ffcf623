"""Every spec reference in the repository names a document and section of `docs/spec/`.

The code cites the specification as `SERVER §8`, `PROTOCOL.md §7.6`, `EXTENSIONS §6.`,
`ROUTER §4.1/§5` and so on. These tests read every tracked text file, collect those
citations, and fail on one whose document or section does not exist, so that a spec edit
that renumbers a section, or a citation with a typo, is caught in the test command.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "docs" / "spec"
DOCUMENTS = ("PROTOCOL", "CLIENT_API", "SERVER", "ROUTER", "EXTENSIONS")
TEXT_SUFFIXES = {
    ".py", ".md", ".ts", ".tsx", ".js", ".cjs", ".sh", ".toml", ".yaml", ".yml", ".json",
    ".ipynb", ".service", ".proto", ".cfg", ".txt", ".css",
}  # fmt: skip

# `SERVER §8`, `PROTOCOL.md §7.6`, `ROUTER §4.1/§5`, `SERVER §§6–8`, `EXTENSIONS §5, §6`.
CITATION = re.compile(
    r"(?<![A-Za-z_])(?P<doc>" + "|".join(DOCUMENTS) + r")(?:\.md)?\s*"
    r"(?P<sections>§§?\s*\d+(?:\.\d+)*(?:\s*(?:/|,|–|-|and|or)\s*§?\s*\d+(?:\.\d+)*)*)"
)
SECTION_NUMBER = re.compile(r"\d+(?:\.\d+)*")
HEADING = re.compile(r"^#{2,4}\s+(\d+(?:\.\d+)*)\.?\s")
NUMBERED_ITEM = re.compile(r"^(\d+)\.\s")


@cache
def sections_of(document: str) -> frozenset[str]:
    """The numbered headings of one spec document (`7`, `7.6`, ...), and the numbered steps
    of a section without subsections (ROUTER §4.1 is step 1 of ROUTER §4)."""
    found: set[str] = set()
    current = ""
    for line in (SPEC / f"{document}.md").read_text().splitlines():
        if heading := HEADING.match(line):
            current = heading.group(1)
            found.add(current)
        elif (item := NUMBERED_ITEM.match(line)) and current and "." not in current:
            found.add(f"{current}.{item.group(1)}")
    return frozenset(found)


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [
        ROOT / name
        for name in names
        if Path(name).suffix in TEXT_SUFFIXES
        and "node_modules" not in name
        and not name.startswith("jupyter_ext/labextension/static/")
        and (ROOT / name).is_file()
    ]


def citations(text: str) -> list[tuple[str, str, int]]:
    """(document, section, line) for every section a text cites."""
    found = []
    for match in CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        for number in SECTION_NUMBER.findall(match.group("sections")):
            found.append((match.group("doc"), number, line))
    return found


def test_the_five_spec_documents_live_in_the_repository() -> None:
    for document in DOCUMENTS:
        assert sections_of(document), f"docs/spec/{document}.md has no numbered sections"


def test_the_citation_pattern_reads_every_form_the_code_uses() -> None:
    text = "SERVER §8, PROTOCOL.md §7.6. ROUTER §4.1/§5 and SERVER §§6–8; EXTENSIONS §5, §6"
    assert citations(text) == [
        ("SERVER", "8", 1),
        ("PROTOCOL", "7.6", 1),
        ("ROUTER", "4.1", 1),
        ("ROUTER", "5", 1),
        ("SERVER", "6", 1),
        ("SERVER", "8", 1),
        ("EXTENSIONS", "5", 1),
        ("EXTENSIONS", "6", 1),
    ]


def test_every_spec_citation_names_an_existing_section() -> None:
    missing = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        for document, section, line in citations(text):
            if section not in sections_of(document):
                missing.append(f"{path.relative_to(ROOT)}:{line}: {document} §{section}")
    assert not missing, "citations of sections docs/spec/ does not have:\n" + "\n".join(missing)


def test_every_spec_file_path_the_repository_names_exists() -> None:
    named = re.compile(r"docs/spec/([A-Za-z_]+\.md)")
    missing = []
    for path in tracked_text_files():
        for name in named.findall(path.read_text(errors="replace")):
            if not (SPEC / name).is_file():
                missing.append(f"{path.relative_to(ROOT)}: docs/spec/{name}")
    assert not missing, "\n".join(missing)


def test_no_file_points_outside_the_repository_for_the_spec() -> None:
    outside = "../" + "shared"  # spelled apart so that this file does not match itself
    offenders = [
        str(path.relative_to(ROOT))
        for path in tracked_text_files()
        if outside in path.read_text(errors="replace")
    ]
    assert not offenders, f"files that refer to {outside}: {offenders}"
