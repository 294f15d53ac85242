"""Self-tests of the pytest plugin: options, profiles, worker-to-device mapping, reproductions,
and the ``check`` decorator that writes each property once.

The end-to-end tests run the real conformance suite in a subprocess (``python -m pytest``) on
one property and assert on its exit status and output.
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

ROOT = Path(__file__).resolve().parent.parent
REPRO = repro.shell_command(["-m", "harness.repro"])  # the running interpreter, shell-quoted
NVFP4 = "conformance/test_nvfp4_moe.py"
T = TypeVar("T")


def run_pytest(*args: str, tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "FP4_PROFILE": "ci", **(env or {})}
    full_env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "--results",
        str(tmp_path / "results"),
        *args,
    ]
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=600)


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


@pytest.mark.long(60)
def test_cli_rejects_unknown_subject_backend_and_model(tmp_path: Path) -> None:
    cases = (
        (["--subject", "no_such_engine.moe:align"], "cannot import module 'no_such_engine.moe'"),
        (["--backend", "flashinfer-trtlm"], "unknown backend(s) flashinfer-trtlm"),
        (["--model", "gemma-5"], "is not catalogued"),
    )
    results = in_parallel(
        *[
            lambda i=i, args=args: run_pytest(NVFP4, *args, tmp_path=tmp_path / str(i))
            for i, (args, _) in enumerate(cases)
        ]
    )
    for (_, message), result in zip(cases, results, strict=True):
        assert result.returncode == 4, result.stdout + result.stderr
        assert message in result.stderr, result.stderr


@pytest.mark.long(81)
def test_external_policy_by_import_path(tmp_path: Path) -> None:
    """A bare ``align_moe`` policy fits both MoE contracts: a usage error naming them and the ``Subject`` form;
    bound by a ``Subject``, it runs its contract's properties and its header says what it is bound to."""
    (tmp_path / "my_engine.py").write_text(
        "from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment\nfrom subjects.registry import Subject\n\n"
        "class MyAlignment(BuiltinNvfp4MoeAlignment):\n    pass\n\npolicy = MyAlignment()\n"
        "SUBJECT = Subject('my-engine', 'mine', {'nvfp4_moe': policy})\n"
    )
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    bare, bound = in_parallel(
        lambda: run_pytest(NVFP4, "--subject", "my_engine:policy", tmp_path=tmp_path / "bare", env=env),
        lambda: run_pytest(  # the cheapest property run on every backend: the subject's loading is under test
            NVFP4, "-k", "gate_up_layout", "--subject", "my_engine:SUBJECT", "-v", tmp_path=tmp_path / "bound", env=env
        ),
    )  # fmt: skip
    assert bare.returncode == 4, bare.stdout[-3000:] + bare.stderr[-3000:]
    assert (
        "several contracts share (fp8_moe, fp8_tensor_moe, mxfp4_moe, nvfp4_moe)" in bare.stderr
        and "Subject(" in bare.stderr
    )
    assert bound.returncode == 0, bound.stdout[-3000:]
    assert f"{len(backends('nvfp4_moe'))} passed" in bound.stdout  # one per backend
    assert "fp4 subject: my_engine:SUBJECT is bound to nvfp4_moe (MyAlignment)" in bound.stdout


@pytest.mark.long(38)
def test_known_bad_failure_writes_a_reproduction_that_fails_the_same_way(tmp_path: Path) -> None:
    result = run_pytest(
        NVFP4,
        "-k",
        "padding_invariance",
        "--backend",
        "flashinfer-trtllm",
        "--subject",
        "bad-end-padding",
        "--model",
        "gemma-4-26b-a4b",
        "--tp",
        "2",
        tmp_path=tmp_path,
    )
    assert result.returncode == 1, result.stdout[-3000:]
    assert f"reproduce: {REPRO} conformance.test_nvfp4_moe:check_padding_invariance" in result.stdout
    scripts = list((tmp_path / "results" / "repro" / "bad-end-padding").glob("*.py"))
    assert len(scripts) == 1
    rerun = subprocess.run([sys.executable, str(scripts[0])], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rerun.returncode != 0
    assert "padding changed the MoE output" in rerun.stderr


@pytest.mark.long(25)
def test_summary_table_reports_contract_backend_hardware(tmp_path: Path) -> None:
    result = run_pytest(NVFP4, "-k", "gate_up_layout and flashinfer-cutlass", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = result.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if "fp4 conformance summary (contract x backend x hardware)" in line)
    assert lines[title + 1].split() == ["contract", "backend", "hardware", "pass", "fail", "skip", "xfail", "xpass"]
    hw = machine().describe()
    assert lines[title + 2].split() == ["nvfp4_moe", "flashinfer-cutlass", *hw.split(), "1", "0", "0", "0", "0"]
    rows = json.loads((tmp_path / "results" / "summary.json").read_text())
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


@pytest.mark.long(30)
def test_plugin_loads_without_xdist(tmp_path: Path) -> None:
    result = run_pytest(NVFP4, "-p", "no:xdist", "-k", "gate_up_layout and flashinfer-cutlass", tmp_path=tmp_path)
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


@pytest.mark.long(67)
def test_worker_crash_is_reported_with_its_reproduction(tmp_path: Path) -> None:
    """A check that kills its xdist worker is that test's failure, with the in-flight reproduction,
    counted under the test's contract (from its in-flight record), not under an unknown one."""
    module = tmp_path / "test_crash.py"
    module.write_text(CRASHING_MODULE)
    env = {
        **os.environ,
        "FP4_PROFILE": "ci",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [
        sys.executable, "-m", "pytest", str(module), "-p", "harness.plugin", "-p", "no:cacheprovider", "-n", "1",
        "--results", str(tmp_path / "results"), "--rootdir", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "1 failed, 1 passed" in out, out[-3000:]
    assert f"worker crashed during this example; reproduce: {REPRO}" in out, out[-3000:]
    assert list((tmp_path / "results" / "repro" / "builtin").glob("*-crash.py"))
    rows = json.loads((tmp_path / "results" / "summary.json").read_text())
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


@pytest.mark.long(57)
def test_generated_tests_run_parametrized_and_filtered_by_backend(tmp_path: Path) -> None:
    from subjects.mxfp4_moe import Mxfp4MoeBackend

    module = tmp_path / "test_generated.py"
    module.write_text(GENERATED_MODULE)
    env = {**os.environ, "FP4_PROFILE": "ci", "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    base = [sys.executable, "-m", "pytest", str(module), "-p", "harness.plugin", "-p", "no:cacheprovider", "-q"]
    base += ["--rootdir", str(tmp_path), "--results", str(tmp_path / "results")]
    collected, marlin = in_parallel(
        lambda: subprocess.run([*base, "--collect-only"], cwd=tmp_path, env=env, capture_output=True, text=True),
        lambda: subprocess.run(
            [*base, "--backend", "marlin", "--results", str(tmp_path / "marlin")],
            cwd=tmp_path, env=env, capture_output=True, text=True,
        ),
    )  # fmt: skip
    want = {f"test_generated.py::test_small[{b.value}]" for b in Mxfp4MoeBackend}
    want.add("test_generated.py::test_small_on_marlin[marlin]")
    assert {line for line in collected.stdout.splitlines() if "::" in line} == want, collected.stdout
    out = marlin.stdout
    assert marlin.returncode == 1, out[-3000:]
    assert f"1 failed, 1 passed, {len(want) - 2} deselected" in out, out[-3000:]
    assert "AssertionError: n = 99 is large" in out
    assert f"reproduce: {REPRO} test_generated:check_small --subject builtin --backend marlin" in out


@pytest.mark.long(57)
def test_backend_option_collects_only_that_backend(tmp_path: Path) -> None:
    """Tests with their own backend parametrization are filtered too (they ran under any --backend)."""
    result = run_pytest("conformance", "--backend", "marlin", "--collect-only", tmp_path=tmp_path)
    items = [line for line in result.stdout.splitlines() if "::" in line]
    assert result.returncode == 0 and items, result.stdout[-3000:]
    assert all(line.endswith("[marlin]") for line in items), [i for i in items if not i.endswith("[marlin]")]
