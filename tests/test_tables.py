"""The generated documents (``python -m harness.tables``) match the backend records and the subject registry.

A record or a known-bad subject added or changed without regenerating ``docs/backends.md`` and
``docs/known-bad.md`` fails here; the staleness check itself is shown to catch a missing and an edited file.
The hand-written table of the property that first catches each known-bad subject (``docs/subjects.md`` §2)
names every registered one.
"""

from __future__ import annotations

import re
from pathlib import Path

from backends import records
from harness import tables
from subjects.registry import known_bad


def test_generated_documents_are_fresh() -> None:
    assert not tables.stale(), "run python -m harness.tables"
    assert tables.main(["--check"]) == 0


def test_staleness_check_catches_a_missing_and_an_edited_file(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for path, text in tables.generated().items():
        (tmp_path / path).write_text(text)
    assert tables.stale(tmp_path) == []
    (tmp_path / tables.KNOWN_BAD).unlink()
    backends_md = tmp_path / tables.BACKENDS
    backends_md.write_text(backends_md.read_text().replace("`marlin`", "`marlin-old`"))
    assert tables.stale(tmp_path) == [tables.BACKENDS, tables.KNOWN_BAD]


def test_every_record_and_known_bad_subject_has_a_row() -> None:
    generated = tables.generated()
    for r in records():
        assert f"| `{r.name}` | `{r.contract}` |" in generated[tables.BACKENDS]
    for name in known_bad():
        assert f"| `{name}` |" in generated[tables.KNOWN_BAD]


def test_catching_property_table_names_every_known_bad_subject() -> None:
    text = (tables.ROOT / "docs" / "subjects.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(bad-[a-z0-9-]+)` \|", text, re.MULTILINE))
    assert listed == set(known_bad())
