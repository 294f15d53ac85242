"""The ledger rule: a known-failure entry (:class:`subjects.registry.KnownFailure`) describes one bug.

An entry turns a failure into an expected one, so an entry broad enough to match what unrelated code
prints hides bugs: a broken adapter raising torch's broadcasting error, or any policy failing a property
the same way. :func:`check_entry` refuses, where the ledger is written:

* ``raises`` of bare ``Exception`` / ``BaseException``, or of a suite guard error
  (:class:`contracts.errors.GuardViolation`: those are never an upstream bug);
* a *universal* pattern: one that matches the empty string (``""``, ``".*"``, ``"x*"``);
* a *near-universal* pattern: one matching messages of two or more families of :func:`generic_messages`
  (``"."``, ``"e"``, ``r"\\d"``);
* a *generic* pattern, one matching a message of one family (Python's built-in errors, torch's shape and
  broadcasting errors, the suite's own assertion messages) or a suite message quoting a Python or torch
  error (``policy refused a shape ...: {exc}``, :func:`quoting_messages`), unless the entry names in
  ``raised_in`` the upstream function(s) the error must come from: ``module:qualname`` of a frame of its
  traceback (:func:`raised_from`). Functions of the suite's own packages do not count: a property's or
  adapter's frame says nothing about which upstream bug failed.

The families are made, not typed: the Python and torch messages by running the failing operations, the
suite's messages from the assertion messages in ``conformance/`` and ``contracts/`` (read as source, not
imported), each value it formats in replaced by ``…``. A pattern that matches such a rendering matches the
property's headline whatever the example; one that pins a formatted value (a backend, a tensor name, the
upstream message a property quotes) does not.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from contracts.errors import GuardViolation

PLACEHOLDER = "…"
"""What a formatted value of a suite message is rendered as."""

SUITE_PACKAGES = (
    "reference",
    "contracts",
    "adapters",
    "backends",
    "strategies",
    "subjects",
    "harness",
    "conformance",
    "bench",
    "tests",
)
"""The project's own top-level packages: a frame of theirs never identifies an upstream bug."""

_ROOT = Path(__file__).resolve().parents[1]  # the checkout, or site-packages in an installed copy
SUITE_MESSAGE_DIRS = (_ROOT / "conformance", _ROOT / "contracts")
"""Where the properties' assertion messages are written (packaged with the suite: read from an installed copy too)."""


class LedgerError(ValueError):
    """A known-failure entry is a catch-all: it would absorb failures that are not its bug."""


def _raising(op: Callable[[], object]) -> Exception:
    try:
        op()
    except Exception as exc:  # noqa: BLE001  # collecting what each operation raises
        return exc
    raise AssertionError(f"{op} was expected to raise")  # an operation of the corpus that no longer fails


def _python_errors() -> tuple[Exception, ...]:
    """Python's built-in errors, from the operations that raise them."""
    missing: dict[str, int] = {}
    ops: tuple[Callable[[], object], ...] = (
        lambda: [][0],
        lambda: missing["key"],
        lambda: _nothing().shape,  # type: ignore[attr-defined]
        lambda: _nothing() + 1,  # type: ignore[operator]
        lambda: _nothing()[0],  # type: ignore[index]
        lambda: iter(_nothing()),  # type: ignore[call-overload]
        lambda: 1 // 0,
        lambda: int("x"),
        lambda: _unpack((1,)),
        lambda: _unpack((1, 2, 3)),
        lambda: _unpack(),  # type: ignore[call-arg]
        lambda: _unpack((1, 2), 3),  # type: ignore[call-arg]
    )
    return tuple(_raising(op) for op in ops)


def _nothing() -> None:
    return None


def _unpack(pair: tuple[int, ...]) -> int:
    a, b = pair
    return a + b


def _torch_errors() -> tuple[Exception, ...]:
    """torch's generic shape, broadcasting and indexing errors, from the operations that raise them."""
    import torch

    one = torch.ones
    ops: tuple[Callable[[], object], ...] = (
        lambda: one(3) + one(4),
        lambda: one(2, 3).copy_(one(4)),
        lambda: one(3).add_(one(2, 3)),
        lambda: one(6).view(4),
        lambda: one(2, 3) @ one(4, 5),
        lambda: one(3) @ one(4),
        lambda: torch.bmm(one(2, 3, 4), one(2, 5, 6)),
        lambda: torch.stack([one(2), one(3)]),
        lambda: torch.cat([one(2, 3), one(2, 4)]),
        lambda: one(2, 3).expand(4, 3),
        lambda: one(3)[5],
        lambda: one(2).sum(3),
        lambda: one(2, 3).narrow(1, 2, 4),
        lambda: one(3, dtype=torch.uint8).view(torch.int32),
        lambda: one(5).split([2, 2]),
        lambda: one(2, 3).permute(0),
    )
    return tuple(_raising(op) for op in ops)


def _render(node: ast.expr) -> str | None:
    """The text of a string expression, each formatted value as :data:`PLACEHOLDER` (None: not a string)."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else PLACEHOLDER for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _render(node.left), _render(node.right)
        if left is None and right is None:
            return None
        return (left or PLACEHOLDER) + (right or PLACEHOLDER)
    return None


def _message_nodes(tree: ast.AST) -> Iterator[ast.expr]:
    """The expressions a module raises or asserts with: ``assert x, MSG``, ``raise E(MSG)``, and the
    context strings handed to an ``assert_*`` helper (which prints them at the head of its message)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and node.msg is not None:
            yield node.msg
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            yield from node.exc.args
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name.startswith("assert_"):
                yield from node.args


def _suite_messages() -> tuple[str, ...]:
    """The suite's own assertion and error messages, formatted values rendered as :data:`PLACEHOLDER`."""
    files = sorted(p for folder in SUITE_MESSAGE_DIRS for p in folder.glob("*.py"))
    if not any(folder.name == "conformance" for folder in {f.parent for f in files}):
        raise LedgerError(
            f"cannot read the properties' messages from {SUITE_MESSAGE_DIRS[0]}: the ledger rule needs the "
            "suite's conformance/ package (a checkout or an installed copy of the suite)"
        )
    found: dict[str, None] = {}
    for path in files:
        for node in _message_nodes(ast.parse(path.read_text(), str(path))):
            text = _render(node)
            if text and text.strip(PLACEHOLDER + " :()"):
                found[text] = None
    return tuple(found)


PYTHON, TORCH, SUITE = "Python's built-in errors", "torch's shape and broadcasting errors", "the suite's own messages"


@functools.cache
def _generic_errors() -> tuple[Exception, ...]:
    return _python_errors() + _torch_errors()


@functools.cache
def generic_messages() -> dict[str, tuple[str, ...]]:
    """Family name -> messages that many unrelated failures print."""
    python, torch_ = (tuple(str(e) for e in errors) for errors in (_python_errors(), _torch_errors()))
    return {PYTHON: python, TORCH: torch_, SUITE: _suite_messages()}


@functools.cache
def quoting_messages() -> tuple[str, ...]:
    """The suite's messages that format a value (often the error they caught: ``policy refused a shape ...:
    {exc}``), every value replaced by each Python and torch error (``message``, ``TypeName: message``): a
    pattern that needs the quoted part to match is no more specific than that part."""
    quoted = [form for e in _generic_errors() for form in (str(e), f"{type(e).__name__}: {e}")]
    return tuple(m.replace(PLACEHOLDER, q) for m in generic_messages()[SUITE] if PLACEHOLDER in m for q in quoted)


@functools.cache
def _joined(messages: tuple[str, ...]) -> str:
    return "\n".join(messages)


def _first_match(pattern: re.Pattern[str], messages: tuple[str, ...]) -> str | None:
    """The first of ``messages`` that ``pattern`` matches (one search of them all first: most patterns match none)."""
    if pattern.search(_joined(messages)) is None:
        return None
    return next((m for m in messages if pattern.search(m)), None)


@functools.cache
def generic_hits(match: str) -> dict[str, str]:
    """Family -> the first of its :func:`generic_messages` that ``match`` finds; without one, a suite message
    that only matches quoting a generic error (:func:`quoting_messages`), under its own key.

    Answers are kept between processes (:func:`_answers`): reading and rendering the suite's messages and
    searching them takes about 0.25 s, paid by every process that imports the engines' ledgers (each xdist
    worker, each run of the suite) for the same answers."""
    answers, where = _answers()
    if match not in answers:
        answers[match] = _search_families(match)
        _keep(answers, where)
    return dict(answers[match])


def _search_families(match: str) -> dict[str, str]:
    """:func:`generic_hits`, searched."""
    pattern = re.compile(match)
    hits = {
        family: hit
        for family, messages in generic_messages().items()
        if (hit := _first_match(pattern, messages)) is not None
    }
    if not hits and (hit := _first_match(pattern, quoting_messages())) is not None:
        hits = {f"{SUITE} quoting {PYTHON} or {TORCH}": hit}
    return hits


@functools.cache
def _answers() -> tuple[dict[str, dict[str, str]], Path]:
    """The kept :func:`generic_hits` answers and their file, as Python keeps bytecode: a JSON file in this
    package's ``__pycache__`` named for everything the answers depend on (this module's source, which makes the
    Python and torch messages, the Python and torch versions, and the suite's message files, path and bytes).
    A missing or unreadable file is no answers."""
    import torch

    key = hashlib.blake2b(f"{sys.version} {torch.__version__}".encode(), digest_size=12)
    for path in (Path(__file__), *sorted(p for folder in SUITE_MESSAGE_DIRS for p in folder.glob("*.py"))):
        key.update(f"{path.name}\0".encode())
        key.update(path.read_bytes())
    where = Path(__file__).parent / "__pycache__" / f"ledger-hits-{key.hexdigest()}.json"
    try:
        return json.loads(where.read_text()), where
    except (OSError, ValueError):
        return {}, where


def _keep(answers: dict[str, dict[str, str]], where: Path) -> None:
    """Write ``answers`` to ``where`` (whole, by rename: a concurrent reader sees the old or the new file), unless
    bytecode is not written here (``PYTHONDONTWRITEBYTECODE``) or the folder is read-only."""
    if sys.dont_write_bytecode:
        return
    try:
        where.parent.mkdir(exist_ok=True)
        partial = where.with_name(f"{where.name}.{os.getpid()}")
        partial.write_text(json.dumps(answers))
        os.replace(partial, where)
    except OSError:
        pass


def _types(raises: type[BaseException] | tuple[type[BaseException], ...]) -> tuple[type[BaseException], ...]:
    return raises if isinstance(raises, tuple) else (raises,)


def check_entry(
    raises: type[BaseException] | tuple[type[BaseException], ...], match: str, raised_in: tuple[str, ...]
) -> None:
    """Raise :class:`LedgerError` unless an entry with these fields describes one bug (module docstring)."""
    pattern = re.compile(match)  # a bad pattern is an error where the ledger is written
    for kind in _types(raises):
        if kind in (Exception, BaseException):
            raise LedgerError(f"raises={kind.__name__} is a catch-all: name the exception type the bug raises")
        if issubclass(kind, GuardViolation):
            raise LedgerError(f"raises={kind.__name__}: the suite's guard errors are never an upstream bug")
    for function in raised_in:
        module, sep, qualname = function.partition(":")
        if not (sep and module and qualname):
            raise LedgerError(f"raised_in {function!r} is not 'module:qualname'")
        if module.split(".")[0] in SUITE_PACKAGES:
            raise LedgerError(
                f"raised_in {function!r} is the suite's own code: name the upstream function the bug raises from"
            )
    if pattern.search("") is not None:
        raise LedgerError(f"match={match!r} matches the empty string, so every message: quote the bug's message")
    hits = generic_hits(match)
    if len(hits) > 1:
        found = "; ".join(f"{family} ({hit!r})" for family, hit in hits.items())
        raise LedgerError(f"match={match!r} is near-universal: it matches {found}")
    if hits and not raised_in:
        ((family, hit),) = hits.items()
        raise LedgerError(
            f"match={match!r} matches one of {family} ({hit!r}), which unrelated failures print too: quote what "
            "only this bug prints, or name in raised_in the upstream function(s) ('module:qualname') it raises from"
        )


def frames(exc: BaseException) -> Iterator[str]:
    """``module:qualname`` of every frame of ``exc``'s traceback and of its explicit causes (``raise ... from``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            yield f"{tb.tb_frame.f_globals.get('__name__', '?')}:{getattr(code, 'co_qualname', code.co_name)}"
            tb = tb.tb_next
        current = current.__cause__


_QUALNAMES = hasattr(frames.__code__, "co_qualname")
"""Whether code objects carry their qualified name (Python 3.11+); before, a frame names its function only."""


def raised_from(exc: BaseException, functions: tuple[str, ...]) -> bool:
    """Whether one of ``functions`` (``module:qualname``) is a frame of ``exc``'s traceback (:func:`frames`);
    on Python 3.10 a frame ``module:name`` stands for every ``module:...name`` (its qualname is not recorded)."""
    wanted = set(functions)
    if not _QUALNAMES:
        wanted = {
            f"{module}:{qualname.rpartition('.')[2]}" for module, _, qualname in (f.partition(":") for f in wanted)
        }
    return any(frame in wanted for frame in frames(exc))
