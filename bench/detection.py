"""Detection power of the suite, measured in-process on the bare ``check_*`` functions.

A *property* is one ``@given`` test of the conformance modules, the check it runs and one backend.
Hypothesis's generation does not depend on a test's outcome before its first failure (the CPU
checks call neither ``target()`` nor ``assume()``), so a recording test with the same strategy,
seed and ``max_examples`` draws exactly the configurations the real test would see; the bench
draws them once and calls each check directly (no pytest, no subprocess). Each test draws under
its own seed (:func:`property_seed`), as the ``ci`` profile's per-test derandomization does.

Three figures per known-bad subject (examples count per property; a subject is caught at the
fewest examples any of its properties needed); the 25-example ones over every seed, the
``budget``-example ones over the first ``rate_seeds`` seeds:

* **with pins**: the ``ci`` run as shipped: pinned ``@example`` s first, then 25 generated
  examples per property;
* **generation only**: no pins; 25 examples per property (the ``ci`` profile's budget: caught
  seeds out of N is the ci-without-pins catch rate), and up to ``budget`` examples for the
  median / worst examples to the first failure and the per-example failure rate;
* **search power**: the same ``budget`` examples after the *seed-independent prefix* (the leading
  examples every seed draws identically, such as Hypothesis's simplest example), so a bug that
  only the simplest shape shows does not count as found by search.

The failure rate of a subject is that of its best property (failing examples / examples drawn,
over all seeds), named in the report.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import statistics
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.strategies import SearchStrategy

from adapters.flashinfer import LibraryUnavailable
from backends import record
from harness import hardware
from harness.inputs import guard_inputs
from subjects.registry import Subject, backends

CHECK_MODULES = (
    "conformance.test_nvfp4_moe",
    "conformance.test_mxfp4_moe",
    "conformance.test_fp8_moe",
    "conformance.test_fp8_tensor_moe",
    "conformance.test_mxfp4_linear",
    "conformance.test_mxfp8_linear",
    "conformance.test_shared_expert",
    "conformance.test_moe_sharding",
)
CI_EXAMPLES = 25
"""Examples per property under the ``ci`` profile (``harness.profiles``)."""
GOAL_SEEDS = 0.95
"""A subject meets the goal when ci without pins catches it on at least this share of seeds (19/20) ..."""
GOAL_RATE = 0.10
"""... and its search-power failure rate is at least this."""


@dataclasses.dataclass(frozen=True)
class Property:
    """One property as the suite runs it: ``check(config, backend, policy)`` on configs from ``strategy``."""

    test: str
    check: Callable[..., None]
    strategy: SearchStrategy[Any]
    pins: tuple[Any, ...]
    backend: enum.Enum | None

    @property
    def name(self) -> str:
        return f"{self.test}[{self.backend.value}]" if self.backend is not None else self.test


def _marks(obj: Any) -> list[Any]:
    marks = getattr(obj, "pytestmark", [])
    return list(marks) if isinstance(marks, list | tuple) else [marks]


def _runnable_here(names: set[str], machine: hardware.Machine) -> bool:
    return not any(hardware.missing(r, machine) for r in hardware.REQUIREMENTS if r in names)


def _test_backends(
    test: Callable[..., Any], contract: str, marks: list[Any], machine: hardware.Machine
) -> tuple[enum.Enum | None, ...]:
    """The backends pytest runs ``test`` against on ``machine``, as the plugin parametrizes them: the
    contract's records (narrowed by ``@pytest.mark.backends``), each gated by its record's markers.

    A contract without backends of its own (``moe_sharding``, whose tests take a format's backends) is
    measured on the first of them only: its built-in and known-bad policies do not read the backend (only
    engine adapters pick a loader by it), so the others repeat the same verdicts at many times the cost."""
    if "backend" not in inspect.signature(test.hypothesis.inner_test).parameters:
        return (None,)
    chosen = next((m for m in marks if m.name == "backends"), None)
    members, kernel = (chosen.args, chosen.kwargs.get("kernel", False)) if chosen else ((), False)
    out = []
    for member in members or backends(contract):
        r = record(member)
        if kernel and not r.kernel_requires:
            continue
        if _runnable_here({*r.requires, *(r.kernel_requires if kernel else ())}, machine):
            out.append(member)
    return tuple(out) if backends(contract) else tuple(out[:1])


def checks_of_module(module_name: str, contract: str) -> list[Callable[..., None]]:
    """The ``@check`` functions of ``contract`` defined in one conformance module."""
    module = importlib.import_module(module_name)
    return [fn for fn in vars(module).values() if getattr(fn, "__fp4_check__", (None,))[0] == contract]


def properties(contract: str, machine: hardware.Machine | None = None) -> list[Property]:
    """Every property of ``contract`` in :data:`CHECK_MODULES` that can run on ``machine``, per backend.

    A test's check is the one it was generated from (:func:`harness.properties.check`), else the one
    ``@check`` function of its module its body names; its pins are its ``@example`` configurations
    in the order Hypothesis runs them.
    """
    machine = machine or hardware.machine()
    out = []
    for module_name in CHECK_MODULES:
        module = importlib.import_module(module_name)
        checks = {f.__name__: f for f in checks_of_module(module_name, contract)}
        for name, test in vars(module).items():
            handle = getattr(test, "hypothesis", None)
            marks = _marks(test) + _marks(module)
            if not name.startswith("test_") or handle is None or not _runnable_here({m.name for m in marks}, machine):
                continue
            generated_from = getattr(handle.inner_test, "__fp4_property__", None)  # harness.properties.check
            if generated_from is not None:
                called = [generated_from] if generated_from.__name__ in checks else []
            else:
                called = [checks[n] for n in handle.inner_test.__code__.co_names if n in checks]
            if len(called) != 1 or len(handle._given_kwargs) != 1:
                continue
            ((argname, strategy),) = handle._given_kwargs.items()
            explicit = reversed(getattr(test, "hypothesis_explicit_examples", ()))
            pins = tuple(ex.kwargs[argname] for ex in explicit if argname in ex.kwargs)
            for backend in _test_backends(test, contract, marks, machine):
                out.append(Property(f"{module_name.rpartition('.')[2]}::{name}", called[0], strategy, pins, backend))
    return out


def generated(strategy: SearchStrategy[Any], seed: int, max_examples: int) -> list[Any]:
    """The configurations Hypothesis's generate phase runs, in order, for ``strategy`` under ``seed``."""
    seen: list[Any] = []

    @settings(
        max_examples=max_examples,
        database=None,
        deadline=None,
        derandomize=False,
        phases=(Phase.generate, Phase.target),
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis_seed(seed)
    @given(strategy)
    def record(config: Any) -> None:
        seen.append(config)

    record()
    return seen


def property_seed(test: str, seed: int) -> int:
    """The Hypothesis seed of property ``test`` under bench seed ``seed``.

    The ``ci`` profile derandomizes per test function, so two tests draw independent sequences
    while the backends of one test share its sequence; the bench does the same.
    """
    return zlib.crc32(f"{test}:{seed}".encode())


def common_prefix(sequences: Sequence[Sequence[Any]]) -> int:
    """Length of the longest prefix all ``sequences`` share (configurations compared as JSON)."""
    if len(sequences) < 2:
        return 0
    n = 0
    for column in zip(*sequences, strict=False):
        if len({c.to_json() for c in column}) != 1:
            break
        n += 1
    return n


class Draws:
    """Generated sequences per (strategy, seed, max_examples), drawn once and shared by properties."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, int], list[Any]] = {}

    def get(self, strategy: SearchStrategy[Any], seed: int, max_examples: int) -> list[Any]:
        key = (repr(strategy), seed, max_examples)
        if key not in self._cache:
            self._cache[key] = generated(strategy, seed, max_examples)
        return self._cache[key]

    def of(self, prop: Property, seed: int, max_examples: int) -> list[Any]:
        """The sequence property ``prop`` draws under bench seed ``seed`` (:func:`property_seed`)."""
        return self.get(prop.strategy, property_seed(prop.test, seed), max_examples)


Costs = dict[str, list[float]]
"""Seconds and examples per property name, ``[total, count]``: what :class:`Outcomes` has timed."""


class Outcomes:
    """Whether a property's check fails on a configuration, each pair evaluated once and timed.

    ``costs`` (optional) is shared by the subjects of one run: a property costs about the same whichever
    subject it checks, so a later subject orders its properties by what earlier ones timed."""

    def __init__(self, subject: Subject, costs: Costs | None = None) -> None:
        self.subject = subject
        self._cache: dict[tuple[str, str], bool] = {}
        self._seconds: Costs = {} if costs is None else costs
        self.unavailable: set[str] = set()

    def fails(self, prop: Property, config: Any) -> bool:
        key = (prop.name, config.to_json())
        if key not in self._cache:
            policy = guard_inputs(self.subject.policy(prop.check.__fp4_check__[0]))
            start = time.perf_counter()
            try:
                prop.check(config, prop.backend, policy)
                self._cache[key] = False
            except LibraryUnavailable:  # a library this machine lacks: not run, not a catch
                self.unavailable.add(prop.name)
                self._cache[key] = False
            except Exception:  # noqa: BLE001 - any failure of a check is a catch
                self._cache[key] = True
            timing = self._seconds.setdefault(prop.name, [0.0, 0])
            timing[0] += time.perf_counter() - start
            timing[1] += 1
        return self._cache[key]

    def time_each(self, runs: Sequence[tuple[Property, Sequence[Any]]]) -> None:
        """Run the first example of each property not timed yet (for this subject or an earlier one sharing the
        costs), so that :meth:`first_failure` runs the cheapest properties first."""
        for prop, seq in runs:
            if seq and not self.cost(prop):
                self.fails(prop, seq[0])

    def cost(self, prop: Property) -> float:
        """Mean seconds per example of ``prop`` so far (0 before its first)."""
        total, count = self._seconds.get(prop.name, (0.0, 0))
        return total / count if count else 0.0

    def first_failure(self, runs: Sequence[tuple[Property, Sequence[Any]]]) -> tuple[int, Property] | None:
        """The fewest examples any property needs to fail on its sequence, and that property.

        Properties run in rounds, example ``i`` of every property (cheapest first) before example ``i + 1``
        of any, so no property runs past the first failing example's index (on a tie the cheaper property
        is named).
        """
        ordered = sorted(runs, key=lambda r: self.cost(r[0]))
        for i in range(max((len(seq) for _, seq in ordered), default=0)):
            for prop, seq in ordered:
                if i < len(seq) and self.fails(prop, seq[i]):
                    return i + 1, prop
        return None


@dataclasses.dataclass
class Figure:
    """Examples to the first failure per seed (None: not caught within the budget) and a failure rate."""

    label: str
    budget: int
    firsts: list[int | None]
    failures: int = 0
    examples: int = 0
    best_property: str | None = None

    @property
    def caught(self) -> int:
        return sum(f is not None for f in self.firsts)

    @property
    def rate(self) -> float | None:
        return self.failures / self.examples if self.examples else None

    def row(self) -> dict[str, Any]:
        """Counts per seed; a seed that never failed counts as ``budget + 1`` (shown as ``>budget``)."""
        values = [self.budget + 1 if f is None else f for f in self.firsts]

        def shown(x: float) -> float | str | None:
            return None if not values else f">{self.budget}" if x > self.budget else x

        return {
            "caught": f"{self.caught}/{len(self.firsts)}",
            "budget": self.budget,
            "median_examples": shown(statistics.median(values)) if values else None,
            "worst_examples": shown(max(values)) if values else None,
            "failure_rate": None if self.rate is None else round(self.rate, 4),
            "failing_examples": f"{self.failures}/{self.examples}" if self.examples else None,
            "best_property": self.best_property,
        }


@dataclasses.dataclass
class Detection:
    """The three figures of one subject."""

    subject: str
    reproduces: str
    properties: int
    prefix: int
    pins: Figure
    ci: Figure
    generation: Figure
    search: Figure
    counterexample: str | None

    def shortfall(self) -> str:
        """Why the subject misses the goal ('' when it meets it)."""
        why = []
        seeds = len(self.ci.firsts)
        if self.ci.caught < GOAL_SEEDS * seeds:
            why.append(f"ci without pins catches it on {self.ci.caught}/{seeds} seeds")
        if self.search.rate is not None and self.search.rate < GOAL_RATE:
            why.append(f"search-power rate {100 * self.search.rate:.1f} % (best: {self.search.best_property})")
        if not self.properties:
            why.append("no property of its contracts runs on this machine")
        return "; ".join(why)

    def row(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "reproduces": self.reproduces,
            "properties": self.properties,
            "prefix": self.prefix,
            "with_pins": self.pins.row(),
            "ci_without_pins": self.ci.row(),
            "generation": self.generation.row(),
            "search_power": self.search.row(),
            "counterexample": self.counterexample,
            "shortfall": self.shortfall(),
        }


def _subject_properties(subject: Subject) -> list[Property]:
    """The properties of every contract ``subject`` implements, on this machine."""
    return [p for contract in subject.policies for p in properties(contract)]


def _ci_runs(props: Sequence[Property], seed: int, draws: Draws) -> list[tuple[Property, list[Any]]]:
    """Each property with its ``ci``-profile sequence under bench seed ``seed``: the 25 generated examples the
    ``ci`` run draws, no pins."""
    return [(p, draws.of(p, seed, CI_EXAMPLES)) for p in props]


def caught_without_pins(
    subject: Subject, seed: int, draws: Draws | None = None, costs: Costs | None = None
) -> tuple[int, str] | None:
    """:func:`detect`'s *ci without pins* figure for one seed alone: the fewest generated examples any property
    of ``subject`` needs to fail (of the ``ci`` run's 25, no pins) and that property's name, or ``None``.

    What ``python -m bench --quick`` requires of every mutant of :data:`bench.mutants.CI_MUTANTS`, without the
    examples of the other figures (the pins, the ``budget`` sequences); the same examples, in the same order
    (:meth:`Outcomes.first_failure`), so the same answer."""
    outcomes = Outcomes(subject, costs)
    runs = _ci_runs(_subject_properties(subject), seed, draws or Draws())
    outcomes.time_each(runs)
    hit = outcomes.first_failure(runs)
    return None if hit is None else (hit[0], hit[1].name)


def detect(
    subject: Subject,
    seeds: Sequence[int],
    budget: int,
    rate_seeds: int | None = None,
    draws: Draws | None = None,
    costs: Costs | None = None,
    rates: bool = True,
) -> Detection:
    """Measure the three figures for ``subject``.

    Over every seed: pins then the 25-example ci sequence, and the 25-example sequence alone.
    Over the first ``rate_seeds`` seeds (all when None), the ``budget``-example sequences: from
    their start and after the seed-independent prefix (common to those seeds). Each figure stops
    at the first failure of any property (:meth:`Outcomes.first_failure`). Failure rates then
    evaluate every example of those ``budget`` sequences for the properties that caught the
    subject first somewhere (the property with the best rate is among them unless it never fails
    first; the slow reference checks are spared where a cheap check catches the same bug).
    Sequences depend on the property and the seed only, so subjects of one contract share ``draws``, and
    subjects of one run share ``costs`` (:class:`Outcomes`). ``rates=False`` leaves the failure rates out
    (``python -m bench --quick``: its gate reads the examples to the first failure only).
    """
    props, draws, outcomes = _subject_properties(subject), draws or Draws(), Outcomes(subject, costs)
    drawn = draws.of
    searched = list(seeds)[: rate_seeds or len(seeds)]
    prefix = {p.test: common_prefix([drawn(p, seed, budget) for seed in searched]) for p in props}
    outcomes.time_each(_ci_runs(props, seeds[0], draws))
    figures = {
        "pins": Figure("with pins", CI_EXAMPLES, []),
        "ci": Figure("ci without pins", CI_EXAMPLES, []),
        "generation": Figure("generation only", budget, []),
        "search": Figure("search power", budget, []),
    }
    catchers: dict[str, Property] = {}
    counterexample = None
    for seed in seeds:
        ci = _ci_runs(props, seed, draws)
        runs = {"pins": [(p, [*p.pins, *generated]) for p, generated in ci], "ci": ci}
        if seed in searched:
            runs["generation"] = [(p, drawn(p, seed, budget)) for p in props]
            runs["search"] = [(p, drawn(p, seed, budget)[prefix[p.test] :]) for p in props]
        for key, run in runs.items():
            hit = outcomes.first_failure(run)
            figures[key].firsts.append(hit[0] if hit else None)
            if hit is None:
                continue
            n, prop = hit
            catchers[prop.name] = prop
            if key == "search" and counterexample is None:
                config = dict(run)[prop][n - 1]
                counterexample = f"{prop.name}: {config.describe() if hasattr(config, 'describe') else config}"
    tallies: dict[str, dict[str, tuple[int, int]]] = {"generation": {}, "search": {}}
    for prop in catchers.values() if rates else ():
        skip = prefix[prop.test]
        fails = [[outcomes.fails(prop, c) for c in drawn(prop, seed, budget)] for seed in searched]
        tallies["generation"][prop.name] = (sum(map(sum, fails)), sum(map(len, fails)))
        tallies["search"][prop.name] = (sum(sum(f[skip:]) for f in fails), sum(len(f[skip:]) for f in fails))
    for key, by_prop in tallies.items():
        if by_prop:
            best, (failures, examples) = max(by_prop.items(), key=lambda kv: (kv[1][0] / max(kv[1][1], 1), kv[0]))
            figures[key].failures, figures[key].examples, figures[key].best_property = failures, examples, best
    return Detection(
        subject.name,
        subject.reproduces,
        len(props),
        max(prefix.values(), default=0),
        figures["pins"],
        figures["ci"],
        figures["generation"],
        figures["search"],
        counterexample,
    )
