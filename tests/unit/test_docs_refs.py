"""Every docs/ reference in the repository resolves: the file exists, and a #anchor names one of its headings.

Docstrings and comments point at docs/*.md for the design and the facts behind the code; a reference to a file
outside the repository (the research notes, the old design and style files) would leave a reader stranded.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import REPO

DOCS = REPO / "docs"
SCANNED = ("app", "widgets", "tests", "bench", "scripts", "profiles", "docs", "README.md")
SKIPPED_PARTS = {"__pycache__", ".pytest_cache"}

# A page of docs/ with an optional #anchor, not inside a longer path or URL (`.../docs/oauth2-redirect`).
DOC_REF = re.compile(r"(?<![\w./-])docs/(?P<file>[\w-]+\.md)(?:#(?P<anchor>[\w-]+))?")
# A Markdown link to an anchor of the same page: `](#anchor)`.
SAME_PAGE_REF = re.compile(r"\]\(#(?P<anchor>[\w-]+)\)")
# Files that are not in this repository: the research notes (by folder or by name), the old design and style
# files.
OUTSIDE_REFS = {
    "research notes": re.compile(r"research/|\b(?:gpu_telemetry|anchors|vllm-cpu)\.md|(?<!docs/)servers\.md"),
    "the old design file": re.compile(r"ARCHITECTURE(?:\.md|:)"),
    "the old style file": re.compile(r"STYLE(?:\.md|:)"),
}


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = REPO / name
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for candidate in candidates:
            if SKIPPED_PARTS & set(candidate.parts) or candidate.suffix in (".pyc", ".sqlite3"):
                continue
            try:
                candidate.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            files.append(candidate)
    return files


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(doc: str) -> frozenset[str]:
    """The anchors of a docs page, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    in_code = False
    for line in (DOCS / doc).read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        base = slug(line.lstrip("#"))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def references() -> list[tuple[Path, int, str, str | None]]:
    refs: list[tuple[Path, int, str, str | None]] = []
    for path in scanned_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            refs.extend((path, number, m["file"], m["anchor"]) for m in DOC_REF.finditer(line))
            if path.parent == DOCS:
                refs.extend((path, number, path.name, m["anchor"]) for m in SAME_PAGE_REF.finditer(line))
    return refs


def test_the_four_design_pages_exist() -> None:
    for page in ("architecture.md", "servers.md", "gpus.md", "decisions.md"):
        assert (DOCS / page).is_file(), f"docs/{page} is missing"


def test_the_code_points_at_the_docs() -> None:
    assert len(references()) > 20  # the scan finds the references that exist today


def test_every_docs_reference_resolves() -> None:
    broken = []
    for path, number, doc, anchor in references():
        where = f"{path.relative_to(REPO)}:{number}"
        if not (DOCS / doc).is_file():
            broken.append(f"{where}: docs/{doc} does not exist")
        elif anchor is not None and anchor not in anchors(doc):
            broken.append(f"{where}: docs/{doc} has no heading for #{anchor}")
    assert broken == []


@pytest.mark.parametrize("outside", sorted(OUTSIDE_REFS))
def test_nothing_points_outside_the_repository(outside: str) -> None:
    pattern = OUTSIDE_REFS[outside]
    hits = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}"
        for path in scanned_files()
        if path != Path(__file__).resolve()  # its own patterns and page names
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == [], f"references to {outside} (not in this repository): point at docs/ instead"


def test_slug_follows_github() -> None:
    assert slug("The `custom` backend") == "the-custom-backend"
    assert slug("NVML (nvidia-ml-py)") == "nvml-nvidia-ml-py"
    assert slug("A/B statistics") == "ab-statistics"
