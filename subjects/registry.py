"""Subjects under test: named implementations of the suite's contracts, and how to load them.

A *contract* is one policy protocol (for example NVFP4 MoE alignment). A *subject* bundles one
policy per contract it implements. Three kinds exist:

* ``builtin`` — the suite's correct policies, one for every contract;
* known-bad subjects (``bad-...``) — each reproduces a historical bug in one contract, so the
  properties of that contract are shown to fail;
* external subjects — ``package.module:attribute`` naming a :class:`Subject`, a zero-argument
  callable returning one, or a single policy object whose protocol is that of exactly one contract
  (a policy matching several, such as an ``align_moe`` for both MoE formats, must be bound by a
  :class:`Subject`).

Contract modules call :func:`register_contract` and :func:`register_subject` at import time.
"""

from __future__ import annotations

import enum
import importlib
import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from subjects.ledger import check_entry, raised_from

_CONTRACT_MODULES = (
    "subjects.nvfp4_moe",
    "subjects.mxfp4_linear",
    "subjects.shared_expert",
    "subjects.mxfp4_moe",
    "subjects.fp8_moe",
    "subjects.fp8_tensor_moe",
    "subjects.mxfp8_linear",
    "subjects.moe_sharding",
    "subjects.vllm.subject",
    "subjects.sglang.subject",
    "subjects.sglang.dsv4.subject",
)


class SubjectError(ValueError):
    """A subject name or import path cannot be resolved."""


class ReachKind(enum.Enum):
    """How a deployment meets a ledger entry's defect (:class:`Reach`)."""

    DEFAULT = "default path"
    """With the engine's default flags: a shipped model on the named hardware selects the path itself."""
    FLAG = "flag only"
    """Only behind a flag that is not the default for any shipped model on the named hardware."""
    LATENT = "latent"
    """No shipped model and flag combination reaches it (yet): the code is wrong, no deployment meets it."""


@dataclass(frozen=True)
class Reach:
    """Whether a ledger entry's defect is met in practice: ``kind`` and ``detail``, which names the model and
    configuration (:meth:`default`), the flag (:meth:`flag`) or why nothing reaches it (:meth:`latent`), checked
    against the engine's selection code at its pinned version."""

    kind: ReachKind
    detail: str

    def __post_init__(self) -> None:
        if not self.detail.strip():
            raise ValueError(f"a {self.kind.value} reach names its configuration, flag or reason")

    @classmethod
    def default(cls, where: str) -> Reach:
        """Reached with default flags: ``where`` names the model(s) and configuration."""
        return cls(ReachKind.DEFAULT, where)

    @classmethod
    def flag(cls, flag: str) -> Reach:
        """Reached only behind ``flag`` (the command-line flag or environment variable, and for which models)."""
        return cls(ReachKind.FLAG, flag)

    @classmethod
    def latent(cls, why: str) -> Reach:
        """Reached by no shipped model and flag combination, for the reason ``why``."""
        return cls(ReachKind.LATENT, why)

    def describe(self) -> str:
        return f"{self.kind.value}: {self.detail}"


class Hardware(enum.Enum):
    """The GPU families a ledger entry's path runs on."""

    SM90 = "SM90"
    SM100 = "SM100"
    SM120 = "SM120"
    GFX950 = "gfx950"


@dataclass(frozen=True)
class KnownFailure:
    """An upstream bug a subject is known to have: where it applies and what it looks like.

    A check of ``contract`` (``check`` names one ``check_*`` function, None means any) on
    ``backend`` (None: any) whose configuration satisfies ``applies`` is expected to fail *the
    documented way*: with an exception of type ``raises`` whose message matches the regular
    expression ``match`` (``re.search``). Only that failure is recorded as expected; any other
    exception there (an ``ImportError`` from a broken adapter, a ``TypeError``, another
    assertion) fails the example as usual, a missing library skips it, and a pass raises an
    alert that the bug is fixed. When the bug is caught by the property itself, ``raises`` is
    ``AssertionError`` and ``match`` quotes the property's assertion message together with what
    only this bug puts in it (a backend, a tensor, the upstream message the property quotes).

    ``raised_in`` names upstream functions (``module:qualname``), one of which must be a frame of
    the failure's traceback (or of its ``raise ... from`` cause): required where ``match`` alone
    is generic. The entry is checked where it is written (:func:`subjects.ledger.check_entry`):
    catch-all types and patterns raise :class:`subjects.ledger.LedgerError`.
    """

    contract: str
    reason: str
    link: str
    applies: Callable[[Any], bool]
    raises: type[BaseException] | tuple[type[BaseException], ...]
    match: str
    backend: str | None = None
    check: str | None = None
    raised_in: tuple[str, ...] = ()
    _: KW_ONLY
    reach: Reach
    hardware: tuple[Hardware, ...]

    def __post_init__(self) -> None:
        check_entry(self.raises, self.match, self.raised_in)
        if not isinstance(self.reach, Reach):
            raise TypeError(f"reach must be a Reach, not {self.reach!r}")
        if not self.hardware or not all(isinstance(h, Hardware) for h in self.hardware):
            raise TypeError(f"hardware must be a non-empty tuple of Hardware members, not {self.hardware!r}")

    def matches(self, contract: str, check: str, backend: str | None, config: Any) -> bool:
        """Whether a check run is where this bug applies (before it runs)."""
        return (
            self.contract == contract
            and self.check in (None, check)
            and self.backend in (None, backend)
            and self.applies(config)
        )

    def recognises(self, exc: BaseException) -> bool:
        """Whether ``exc`` is this bug: its type is ``raises``, its message matches ``match`` and,
        with ``raised_in``, one of those functions is on its traceback."""
        return (
            isinstance(exc, self.raises)
            and re.search(self.match, str(exc)) is not None
            and (not self.raised_in or raised_from(exc, self.raised_in))
        )

    def describe(self) -> str:
        """``TypeName matching 'pattern'`` (``raised in f, g``), for messages about unrecognised failures."""
        types = self.raises if isinstance(self.raises, tuple) else (self.raises,)
        where = f" raised in {' or '.join(self.raised_in)}" if self.raised_in else ""
        return f"{' or '.join(t.__name__ for t in types)} matching {self.match!r}{where}"


@dataclass(frozen=True)
class Subject:
    """A named implementation: ``policies`` maps contract name -> policy object."""

    name: str
    description: str
    policies: Mapping[str, Any]
    reproduces: str = ""
    known_failures: tuple[KnownFailure, ...] = field(default=())
    missing: Callable[[], str | None] | None = None
    """Why this subject cannot run on this machine (None when it can), asked once before the first
    test: an engine subject whose engine is not installed is a usage error, not a run of skips or
    failures. It should be cheap (look for the package, do not import it)."""
    context: Callable[[], AbstractContextManager[object]] | None = None
    """Entered around each property test's examples (the ``policy`` fixture): what an engine process sets up
    once for all its layers rather than once per layer (SGLang's published ``ServerArgs``,
    :func:`subjects.sglang.layer.shared_server_args`). None: nothing."""

    def policy(self, contract: str) -> Any | None:
        return self.policies.get(contract)


_CONTRACTS: dict[str, type] = {}
_BACKENDS: dict[str, tuple[enum.Enum, ...]] = {}
_BUILTIN_POLICIES: dict[str, Any] = {}
_SUBJECTS: dict[str, Subject] = {}
_loaded = False


def register_contract(name: str, protocol: type, builtin: Any, backends: tuple[enum.Enum, ...] = ()) -> None:
    """Declare contract ``name``: its runtime-checkable ``protocol``, correct policy and backends."""
    _CONTRACTS[name] = protocol
    _BACKENDS[name] = backends
    _BUILTIN_POLICIES[name] = builtin


def register_subject(subject: Subject) -> Subject:
    """Add a named subject (known-bad or adapter) to the registry."""
    _SUBJECTS[subject.name] = subject
    return subject


def _load() -> None:
    global _loaded
    if not _loaded:
        for module in _CONTRACT_MODULES:
            importlib.import_module(module)
        _loaded = True


def contracts() -> dict[str, type]:
    """Contract name -> protocol class."""
    _load()
    return dict(_CONTRACTS)


def backends(contract: str) -> tuple[enum.Enum, ...]:
    """The kernel-library backends a contract's properties run against (may be empty)."""
    _load()
    return _BACKENDS[contract]


def all_backends() -> tuple[enum.Enum, ...]:
    """Every backend of every contract."""
    _load()
    return tuple(b for bs in _BACKENDS.values() for b in bs)


def builtin() -> Subject:
    """The suite's correct subject, implementing every contract."""
    _load()
    return Subject("builtin", "the suite's correct policies", dict(_BUILTIN_POLICIES))


def named_subjects() -> dict[str, Subject]:
    """Every subject selectable by name: ``builtin`` and the registered ones."""
    _load()
    return {"builtin": builtin(), **_SUBJECTS}


def known_bad() -> dict[str, Subject]:
    """Subjects that reproduce a historical bug (name starts with ``bad-``)."""
    return {n: s for n, s in named_subjects().items() if n.startswith("bad-")}


def _from_object(obj: Any, spec: str) -> Subject:
    """The subject ``spec`` names: a :class:`Subject`, a policy class or object, or a factory.

    A bare policy is bound to every contract whose protocol it implements (one object may implement
    several protocols: a linear guard and a shared-expert gate). Several contracts share one protocol
    (``nvfp4_moe`` and ``mxfp4_moe`` both take ``align_moe``), and a policy written for one of them fails
    the other's properties on every example: a policy matching contracts that share a protocol is a
    :class:`SubjectError` naming them and the ``Subject(...)`` that binds it.
    """
    if isinstance(obj, Subject):
        return obj
    if isinstance(obj, type):  # a policy class: protocol checks would pass on the class itself
        return _from_object(obj(), spec)
    protocols = contracts()
    matched = sorted(name for name, proto in protocols.items() if isinstance(obj, proto))
    shared = sorted(name for name in matched if sum(protocols[m] is protocols[name] for m in matched) > 1)
    if shared:
        raise SubjectError(
            f"{spec} is a bare policy whose protocol several contracts share ({', '.join(shared)}); bind it "
            f"to the contract(s) it is written for with a subjects.registry.Subject: SUBJECT = Subject('my-engine', "
            f"'what it does', {{CONTRACT: {type(obj).__name__}()}}), CONTRACT one of {', '.join(map(repr, shared))}, "
            f"then --subject {spec.partition(':')[0]}:SUBJECT"
        )
    if matched:
        return Subject(spec, f"external policy {spec}", {name: obj for name in matched})
    if callable(obj):
        return _from_object(obj(), spec)
    raise SubjectError(
        f"{spec} is neither a Subject nor a policy implementing one of the contracts "
        f"{sorted(contracts())} (see subjects/*.py for each protocol)"
    )


def resolve(spec: str) -> Subject:
    """Resolve ``spec``: a registered name, or ``package.module:attribute``.

    Raises :class:`SubjectError` with the list of known names, or the import problem.
    """
    subjects = named_subjects()
    if spec in subjects:
        return subjects[spec]
    if ":" not in spec:
        raise SubjectError(
            f"unknown subject {spec!r}; known subjects: {', '.join(sorted(subjects))}; "
            "or give an import path 'package.module:attribute'"
        )
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SubjectError(f"cannot import module {module_name!r} for subject {spec!r}: {exc}") from exc
    if not hasattr(module, attr):
        raise SubjectError(f"module {module_name!r} has no attribute {attr!r} (subject {spec!r})")
    return _from_object(getattr(module, attr), spec)
