"""pytest plugin of the conformance suite: options, profiles, subjects, gating, triage output.

Options (``pytest --help``, group "fp4-conformance"):

* ``--subject SPEC``: the implementation under test: ``builtin`` (default), a known-bad name
  (``bad-...``), ``vllm``, or ``package.module:attribute``. A subject that cannot be loaded (a
  typo, a module raising on import, a factory raising) or whose engine is not installed is a
  one-line usage error before the first test.
* ``--backend NAME``: run only this kernel-library backend (repeatable); properties on other
  backends, and properties that run on no backend, are deselected.
* ``--model NAME``, ``--tp N``, ``--ep/--no-ep``: pin the strategies (see :func:`session_pin`).
* ``--fp4-db SPEC``: example database (a directory, or ``redis://HOST:PORT/DB`` shared by a
  fleet; :mod:`harness.database`), ``--fp4-db-readonly`` to replay a shared one without writing;
  a database that cannot be used is a usage error.
* ``--shard INDEX/COUNT``: run one deterministic slice of the collected tests (:mod:`harness.shard`).
* ``--results DIR``: where reproduction scripts, the summary and the run's records are written
  (``results``); it must be writable, checked before the first test. One run at a time: the run
  locks the folder, and a second run given the same folder is a usage error before its first
  test (:func:`harness.records.lock`). The run marks the folder ``running`` at its start,
  rewrites ``summary.json`` after every test, records the test each process is running under
  ``inflight/``, and marks the folder ``complete`` at its end (:mod:`harness.records`), so a
  crashed, killed or hung run leaves a failing record naming the test it died in.
* ``--example-time-limit SECONDS``: per-example time limit (default: the profile's,
  :data:`harness.profiles.TIME_LIMITS`; 0 turns it off).
* ``--fp4-progress SECONDS``: under xdist, name each test still running after this long
  (:mod:`harness.progress`; 0 turns it off).

The header says what runs: the subject and the contracts it is bound to, the Hypothesis profile
and example database, the pins and a pinned model's layers. Tests of contracts the subject does
not implement, or whose layer the pinned model lacks, are deselected and counted in one line.

Markers: ``contract(name)`` names a test's contract; ``backends(*members, kernel=False)`` narrows
the ``backend`` parameters (which come from the backend records, :mod:`backends`; the ``check``
decorator of :mod:`harness.properties` sets it); ``cuda``, ``sm90``, ``sm100``, ``gfx950``,
``flashinfer``, ``aiter``, ``aiter_triton``, ``vllm`` name requirements, and a test whose
requirement is unmet is skipped with a reason that names what is missing.

Harness state lives in ``config.stash``: :data:`harness.runner.RUN_STATE` (what the
property runner needs) and :data:`SESSION` (the subject, the results folder, the summary).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from hypothesis import settings

from harness import database, devices, hardware, profiles, progress, records, repro, runner, shard
from harness.inputs import guard_inputs
from harness.report import expected_rows, reach_totals
from strategies.catalog import MODELS, TP_DEGREES
from strategies.pins import Pin, set_pin
from strategies.presence import absent_layers, pinned_layers

profiles.register_profiles()

MARKERS = {
    "contract(name)": "the contract (subject protocol) a property checks",
    "backends(*members, kernel=False)": "run only against these backends (or those whose record has a kernel)",
    **{name: f"requires {what}" for name, what in hardware.REQUIREMENTS.items()},
}


@dataclass(eq=False)
class Session:
    """The plugin's per-process state (``config.stash[SESSION]``), registered as a plugin object
    so that it counts every report (on the xdist controller, the workers' reports too).

    Compared by identity (``eq=False``): pluggy keeps plugins in sets, and hashes every plugin
    once some folder's ``conftest.py`` is out of scope for a test.

    On the controller (the process that owns the results folder) ``lock`` holds the folder,
    ``record`` is the run's ``run.json`` and ``summary.json`` is rewritten after every counted
    report; ``moved`` is where an earlier unfinished run's records went (:func:`records.start`).
    """

    subject: Any
    results: Path
    pin: Pin
    profile: str
    shard: tuple[int, int] | None = None
    summary: dict[tuple[str, str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    skips: dict[tuple[str, str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    lock: IO[str] | None = None
    record: dict[str, Any] | None = None
    moved: Path | None = None
    database: str = "none"
    absent: dict[str, str] = field(default_factory=dict)
    deselected: Counter = field(default_factory=Counter)
    watch: progress.Progress | None = None

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        """Time the test for the progress lines (on the xdist controller, each worker's test start)."""
        if self.watch is not None:
            self.watch.started(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Count the outcome per (contract, backend, hardware), and the skip reasons."""
        if self.watch is not None and report.when == "teardown":
            self.watch.finished(report.nodeid)
        if report.when != "call" and not (report.skipped or report.failed):
            return
        props = dict(report.user_properties)
        key = (props.get("contract", "?"), props.get("backend", "-"), props.get("hardware", "?"))
        outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        if hasattr(report, "wasxfail") and report.passed:
            outcome = "xpassed"
        self.summary[key][outcome] += 1
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips[key][skip_reason(report)] += 1
        if self.record is not None:
            records.write_json(self.results / records.SUMMARY, summary_rows(self))


SESSION = pytest.StashKey[Session]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fp4-conformance")
    group.addoption("--subject", default="builtin", help="subject under test: builtin, bad-..., vllm, or module:attr")
    group.addoption("--backend", action="append", default=[], help="run only this backend (repeatable)")
    group.addoption("--model", help=f"pin strategies to a catalogued model ({', '.join(sorted(MODELS))})")
    group.addoption(
        "--tp",
        type=int,
        help=f"pin the tensor-parallel degree ({', '.join(map(str, TP_DEGREES))}); without --model every "
        "drawn shape (catalogued and adversarial) uses it",
    )
    group.addoption(
        "--ep",
        action="store_true",
        default=None,
        help="pin expert parallelism on (default: off under --model, drawn either way otherwise)",
    )
    group.addoption("--no-ep", dest="ep", action="store_false", default=None, help="pin expert parallelism off")
    group.addoption(
        "--fp4-db",
        help="example database: a directory or redis://HOST:PORT/DB (or FP4_DB); used by every profile but ci",
    )
    group.addoption(
        "--fp4-db-readonly", action="store_true", help="replay the shared (Redis) database without writing to it"
    )
    group.addoption("--shard", help="run only shard INDEX of COUNT (INDEX/COUNT, e.g. 0/4), split by node id")
    group.addoption("--results", default="results", help="folder for reproduction scripts and the summary")
    group.addoption(
        "--example-time-limit",
        type=float,
        help="fail an example running longer than this many seconds (default: the profile's; 0: off)",
    )
    group.addoption(
        "--fp4-progress",
        type=float,
        default=progress.DEFAULT_AFTER_S,
        metavar="SECONDS",
        help="print one line for each test still running after this many seconds, and again each such "
        f"interval (default {progress.DEFAULT_AFTER_S:g}; 0: off)",
    )


def session_pin(model: str | None, tp: int | None, ep: bool | None) -> Pin:
    """The strategies' pin for ``--model/--tp/--ep``.

    * ``--model M``: only M's catalogued shapes (no adversarial sizes); pinned regressions of
      other models are skipped.
    * ``--tp N``: every drawn shape uses TP degree N; without ``--model`` that includes the
      adversarial sizes, and the pinned regressions kept are the catalogued ones at TP N.
    * ``--ep`` / ``--no-ep``: expert parallelism on / off. Neither given: off under ``--model``
      (a triage run reproduces a TP deployment unless told otherwise), else drawn both ways.
    """
    if ep is None and model is not None:
        ep = False
    return Pin(model, tp, ep)


WEEK_S = 7 * 24 * 3600  # the largest --example-time-limit


def _usage(message: str) -> pytest.UsageError:
    return pytest.UsageError(" ".join(message.split()))  # one line


@pytest.hookimpl(tryfirst=True)  # before Hypothesis's own, which would load an unknown profile with a traceback
def pytest_configure(config: pytest.Config) -> None:
    devices.pin_worker()
    for marker, text in MARKERS.items():
        config.addinivalue_line("markers", f"{marker}: {text}")
    try:
        name = profiles.selected_profile(config.getoption("hypothesis_profile", None))
    except ValueError as exc:
        raise _usage(str(exc)) from None
    spec = config.getoption("fp4_db") or os.environ.get("FP4_DB")
    readonly = config.getoption("fp4_db_readonly")
    db = None
    if spec or readonly or name in profiles.DATABASE_PROFILES:
        try:
            db = database.open_database(spec, readonly=readonly)
        except database.DatabaseError as exc:
            raise _usage(str(exc)) from None
    try:
        settings.load_profile(profiles.with_database(name, db, explicit=bool(spec)))
    except ValueError as exc:
        raise _usage(str(exc)) from None
    shard_spec = None
    if config.getoption("shard"):
        try:
            shard_spec = shard.parse_shard(config.getoption("shard"))
        except ValueError as exc:
            raise _usage(str(exc)) from None
    model, tp = config.getoption("model"), config.getoption("tp")
    if model is not None and model not in MODELS:
        raise _usage(f"--model {model!r} is not catalogued; choose one of: {', '.join(sorted(MODELS))}")
    if tp is not None and tp not in TP_DEGREES:
        raise _usage(f"--tp {tp} is not one of {TP_DEGREES}")
    limit = config.getoption("example_time_limit")
    if limit is not None and not 0 <= limit <= WEEK_S:  # also NaN; the timers overflow near 1e12 s
        raise _usage(
            f"--example-time-limit {limit:g}: give the seconds an example may run, at most {WEEK_S} (0: no limit)"
        )
    every = config.getoption("fp4_progress")
    if not 0 <= every <= WEEK_S:
        raise _usage(f"--fp4-progress {every:g}: give the seconds after which a running test is named (0: never)")
    pin = session_pin(model, tp, config.getoption("ep"))
    set_pin(pin)
    subject_spec = config.getoption("subject")
    subject = _load_subject(subject_spec)
    from subjects.registry import all_backends

    known = {b.value for b in all_backends()}
    unknown = sorted(set(config.getoption("backend")) - known)
    if unknown:
        raise _usage(f"unknown backend(s) {', '.join(unknown)}; known backends: {', '.join(sorted(known))}")
    results = Path(config.getoption("results"))
    try:
        profiles.check_writable_folder(results)
    except OSError as exc:
        raise _usage(f"--results {str(results)!r} is not a writable folder: {exc}") from None
    controller = not hasattr(config, "workerinput") and not informational(config)
    try:
        lock = records.lock(results) if controller else None
    except records.ResultsBusy as exc:
        raise _usage(str(exc)) from None
    limit = profiles.TIME_LIMITS[name] if limit is None else limit
    state = runner.RunState(
        subject=subject_spec,
        subject_path=repro.import_folder(subject_spec),
        known_failures=subject.known_failures,
        results=results,
        time_limit=limit or None,
    )
    config.stash[runner.RUN_STATE] = state
    config.stash[SESSION] = session = Session(subject, results, pin, name, shard_spec, lock=lock)
    session.database = database.describe(settings.get_profile(name).database)
    session.absent = absent_layers(pin)
    config.pluginmanager.register(session, "fp4-session")
    runner.activate(state)
    if controller:
        _start_run(config, session)
        if every and getattr(config.option, "numprocesses", None):  # xdist: its controller runs no test
            session.watch = progress.Progress(every, progress.writer(config))


INFORMATIONAL_OPTIONS = ("help", "version", "markers", "showfixtures", "show_fixtures_per_test")
"""pytest options that print and exit without a session: such a run neither locks nor marks the results folder."""


def informational(config: pytest.Config) -> bool:
    """Whether this pytest invocation only prints (``--help``, ``--version``, ``--markers``, ``--fixtures``...)."""
    return any(getattr(config.option, name, False) for name in INFORMATIONAL_OPTIONS)


def _start_run(config: pytest.Config, session: Session) -> None:
    """Controller: mark the folder running (:func:`records.start`), then clear the last run's records.

    ``run.json`` says ``running`` before anything of the earlier run is removed, so no moment
    of the run shows the earlier run's records as the folder's result. The JUnit file is
    recorded relative to the folder when it is written inside it (the report then requires it).
    """
    results = session.results
    xml = config.getoption("xmlpath", None)
    if xml:
        inside = Path(os.path.abspath(xml)).parent == Path(os.path.abspath(results))
        xml = Path(xml).name if inside else os.path.abspath(xml)
    session.record = records.run_record(
        subject=config.getoption("subject"),
        profile=session.profile,
        shard=config.getoption("shard"),
        workers=getattr(config.option, "numprocesses", None),
        hardware=hardware.machine().describe(),
        junitxml=xml,
    )
    session.moved = records.start(results, session.record)
    stale = [
        p
        for pattern in ("device-*.json", "stats-*.json", "expected-*.json", "worker-*.json", DESELECTED, "*.xml")
        for p in results.glob(pattern)
    ]
    for path in [*stale, *(results / records.INFLIGHT).glob("*.json")]:
        path.unlink()
    records.write_json(results / records.SUMMARY, [])
    repro.clean_scripts(results, config.getoption("subject"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(runner.RUN_STATE, None) is not None:
        runner.activate(None)
    session = config.stash.get(SESSION, None)
    if session is not None and session.watch is not None:
        session.watch.stop()
    if session is not None and session.lock is not None:
        session.lock.close()  # releases the folder


def _load_subject(spec: str) -> Any:
    """Resolve ``--subject``; any failure to load it, or a missing engine, is a one-line usage error.

    An external subject's module imports from the current folder as under ``python -m pytest``, also
    when the ``pytest`` command started the run (its ``sys.path`` lacks the current folder): the folder
    is appended, after every installed package."""
    from subjects.registry import SubjectError, resolve

    if ":" in spec and Path.cwd() not in {Path(p or ".").resolve() for p in sys.path}:
        sys.path.append(os.getcwd())
    try:
        subject = resolve(spec)
    except SubjectError as exc:
        raise _usage(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a subject module or factory may raise anything
        raise _usage(f"cannot load subject {spec!r}: {type(exc).__name__}: {exc}") from None
    reason = subject.missing() if subject.missing else None
    if reason:
        raise _usage(f"subject {spec!r} cannot run here: {reason}")
    return subject


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(SESSION, None)
    if session is None:
        return []
    state = config.stash[runner.RUN_STATE]
    pin = session.pin
    ep = "drawn" if pin.ep is None else "on" if pin.ep else "off"
    limit = f"{state.time_limit:g} s" if state.time_limit else "off"
    lines = [
        f"fp4: subject {state.subject}, profile {session.profile}, example time limit {limit}, "
        f"results {session.results}",
        f"fp4 subject: {state.subject} is bound to "
        + ", ".join(f"{c} ({type(p).__name__})" for c, p in sorted(session.subject.policies.items())),
        f"fp4 hypothesis: profile {session.profile} ({profiles.describe(session.profile)}), "
        f"example database {session.database}",
        f"fp4 pin: model {pin.model or 'any'}, tp {pin.tp or 'any'}, ep {ep}",
    ]
    if (layers := pinned_layers(pin)) is not None:
        lines.append(f"fp4 pin layers: {layers} (only these are drawn)")
    if session.moved is not None:
        lines.append(f"fp4: the last run in {session.results} never finished; its records are in {session.moved}")
    return lines


def _contract(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("contract")
    return marker.args[0] if marker else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``backend`` from the contract's backend records (:mod:`backends`).

    ``@pytest.mark.backends(*members)`` narrows a test to those members, ``kernel=True`` to backends
    whose record has a kernel runner; each parameter carries its record's requirement markers
    (``kernel_requires`` too for kernel tests), so hardware and library gating follow the records.
    """
    marker = metafunc.definition.get_closest_marker("contract")
    if "backend" not in metafunc.fixturenames or marker is None:
        return
    from backends import record

    chosen = metafunc.definition.get_closest_marker("backends")
    kernel = chosen is not None and chosen.kwargs.get("kernel", False)
    params = []
    for b in parametrized_backends(marker.args[0], chosen):
        r = record(b)
        requires = dict.fromkeys((*r.requires, *(r.kernel_requires if kernel else ())))
        params.append(pytest.param(b, id=b.value, marks=[getattr(pytest.mark, m) for m in requires]))
    metafunc.parametrize("backend", params)


def parametrized_backends(contract: str, chosen: pytest.Mark | None) -> list[enum.Enum]:
    """The backends a test of ``contract`` is parametrized with, given its ``backends`` mark (``chosen``): the
    mark's members, else every backend of the contract; with ``kernel=True`` only those whose record has a
    kernel (``kernel_requires``)."""
    from backends import record
    from subjects.registry import backends

    members, kernel = (chosen.args, chosen.kwargs.get("kernel", False)) if chosen else ((), False)
    return [b for b in members or backends(contract) if not kernel or record(b).kernel_requires]


def _backend(item: pytest.Item) -> object | None:
    """The item's ``backend`` parameter (an enum member), or None."""
    return getattr(getattr(item, "callspec", None), "params", {}).get("backend")


def _deselect_other_backends(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--backend``: keep only contract tests parametrized with a named backend (and every self-test)."""
    wanted = set(config.getoption("backend"))
    if not wanted:
        return
    keep, drop = [], []
    for item in items:
        runs = _contract(item) is None or getattr(_backend(item), "value", None) in wanted
        (keep if runs else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


DESELECTED = "deselected.json"
"""Written by worker ``gw0`` under xdist: the controller collects nothing, and prints the worker's count."""


def _not_run_here(session: Session, contract: str | None) -> str | None:
    """Why a test of ``contract`` is deselected: the subject is not bound to it, or the pinned
    model has no layer of it (:func:`strategies.presence.absent_layers`); None when it runs."""
    if contract is None:
        return None
    if session.subject.policy(contract) is None:
        return f"subject {session.subject.name} does not implement them"
    return session.absent.get(contract)


def _deselect_not_run_here(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests of contracts the subject does not implement or the pinned model lacks,
    counted per reason and contract in ``session.deselected`` (printed as one line after collection)."""
    session = config.stash[SESSION]
    keep, drop = [], []
    for item in items:
        contract = _contract(item)
        why = _not_run_here(session, contract)
        if why is None:
            keep.append(item)
        else:
            drop.append(item)
            session.deselected[(why, contract)] += 1
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if session.deselected and hasattr(config, "workerinput") and records.worker_name() == "gw0":
        rows = [[why, contract, n] for (why, contract), n in sorted(session.deselected.items())]
        records.write_json(session.results / DESELECTED, rows, indent=None)


def deselection_line(counts: Counter) -> str | None:
    """``fp4 deselected: N tests: 40 of mxfp4_moe, 20 of ... (subject X does not implement them); 12 of
    shared_expert (gemma-4-26b-a4b has no shared expert)``: one line from ``(reason, contract) -> count``."""
    if not counts:
        return None
    by_reason: dict[str, list[str]] = defaultdict(list)
    for (why, contract), n in sorted(counts.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][1])):
        by_reason[why].append(f"{n} of {contract}")
    parts = "; ".join(f"{', '.join(of)} ({why})" for why, of in by_reason.items())
    return f"fp4 deselected: {sum(counts.values())} tests: {parts}"


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    session = config.stash.get(SESSION, None)
    line = deselection_line(session.deselected) if session is not None else None
    return [line] if line else []


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist controller: print what worker ``gw0`` deselected (:data:`DESELECTED`), once."""
    session = node.config.stash.get(SESSION, None)
    path = session.results / DESELECTED if session is not None else None
    if path is None or node.gateway.id != "gw0" or not path.exists():
        return
    counts = Counter({(why, contract): n for why, contract, n in records.read_json(path)})
    reporter = node.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and (line := deselection_line(counts)):
        reporter.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _deselect_other_backends(config, items)
    _deselect_not_run_here(config, items)
    _select_shard(config, items)
    machine = hardware.machine()
    for item in items:
        contract, backend = _contract(item), _backend(item)
        item.user_properties += [
            ("contract", contract or "self-test"),
            ("backend", getattr(backend, "value", "-")),
            ("hardware", hardware.labels(machine, [m.name for m in item.iter_markers()])),
        ]
        for requirement in hardware.REQUIREMENTS:
            if item.get_closest_marker(requirement) and (reason := hardware.missing(requirement, machine)):
                item.add_marker(pytest.mark.skip(reason=reason + _backend_note(backend)))
                break


def _backend_note(backend: object) -> str:
    """For a backend-parametrized test: what the backend runs and where its rules come from (its record)."""
    if backend is None:
        return ""
    from backends import record

    r = record(backend)
    return f" ({r.name}: {r.entry_point}; {r.sources[0]})"


def _select_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--shard INDEX/COUNT``: deselect every test outside this host's shard."""
    if config.stash[SESSION].shard is None:
        return
    index, count = config.stash[SESSION].shard
    kept = shard.keep([item.nodeid for item in items], index, count)
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in kept])
    items[:] = [item for item in items if item.nodeid in kept]


@pytest.fixture
def policy(request: pytest.FixtureRequest):
    """The selected subject's policy for the requesting test's contract, behind the input check
    (:func:`harness.inputs.guard_inputs`: a call that writes to its input tensors fails), inside the subject's
    :attr:`~subjects.registry.Subject.context` for the test's examples."""
    contract = _contract(request.node)
    if contract is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses the policy fixture without @pytest.mark.contract")
    subject = request.config.stash[SESSION].subject
    with subject.context() if subject.context else contextlib.nullcontext():
        yield guard_inputs(subject.policy(contract))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.config.stash[runner.RUN_STATE].nodeid = item.nodeid


def node_argument(item: pytest.Item) -> str:
    """``item`` as a pytest argument from the run's rootdir: its node id, or, for a test of an installed
    copy (``--pyargs conformance``: its file lies outside the rootdir), its file's absolute path and test."""
    if item.path.is_relative_to(item.config.rootpath):
        return item.nodeid
    return "::".join([str(item.path), *item.nodeid.split("::")[1:]])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """In the process running ``item``: record it as in flight (:func:`records.write_test_record`)
    until its reports are made, so a process that dies in it leaves its node id, contract,
    backend, hardware and a pytest command behind."""
    session = item.config.stash[SESSION]
    props = dict(item.user_properties)
    command = ["-m", "pytest", node_argument(item), "-p", "no:xdist", "--subject", item.config.getoption("subject")]
    command += ["--hypothesis-profile", session.profile]
    path = records.write_test_record(
        session.results,
        {
            "nodeid": item.nodeid,
            **{k: props.get(k) for k in ("contract", "backend", "hardware")},
            "command": repro.shell_command(command),
        },
    )
    yield
    path.unlink(missing_ok=True)


NO_STORED_EXAMPLE = "Hypothesis has been told to run no test cases"
"""Hypothesis's skip when its phases leave nothing to run: under ``replay``, no stored example."""


def skip_reason(report: pytest.TestReport) -> str:
    """A skipped report's reason, without pytest's ``Skipped: `` prefix."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


def _one_line_skip(item: pytest.Item, report: pytest.TestReport) -> None:
    """A skip's reason is its first line: Hypothesis appends the explicit example's repr and notes
    (config, reproduction) to a skip raised inside one. Hypothesis's own "told to run no test cases"
    (nothing stored for a replay) gets the suite's reason and the test's location."""
    reason = (skip_reason(report).strip() or "skipped").splitlines()[0]
    location = report.longrepr[:2] if isinstance(report.longrepr, tuple) else (str(item.path), 0)
    if reason.startswith(NO_STORED_EXAMPLE):
        session = item.config.stash[SESSION]
        reason = f"no stored example of this test in the example database ({session.database}) to replay"
        location = (item.location[0], (item.location[1] or 0) + 1)
    report.longrepr = (*location, f"Skipped: {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    state = item.config.stash[runner.RUN_STATE]
    if report.skipped and not hasattr(report, "wasxfail"):
        _one_line_skip(item, report)
    if report.when != "call":
        return
    if item.nodeid in state.stats:
        state.stats[item.nodeid].outcome = report.outcome
    last = state.last_failure.pop(item.nodeid, None)
    failure = runner.reported_reproduction(call.excinfo.value if call.excinfo else None) or last
    if report.failed and failure is not None:
        script = repro.write_script(state.results, item.nodeid, failure)
        report.sections.append(("fp4 reproduction", f"{failure.command()}\nscript: {script}"))
        # the teardown report carries the item's properties into JUnit XML (junitxml reads them there)
        item.user_properties.append(("reproduce", failure.command()))


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched) -> None:
    """xdist: a worker died (device fault, hard time limit) running ``crashitem``: count it under its
    contract, backend and hardware (from its in-flight record), and attach its reproduction."""
    state = sched.config.stash[runner.RUN_STATE]
    data = records.inflight(state.results)[0].get(crashitem)
    if data is None:
        return
    report.user_properties += [(k, data[k]) for k in ("contract", "backend", "hardware") if data.get(k) is not None]
    if "repro" not in data:  # no example of a check was running: the test's own pytest command
        report.longrepr = f"{report.longrepr}\nworker crashed during this test; reproduce: {data['command']}"
    else:
        script = repro.write_script(state.results, crashitem, repro.parse(data["repro"]), suffix="crash")
        report.longrepr = (
            f"{report.longrepr}\nworker crashed during this example; reproduce: {data['command']}\nscript: {script}"
        )
    report.user_properties.append(("reproduce", data["command"]))


def summary_rows(session: Session) -> list[dict[str, object]]:
    """One row per (contract, backend, hardware) with outcome counts and skip reasons."""
    rows = []
    for key in sorted(session.summary):
        counts = session.summary[key]
        rows.append(
            {
                "contract": key[0],
                "backend": key[1],
                "hardware": key[2],
                **{k: counts.get(k, 0) for k in ("passed", "failed", "skipped", "xfailed", "xpassed")},
                "skip_reasons": dict(session.skips.get(key, {})),
            }
        )
    return rows


def _device_record(worker: str) -> dict[str, object]:
    """Which GPU this process used (after pinning): the visibility mask and the device's UUID."""
    record: dict[str, object] = {
        "worker": worker,
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "versions": records.library_versions(),  # at the end: what this worker's tests imported
    }
    if hardware.machine().cuda_devices:
        import torch

        props = torch.cuda.get_device_properties(0)
        record.update(name=props.name, uuid=str(getattr(props, "uuid", "?")))
    return record


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write this process's device record and per-test example statistics (read by ``python -m bench``);
    on the controller, last (after pytest's JUnit file), the final summary and the complete ``run.json``."""
    state = session.config.stash.get(runner.RUN_STATE, None)
    if state is None:
        return
    results = state.results
    results.mkdir(parents=True, exist_ok=True)
    worker = records.worker_name()
    records.write_json(results / f"device-{worker}.json", _device_record(worker), indent=None)
    if state.expected_failures:
        records.write_json(results / f"expected-{worker}.json", state.expected_failures, indent=None)
    if state.stats:
        stats = {node: dataclasses.asdict(s) for node, s in state.stats.items()}
        records.write_json(results / f"stats-{worker}.json", stats, indent=1)
    fp4 = session.config.stash[SESSION]
    if fp4.record is not None:
        records.write_json(results / records.SUMMARY, summary_rows(fp4))
        records.finish(results, fp4.record, exitstatus)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or config.stash.get(SESSION, None) is None:
        return
    session = config.stash[SESSION]
    rows = summary_rows(session)
    results = session.results
    if not rows:
        return
    tr = terminalreporter
    tr.section("fp4 conformance summary (contract x backend x hardware)")
    header = f"{'contract':<16} {'backend':<22} {'hardware':<26} {'pass':>5} {'fail':>5} {'skip':>5} {'xfail':>5} {'xpass':>5}"
    tr.write_line(header)
    for r in rows:
        tr.write_line(
            f"{r['contract']:<16} {r['backend']:<22} {r['hardware']:<26} {r['passed']:>5} {r['failed']:>5} "
            f"{r['skipped']:>5} {r['xfailed']:>5} {r['xpassed']:>5}"
        )
        for reason, n in r["skip_reasons"].items():
            tr.write_line(f"{'':<16} skipped x{n}: {reason}")
    for path in sorted(results.glob("device-gw*.json")):
        d = json.loads(path.read_text())
        if "name" in d:
            tr.write_line(
                f"worker {d['worker']}: CUDA_VISIBLE_DEVICES={d['CUDA_VISIBLE_DEVICES']} {d['name']} {d['uuid']}"
            )
    expected: dict[str, Counter] = {}
    for path in results.glob("expected-*.json"):
        for reach, by_link in json.loads(path.read_text()).items():
            expected.setdefault(reach, Counter()).update(by_link)
    if expected:
        tr.write_line(f"expected failures by reach (examples): {reach_totals(expected)}")
    for reach, link, n in expected_rows(expected):
        tr.write_line(f"expected failures (known upstream bug {link}): {n} examples [{reach}]")
