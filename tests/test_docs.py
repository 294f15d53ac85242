"""Citations of the project's documents resolve, and tracked files cite and speak plainly.

Code and documents cite ``docs/<name>.md §<section>`` (or ``docs/regressions.md <id>`` for a catalogued
regression); inside ``docs/`` the form is a Markdown link ``[<name>.md](<name>.md) §<section>``. Every such
citation in a tracked file must name an existing document and one of its numbered headings (``## 2.``,
``### 10.1``) or catalogue ids (a table row ``| A1 |``), so renumbering a section breaks the build instead of
the reader's trail. Outside ``docs/`` a document is cited by its repository path, no tracked file names a
path outside the repository or describes a measurement by where it was taken instead of its date, hardware
and versions, and every test a document names exists.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from harness.checkout import project_files

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

_SECTION_CHAIN = r"(?P<chain>§\d+(?:\.\d+)*(?:\s*(?:,|-|–|/|and)\s*§\d+(?:\.\d+)*)*)"
_CODE_CITATION = re.compile(r"docs/(?P<name>[a-z-]+)\.md`*\s*(?:" + _SECTION_CHAIN + r"|(?P<id>[A-Z]\d+)\b)")
_DOC_CITATION = re.compile(r"\[(?P<name>[a-z-]+)\.md\]\((?P=name)\.md\)\s*" + _SECTION_CHAIN)
_SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
_HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
_ROW_ID = re.compile(r"^\| ([A-Z]\d+) \|", re.MULTILINE)


@cache
def tracked_text_files() -> tuple[Path, ...]:
    """The project's files (git's list, or in a copy without ``.git`` a walk of the tree:
    :func:`harness.checkout.project_files`), minus binaries."""
    return tuple(
        p for p in project_files(ROOT) if p.is_file() and p.suffix in {".py", ".md", ".sh", ".toml", ".txt", ""}
    )


@cache
def anchors(name: str) -> frozenset[str]:
    """Section numbers and catalogue ids of ``docs/<name>.md`` (empty if it does not exist)."""
    path = DOCS / f"{name}.md"
    if not path.is_file():
        return frozenset()
    text = path.read_text(encoding="utf-8")
    return frozenset(_HEADING.findall(text)) | frozenset(_ROW_ID.findall(text))


def citations(path: Path) -> list[tuple[int, str, str]]:
    """``(line, document name, section or id)`` for every citation of a project document in ``path``."""
    found = []
    in_docs = path.parent == DOCS
    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        for m in _CODE_CITATION.finditer(line):
            if m["id"]:
                found.append((lineno, m["name"], m["id"]))
            else:
                found += [(lineno, m["name"], s) for s in _SECTION.findall(m["chain"])]
        if in_docs:
            for m in _DOC_CITATION.finditer(line):
                found += [(lineno, m["name"], s) for s in _SECTION.findall(m["chain"])]
    return found


def test_documents_exist_and_are_numbered() -> None:
    names = {"formats", "layouts", "vllm-logic", "kernels", "models", "regressions"}
    for name in names:
        assert anchors(name), f"docs/{name}.md is missing or has no numbered sections"


def test_every_citation_resolves() -> None:
    broken = [
        f"{path.relative_to(ROOT)}:{line}: docs/{name}.md §{section}"
        for path in tracked_text_files()
        for line, name, section in citations(path)
        if section not in anchors(name)
    ]
    assert not broken, "citations of missing documents or sections:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("see ``docs/layouts.md`` §4-§7", [("layouts", "4"), ("layouts", "7")]),
        ("docs/kernels.md §2.5 item 6", [("kernels", "2.5")]),
        ("(docs/regressions.md M4)", [("regressions", "M4")]),
        ("docs/formats.md §7, §8", [("formats", "7"), ("formats", "8")]),
    ],
)
def test_citation_parser(tmp_path: Path, text: str, want: list[tuple[str, str]]) -> None:
    f = tmp_path / "x.py"
    f.write_text(text, encoding="utf-8")
    assert [(n, s) for _, n, s in citations(f)] == want


_DOC_NAMES = "formats|layouts|vllm-logic|kernels|models|regressions|testing-anchors|notes-vllm"
_BARE = re.compile(r"(?<![\w/.\-\[])(?:" + _DOC_NAMES + r")\.md\b|\.\./shared/")
# Words that only make sense where the text was written, not to a reader of the repository; split so that
# this file does not match itself.
_UNPLACED = re.compile(
    "|".join(
        [
            "this " + "session",
            "the " + "session's",
            r"[0-9]+-minute " + "lease",
            "work" + "place",
            "snapshot available " + "here",
            "stored " + "version",
            "the " + "index",
            r"the (?:same )?device " + r"call\b",
            "H200 " + "image",
            "image's " + "torch",
            "GPU time " + "available",
            "freshly started " + "machine",
            "flashinfer " + "bundle",
            "bundle of " + "flashinfer",
            "nvidia-" + "h200",
        ]
    ),
    re.IGNORECASE,
)
_TEST_NAME = re.compile(r"`(test_[a-z0-9_]+)`")


def test_project_documents_are_cited_by_path() -> None:
    """Outside ``docs/``, a document is cited as ``docs/<name>.md``, never by a bare name or an outside path."""
    bare = [
        f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:100]}"
        for path in tracked_text_files()
        if path.parent != DOCS
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if _BARE.search(line)
    ]
    assert not bare, "cite docs/<name>.md:\n" + "\n".join(bare)


def test_tracked_files_speak_of_the_project_plainly() -> None:
    """Measurements carry dates, hardware and versions, not words about where they were taken."""
    found = [
        f"{path.relative_to(ROOT)}:{lineno}: {m.group(0)!r}"
        for path in tracked_text_files()
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        for m in _UNPLACED.finditer(line)
    ]
    assert not found, "\n".join(found)


def test_tests_named_in_docs_exist() -> None:
    """Every ``test_...`` a document names exists: defined, or generated from its ``check_...`` function."""
    words = {w for p in tracked_text_files() if p.suffix == ".py" for w in re.findall(r"\w+", p.read_text("utf-8"))}
    missing = [
        f"docs/{doc.name}: {name}"
        for doc in sorted(DOCS.glob("*.md"))
        for name in sorted(set(_TEST_NAME.findall(doc.read_text(encoding="utf-8"))))
        if name not in words and f"check_{name[5:]}" not in words
    ]
    assert not missing, "\n".join(missing)
