"""Self-tests of the backend records (:mod:`backends`): every backend is declared once and completely.

* Every member of every backend enum has a record, and the record names that member and its contract.
* No field a complete record needs is empty; markers are ones the plugin knows; sources are links or
  upstream files; a record has kernel requirements exactly when it has a kernel runner.
* The contracts' registered backends are the records' members, in declaration order.
* ``--backend NAME`` collecting only that backend's tests (the parametrization comes from the records)
  is checked end to end once, in ``tests/test_plugin.py``.
"""

from __future__ import annotations

import re

import pytest

from backends import BackendRecord, enums, record, records
from backends.mxfp4_linear import Mxfp4LinearRecord
from harness.hardware import REQUIREMENTS
from subjects.registry import backends, contracts

MEMBERS = [m for e in enums() for m in e]
UPSTREAM_FILE = re.compile(r"^[\w.-]+(/[\w.-]+)? (\d+\.\d+\.\d+ )?[\w./-]+\.(py|cu)\b")
"""A source that is not a link names an upstream file: ``package version path`` or ``owner/repo path``."""


def test_every_contract_enum_is_declared() -> None:
    assert {type(b) for c in contracts() for b in backends(c)} == set(enums())


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: m.value)
def test_every_member_has_a_complete_record(member) -> None:
    r = record(member)
    assert isinstance(r, BackendRecord) and r.member is member
    assert member in backends(r.contract), f"{member} is not a backend of its record's contract {r.contract}"
    assert not r.missing_fields(), f"{member.value}: empty fields {r.missing_fields()}"
    unknown = set(r.requires + r.kernel_requires) - set(REQUIREMENTS)
    assert not unknown, f"{member.value}: unknown markers {sorted(unknown)}"
    assert all(s.startswith("https://github.com/") or UPSTREAM_FILE.match(s) for s in r.sources), r.sources
    runner = (r.quantize, r.gemm) if isinstance(r, Mxfp4LinearRecord) else (r.kernel,)
    assert all(callable(f) for f in runner) == bool(r.kernel_requires), (
        f"{member.value}: a kernel runner exactly when kernel requirements are named"
    )


def test_registered_backends_are_the_records() -> None:
    for contract in contracts():
        assert backends(contract) == tuple(r.member for r in records(contract))


def test_unknown_member_has_no_record() -> None:
    import enum

    class Other(enum.Enum):
        NEW = "new-backend"

    with pytest.raises(KeyError, match="new-backend"):
        record(Other.NEW)
