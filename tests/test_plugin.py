"""Self-tests of the pytest plugin: options, profiles, worker-to-device mapping, reproductions,
and the ``check`` decorator that writes each property once.

The end-to-end tests run the real conformance suite (``python -m pytest``) on one property and assert
on its exit status and output; the module's runs share one process (:mod:`tests.batch`, :func:`make_runs`).
"""

from __future__ import annotations

import inspect
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from harness import devices, profiles, repro
from harness.hardware import machine
from harness.repro import Reproduction
from subjects.registry import SubjectError, backends, known_bad, resolve
from tests import batch

ROOT = Path(__file__).resolve().parent.parent
REPRO = repro.shell_command(["-m", "harness.repro"])  # the running interpreter, shell-quoted
NVFP4 = "conformance/test_nvfp4_moe.py"
T = TypeVar("T")


def in_parallel(*calls: Callable[[], T]) -> list[T]:
    """Call independent subprocess runs at once (each thread waits on its own process); results in order.

    The end-to-end self-tests are long (each process imports torch and collects), and under
    ``pytest -n auto`` they bound the run's wall time: runs that do not depend on each other overlap."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [future.result() for future in [pool.submit(call) for call in calls]]


# --- worker -> device mapping --------------------------------------------------------------


def test_workers_map_to_distinct_devices() -> None:
    visible = devices.visible_devices({}, 2)
    assert [devices.device_for_worker(f"gw{i}", visible) for i in range(4)] == ["0", "1", "0", "1"]


def test_visibility_mask_is_respected() -> None:
    visible = devices.visible_devices({"CUDA_VISIBLE_DEVICES": "3,5"}, 2)
    assert devices.device_for_worker("gw1", visible) == "5"


def test_pin_worker_sets_both_visibility_variables() -> None:
    env = {"PYTEST_XDIST_WORKER": "gw3"}
    assert devices.pin_worker(env, gpus=2) == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == env["HIP_VISIBLE_DEVICES"] == "1"


def test_no_pinning_outside_xdist_or_without_gpus() -> None:
    assert devices.pin_worker({}, gpus=2) is None
    env = {"PYTEST_XDIST_WORKER": "gw0"}
    assert devices.pin_worker(env, gpus=0) is None
    assert "CUDA_VISIBLE_DEVICES" not in env


# --- profiles --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "env", "want"),
    [
        pytest.param(None, {}, "dev", id="default"),
        pytest.param(None, {"CI": "1"}, "ci", id="ci-env"),
        pytest.param(None, {"FP4_PROFILE": "nightly"}, "nightly", id="env-var"),
        pytest.param("triage", {"FP4_PROFILE": "nightly"}, "triage", id="option-wins"),
    ],
)
def test_profile_selection(option: str | None, env: dict[str, str], want: str) -> None:
    assert profiles.selected_profile(option, env) == want


def test_unknown_profile_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown Hypothesis profile 'fast' \(--hypothesis-profile\)"):
        profiles.selected_profile("fast", {})


def test_nightly_profile_uses_the_given_database(tmp_path: Path) -> None:
    from hypothesis import settings

    profiles.register_profiles(str(tmp_path / "db"))
    try:
        nightly = settings.get_profile("nightly")
        assert nightly.max_examples >= 500 and nightly.deadline is None
        assert str(tmp_path / "db") in repr(nightly.database)
        assert settings.get_profile("ci").derandomize
    finally:
        profiles.register_profiles()


def test_only_ci_and_smoke_are_derandomized_even_under_a_ci_variable() -> None:
    """Hypothesis loads its own derandomized ``ci`` profile when ``CI`` is set; a nightly fleet host sets it."""
    code = (
        "from hypothesis import settings; from harness import profiles; profiles.register_profiles(); "
        "print(sorted(n for n in profiles.PROFILES if settings.get_profile(n).derandomize))"
    )
    for env in ({"CI": "true"}, {}):
        clean = {k: v for k, v in os.environ.items() if k != "CI"}
        out = subprocess.run([sys.executable, "-c", code], env=clean | env, capture_output=True, text=True, check=True)
        assert out.stdout.split("\n")[0] == "['ci', 'smoke']", (env, out.stdout, out.stderr)


def test_an_explicit_database_is_refused_only_for_the_profiles_without_one(tmp_path: Path) -> None:
    from hypothesis.database import DirectoryBasedExampleDatabase

    db = DirectoryBasedExampleDatabase(tmp_path / "db")
    try:
        for name in profiles.NO_DATABASE_PROFILES:
            with pytest.raises(ValueError, match=f"the {name} profile is derandomized"):
                profiles.with_database(name, db, explicit=True)
        assert profiles.with_database("triage", db, explicit=True) == "triage"
    finally:
        profiles.register_profiles()


def test_the_plugin_state_is_hashable_as_pluggy_needs() -> None:
    """pluggy hashes every registered plugin once a folder's conftest.py is out of scope for a test."""
    from harness.plugin import Session

    assert Session.__hash__ is not None


# --- subjects ----------------------------------------------------------------------------------


def test_every_known_bad_subject_names_the_bug_it_reproduces() -> None:
    assert known_bad(), "no known-bad subjects registered"
    for name, subject in known_bad().items():
        assert subject.reproduces, f"{name} does not say which bug it reproduces"


def test_unknown_subject_lists_the_known_ones() -> None:
    with pytest.raises(SubjectError, match=r"known subjects: .*bad-end-padding"):
        resolve("bad-typo")


def test_wrong_import_path_is_a_clear_error() -> None:
    with pytest.raises(SubjectError, match=r"cannot import module 'no_such_engine\.moe'"):
        resolve("no_such_engine.moe:align")
    with pytest.raises(SubjectError, match="has no attribute 'nope'"):
        resolve("subjects.nvfp4_moe:nope")


# --- end to end ---------------------------------------------------------------------------------

UNKNOWN_INPUTS = (
    (["--subject", "no_such_engine.moe:align"], "cannot import module 'no_such_engine.moe'"),
    (["--backend", "flashinfer-trtlm"], "unknown backend(s) flashinfer-trtlm"),
    (["--model", "gemma-5"], "is not catalogued"),
)
MY_ENGINE = """\
import contextlib
from pathlib import Path

from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment
from subjects.registry import Subject

LOG, OPEN = Path(__file__).with_name("context.log"), []


@contextlib.contextmanager
def process():
    OPEN.append(LOG.open("a"))
    OPEN[-1].write("enter\\n")
    try:
        yield
    finally:
        OPEN.pop().write("exit\\n")


class MyAlignment(BuiltinNvfp4MoeAlignment):
    def align_moe(self, *args, **kwargs):
        assert OPEN, "called outside the subject's context"
        return super().align_moe(*args, **kwargs)


policy = MyAlignment()
SUBJECT = Subject("my-engine", "mine", {"nvfp4_moe": policy}, context=process)
"""
"""An external engine module: its ``SUBJECT`` has a ``context`` (:attr:`subjects.registry.Subject.context`) that
logs each entry and exit to ``context.log`` beside it, and its policy fails when called outside that context."""


def make_runs(folder: Path) -> dict[str, batch.Run]:
    """Every end-to-end run of this module (:mod:`tests.batch`): ``python -m pytest ARGS`` from the checkout,
    ``ci`` profile, results under ``folder / name / results``; probe modules run from their own folder."""
    runs: dict[str, batch.Run] = {}

    def add(name: str, *args: str, env: dict[str, str] | None = None) -> None:
        results = ["--results", str(folder / name / "results")]
        runs[name] = batch.Run(["-p", "no:cacheprovider", "-q", *results, *args], env=env or batch.suite_env())

    def probe_module(name: str, text: str, *args: str) -> None:
        module = folder / name / f"test_{name}.py"
        module.parent.mkdir(parents=True)
        module.write_text(text)
        runs[name] = batch.Run(
            [str(module), "-p", "harness.plugin", "-p", "no:cacheprovider", "--rootdir", str(module.parent),
             "--results", str(module.parent / "results"), *args],
            cwd=module.parent, env=batch.with_path(batch.suite_env(), ROOT),
        )  # fmt: skip

    for i, (args, _) in enumerate(UNKNOWN_INPUTS):
        add(f"unknown-{i}", NVFP4, *args)
    (folder / "engine").mkdir(parents=True)
    (folder / "engine" / "my_engine.py").write_text(MY_ENGINE)
    env = batch.with_path(batch.suite_env(), folder / "engine")
    add("bare", NVFP4, "--subject", "my_engine:policy", env=env)
    # the cheapest property run on every backend: the subject's loading is under test
    add("bound", NVFP4, "-k", "gate_up_layout", "--subject", "my_engine:SUBJECT", "-v", env=env)
    add("known-bad", NVFP4, "-k", "padding_invariance", "--backend", "flashinfer-trtllm", "--subject",
        "bad-end-padding", "--model", "gemma-4-26b-a4b", "--tp", "2")  # fmt: skip
    add("summary", NVFP4, "-k", "gate_up_layout and flashinfer-cutlass")
    add("no-xdist", NVFP4, "-p", "no:xdist", "-k", "gate_up_layout and flashinfer-cutlass")
    probe_module("crash", CRASHING_MODULE, "-n", "1")
    probe_module("generated", GENERATED_MODULE, "-q", "--collect-only")
    generated = runs["generated"]
    runs["generated-marlin"] = batch.Run(
        [*generated.args[:-1], "--backend", "marlin", "--results", str(folder / "generated" / "marlin")],
        cwd=generated.cwd, env=generated.env,
    )  # fmt: skip
    add("backend-marlin", "conformance", "--backend", "marlin", "--collect-only")
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, batch.Ran]]:
    """This module's end-to-end runs, in one process (:mod:`tests.batch`): their folder and results."""
    return batch.shared(tmp_path_factory, "plugin", make_runs)


@pytest.mark.long(200)  # the first test of this module: runs the module's batch (the rest read it)
def test_cli_rejects_unknown_subject_backend_and_model(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    for i, (_, message) in enumerate(UNKNOWN_INPUTS):
        result = runs[1][f"unknown-{i}"]
        assert result.returncode == 4, result.stdout + result.stderr
        assert message in result.stderr, result.stderr


@pytest.mark.late
def test_external_policy_by_import_path(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    """A bare ``align_moe`` policy fits both MoE contracts: a usage error naming them and the ``Subject`` form;
    bound by a ``Subject``, it runs its contract's properties and its header says what it is bound to
    (``my_engine.py`` is :data:`MY_ENGINE`)."""
    bare, bound = runs[1]["bare"], runs[1]["bound"]
    assert bare.returncode == 4, bare.stdout[-3000:] + bare.stderr[-3000:]
    assert (
        "several contracts share (fp8_moe, fp8_tensor_moe, mxfp4_moe, nvfp4_moe)" in bare.stderr
        and "Subject(" in bare.stderr
    )
    assert bound.returncode == 0, bound.stdout[-3000:]
    assert f"{len(backends('nvfp4_moe'))} passed" in bound.stdout  # one per backend
    # the subject's context was entered around each test's examples (the policy asserts it) and left after
    log = (runs[0] / "engine" / "context.log").read_text().split()
    assert log == ["enter", "exit"] * len(backends("nvfp4_moe")), log
    assert "fp4 subject: my_engine:SUBJECT is bound to nvfp4_moe (MyAlignment)" in bound.stdout


@pytest.mark.late
def test_known_bad_failure_writes_a_reproduction_that_fails_the_same_way(
    runs: tuple[Path, dict[str, batch.Ran]],
) -> None:
    result = runs[1]["known-bad"]
    assert result.returncode == 1, result.stdout[-3000:]
    assert f"reproduce: {REPRO} conformance.test_nvfp4_moe:check_padding_invariance" in result.stdout
    scripts = list((runs[0] / "known-bad" / "results" / "repro" / "bad-end-padding").glob("*.py"))
    assert len(scripts) == 1
    rerun = subprocess.run([sys.executable, str(scripts[0])], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode != 0
    assert "padding changed the MoE output" in rerun.stderr


@pytest.mark.late
def test_summary_table_reports_contract_backend_hardware(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    result = runs[1]["summary"]
    assert result.returncode == 0, result.stdout[-3000:]
    lines = result.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if "fp4 conformance summary (contract x backend x hardware)" in line)
    assert lines[title + 1].split() == ["contract", "backend", "hardware", "pass", "fail", "skip", "xfail", "xpass"]
    hw = machine().describe()
    assert lines[title + 2].split() == ["nvfp4_moe", "flashinfer-cutlass", *hw.split(), "1", "0", "0", "0", "0"]
    rows = json.loads((runs[0] / "summary" / "results" / "summary.json").read_text())
    assert rows == [
        {
            "contract": "nvfp4_moe",
            "backend": "flashinfer-cutlass",
            "hardware": hw,
            "passed": 1,
            "failed": 0,
            "skipped": 0,
            "xfailed": 0,
            "xpassed": 0,
            "skip_reasons": {},
        }
    ]


@pytest.mark.parametrize("subject_path", [None, "engines/mine"])
def test_reproduction_command_round_trips(subject_path: str | None) -> None:
    """The printed command, split as a shell splits it, parses back to the same reproduction."""
    r = Reproduction(
        "conformance.test_nvfp4_moe:check_gate_up_layout",
        "my_engine.moe:policy",
        "flashinfer-cutlass",
        {"model": "gemma-4-26b-a4b", "note": 'it\'s "quoted" $HOME', "nested": {"a": [1, 2.5, None, True]}},
        subject_path,
    )
    argv = shlex.split(r.command())
    assert argv[:4] == [sys.executable, "-m", "harness.repro", r.check]
    assert repro.parse(argv[3:]) == r
    bare = Reproduction(r.check, "builtin", None, {})
    assert repro.parse(bare.argv()) == bare


def test_policy_class_by_import_path_is_instantiated() -> None:
    subject = resolve("subjects.shared_expert:BuiltinSharedExpert")
    assert not isinstance(subject.policy("shared_expert"), type)


@pytest.mark.late
def test_plugin_loads_without_xdist(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    result = runs[1]["no-xdist"]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


CRASHING_MODULE = """
import os
from dataclasses import dataclass

import pytest

from harness.properties import check
from harness.runner import run_check
from strategies.config import Config

pytestmark = pytest.mark.contract("nvfp4_moe")


@dataclass(frozen=True)
class Shape(Config):
    rows: int


@check("nvfp4_moe", Shape)
def check_kernel_dies(shape, backend, policy):
    if shape.rows > 3:
        os._exit(1)  # a device fault kills the worker process


def test_kernel_dies_once():
    run_check(check_kernel_dies, Shape(rows=7), None, None, kernel=True)


def test_after_the_crash():
    assert True
"""


@pytest.mark.late
def test_worker_crash_is_reported_with_its_reproduction(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    """A check that kills its xdist worker is that test's failure, with the in-flight reproduction,
    counted under the test's contract (from its in-flight record), not under an unknown one
    (:data:`CRASHING_MODULE` under ``-n 1``)."""
    result, results = runs[1]["crash"], runs[0] / "crash" / "results"
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert f"worker crashed during this example; reproduce: {REPRO}" in out, out[-3000:]
    assert list((results / "repro" / "builtin").glob("*-crash.py"))
    rows = json.loads((results / "summary.json").read_text())
    assert [(r["contract"], r["backend"], r["passed"], r["failed"]) for r in rows] == [("nvfp4_moe", "-", 1, 1)]


def test_model_pins_select_the_pinned_regressions() -> None:
    from strategies.moe import pinned_shape
    from strategies.pins import Pin, matches_pin

    gemma_tp4 = pinned_shape("gemma-4-26b-a4b", 4)
    assert matches_pin(gemma_tp4, Pin())
    assert matches_pin(gemma_tp4, Pin("gemma-4-26b-a4b", 4))
    assert not matches_pin(gemma_tp4, Pin("gemma-4-26b-a4b", 2))
    assert not matches_pin(gemma_tp4, Pin("qwen3-30b-a3b"))
    assert not matches_pin(gemma_tp4, Pin(tp=4, ep=True))


# --- properties written once ---------------------------------------------------------------------


def test_check_generates_the_hypothesis_test_and_keeps_the_bare_check() -> None:
    from conformance import test_shared_expert as module

    for name in ("fusion_resolved_first", "decision_table", "dense_expert_reaches_no_unswizzlable_asm"):
        bare, test = getattr(module, f"check_{name}"), getattr(module, f"test_{name}")
        assert bare.__fp4_check__[0] == "shared_expert"
        assert list(inspect.signature(bare).parameters) == ["case", "backend", "policy"]
        assert not hasattr(test, "__fp4_check__"), "the bench would count the test as a second check"
        assert test.hypothesis.inner_test.__name__ == f"test_{name}" and test.__doc__ == bare.__doc__
        params = inspect.signature(test).parameters
        assert "request" in params and "policy" in params and "backend" not in params


GENERATED_MODULE = """
import pytest
from dataclasses import dataclass
from hypothesis import strategies as st

from harness.properties import ALL_BACKENDS, check, property_test
from strategies.config import Config
from subjects.mxfp4_moe import CONTRACT, Mxfp4MoeBackend

pytestmark = pytest.mark.contract(CONTRACT)


@dataclass(frozen=True)
class Size(Config):
    n: int


@check(CONTRACT, Size, strategy=st.builds(Size, st.integers(1, 5)), examples=[Size(99)], backends=ALL_BACKENDS)
def check_small(size, backend, policy):
    "n stays small (the pinned 99 does not)."
    assert size.n < 50, f"n = {size.n} is large"


property_test(check_small, name="test_small_on_marlin", strategy=st.builds(Size, st.just(1)),
              backends=[Mxfp4MoeBackend.MARLIN])
"""


@pytest.mark.late
def test_generated_tests_run_parametrized_and_filtered_by_backend(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    """:data:`GENERATED_MODULE` collected, and run with ``--backend marlin``."""
    from subjects.mxfp4_moe import Mxfp4MoeBackend

    collected, marlin = runs[1]["generated"], runs[1]["generated-marlin"]
    want = {f"test_generated.py::test_small[{b.value}]" for b in Mxfp4MoeBackend}
    want.add("test_generated.py::test_small_on_marlin[marlin]")
    assert {line for line in collected.stdout.splitlines() if "::" in line} == want, collected.stdout
    out = marlin.stdout
    assert marlin.returncode == 1, out[-3000:]
    assert f"1 failed, 1 passed, {len(want) - 2} deselected" in out, out[-3000:]
    assert "AssertionError: n = 99 is large" in out
    assert f"reproduce: {REPRO} test_generated:check_small --subject builtin --backend marlin" in out


@pytest.mark.late
def test_backend_option_collects_only_that_backend(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    """Tests with their own backend parametrization are filtered too (they ran under any --backend)."""
    result = runs[1]["backend-marlin"]
    items = [line for line in result.stdout.splitlines() if "::" in line]
    assert result.returncode == 0 and items, result.stdout[-3000:]
    assert all(line.endswith("[marlin]") for line in items), [i for i in items if not i.endswith("[marlin]")]
