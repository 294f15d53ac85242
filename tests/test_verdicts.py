"""Verdicts the harness must get right: each test runs the suite on a probe subject or input.

* The known-failure ledger counts only the failure an entry describes; anything else fails (also
  the entry's torch message raised by an adapter's own code instead of the entry's ``raised_in``),
  and a missing library skips (an engine subject without its engine is a usage error).
* Inputs that would lose the run's verdict are usage errors before the first test: an unwritable
  ``--results``, an example database that is a file, a profile typo, a subject module or factory
  that raises.
* A hanging example fails after the per-example time limit, named, with its reproduction (also
  under xdist, also when the hang cannot be interrupted).
* JUnit XML carries the reproduction; scripts are portable, keep an external subject's import
  path, are unique per subject and replaced on each run.
* ``--model/--tp/--ep`` pin what they say.

Each end-to-end test runs ``python -m pytest`` in a subprocess, like a user would.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.plugin import session_pin
from harness.repro import shell_command
from strategies.pins import Pin

ROOT = Path(__file__).resolve().parent.parent
REPRO = shell_command(["-m", "harness.repro"])  # the running interpreter, shell-quoted
NVFP4 = "conformance/test_nvfp4_moe.py"
SHARED = "conformance/test_shared_expert.py"
CUTLASS_PADDING = ["-k", "padding_invariance and flashinfer-cutlass"]
PASSWORD = "s3cret-Pw"  # a Redis password that no message may show

PROBES = '''
import ctypes
import signal
import time

import torch

from adapters.flashinfer import LibraryUnavailable
from subjects.nvfp4_moe import CONTRACT, BuiltinNvfp4MoeAlignment
from subjects.registry import Hardware, KnownFailure, Reach, Subject

LINK = "https://github.com/example/engine/issues/1"


def ledger(**kwargs):
    return (KnownFailure(CONTRACT, "gated CUTLASS refuses odd 2I", LINK, applies=lambda s: s.gated,
                         backend="flashinfer-cutlass", reach=Reach.flag("--moe-backend flashinfer_cutlass"),
                         hardware=(Hardware.SM100,), **kwargs),)


class Raising(BuiltinNvfp4MoeAlignment):
    def __init__(self, exc):
        self.exc = exc

    def align_moe(self, backend, weights, gated):
        if gated and backend.value == "flashinfer-cutlass":
            raise self.exc
        return super().align_moe(backend, weights, gated)


DOCUMENTED = dict(raises=NotImplementedError, match=r"Intermediate size padding for w1 and w3")

# the documented bug: expected
documented = Subject("probe-documented", "raises the documented error",
                     {CONTRACT: Raising(NotImplementedError("Intermediate size padding for w1 and w3"))},
                     known_failures=ledger(**DOCUMENTED))
# a broken adapter where the ledger applies: a failure, not the upstream bug
import_error = Subject("probe-import-error", "broken adapter",
                       {CONTRACT: Raising(ImportError("No module named 'engine_kernels'"))},
                       known_failures=ledger(**DOCUMENTED))
# the right type with another message: a failure
other_message = Subject("probe-other-message", "another NotImplementedError",
                        {CONTRACT: Raising(NotImplementedError("EP is not supported"))},
                        known_failures=ledger(**DOCUMENTED))

def load_w13(param, loaded):
    """Stands in for the engine's loader, where the documented copy fails."""
    param.copy_(loaded)


def adapter_copy(param, loaded):
    """An adapter's own bug: the same copy and torch message, from another function."""
    param.copy_(loaded)


class Copying(BuiltinNvfp4MoeAlignment):
    def __init__(self, copy):
        self.copy = copy

    def align_moe(self, backend, weights, gated):
        if gated and backend.value == "flashinfer-cutlass":
            self.copy(torch.empty(2, 3), torch.empty(4))
        return super().align_moe(backend, weights, gated)


LOADER = dict(raises=RuntimeError, match=r"The size of tensor a \\(\\d+\\) must match the size of tensor b \\(\\d+\\)",
              raised_in=("fp4_probes:load_w13",))

# torch's generic message from the function the entry names: expected
upstream_copy = Subject("probe-upstream-copy", "the engine's loader fails", {CONTRACT: Copying(load_w13)},
                        known_failures=ledger(**LOADER))
# the same message from the adapter's own code: a failure (before raised_in, an expected failure)
adapter_bug = Subject("probe-adapter-bug", "the adapter fails the same way", {CONTRACT: Copying(adapter_copy)},
                      known_failures=ledger(**LOADER))
# a missing library where the ledger applies: a skip
missing_library = Subject("probe-missing-library", "library missing",
                          {CONTRACT: Raising(LibraryUnavailable("probe-lib is not installed"))},
                          known_failures=ledger(**DOCUMENTED))
# an engine subject whose engine is not installed
no_engine = Subject("probe-no-engine", "engine absent", {CONTRACT: BuiltinNvfp4MoeAlignment()},
                    missing=lambda: "probe-engine is not installed")


class Sleeping(BuiltinNvfp4MoeAlignment):
    def align_moe(self, backend, weights, gated):
        time.sleep(600)


class Stuck(BuiltinNvfp4MoeAlignment):
    """A hang in native code that no signal interrupts (SIGALRM blocked in this thread)."""

    def align_moe(self, backend, weights, gated):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        ctypes.CDLL(None).sleep(600)


hangs = Subject("probe-hangs", "sleeps", {CONTRACT: Sleeping()})
stuck = Subject("probe-stuck", "cannot be interrupted", {CONTRACT: Stuck()})


def factory_raises():
    raise RuntimeError("engine config file not found")


end_padding = Subject("probe-end-padding", "reuses the known-bad end padding",
                      {CONTRACT: __import__("subjects.nvfp4_moe").nvfp4_moe.EndPaddingAlignment()})
'''


@pytest.fixture
def probes(tmp_path: Path) -> Path:
    folder = tmp_path / "engine"
    folder.mkdir()
    (folder / "fp4_probes.py").write_text(PROBES)
    (folder / "fp4_broken.py").write_text("raise RuntimeError('engine extension failed to initialise')\n")
    return folder


def run_pytest(
    *args: str, tmp_path: Path, path: Path | None = None, env: dict[str, str] | None = None, timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest ARGS`` from the checkout, ``ci`` profile, results under ``tmp_path``."""
    full_env = {**os.environ, "FP4_PROFILE": "ci", **(env or {})}
    full_env.pop("PYTEST_XDIST_WORKER", None)
    if path is not None:
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")]))
    results = [] if any(a.startswith("--results") for a in args) else ["--results", str(tmp_path / "results")]
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *results, *args]
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def one_line_usage_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    out = result.stdout + result.stderr
    assert result.returncode == 4, out[-3000:]
    assert "INTERNALERROR" not in out and "Traceback" not in out, out[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("ERROR: "), result.stderr
    assert message in errors[0], errors[0]
    assert "passed" not in result.stdout and "failed" not in result.stdout


# --- 1. the known-failure ledger ------------------------------------------------------------------


def test_ledger_entries_describe_their_failure() -> None:
    from subjects.registry import Hardware, KnownFailure, Reach

    where = {"reach": Reach.default("a test entry"), "hardware": (Hardware.SM90,)}
    entry = KnownFailure("c", "r", "https://x", lambda _: True, raises=ValueError, match=r"M % 128 == 0", **where)
    assert entry.recognises(ValueError("assert M % 128 == 0 failed"))
    assert not entry.recognises(ValueError("something else"))
    assert not entry.recognises(ImportError("assert M % 128 == 0"))
    with pytest.raises(TypeError):
        KnownFailure("c", "r", "https://x", lambda _: True)  # type: ignore[call-arg]  # no description
    for missing in ("reach", "hardware"):  # both required, by keyword
        kwargs = {k: v for k, v in where.items() if k != missing}
        with pytest.raises(TypeError, match=missing):
            KnownFailure("c", "r", "https://x", lambda _: True, raises=ValueError, match=r"M % 128", **kwargs)
    with pytest.raises(TypeError, match="non-empty tuple of Hardware"):
        KnownFailure("c", "r", "https://x", lambda _: True, raises=ValueError, match=r"M % 128",
                     reach=Reach.latent("a test entry"), hardware=())  # fmt: skip
    with pytest.raises(ValueError, match="names its configuration"):
        Reach.latent(" ")


@pytest.mark.long(69)
@pytest.mark.parametrize("probe", ["documented", "upstream_copy"])
def test_documented_failure_is_expected(tmp_path: Path, probes: Path, probe: str) -> None:
    result = run_pytest(NVFP4, *CUTLASS_PADDING, "--subject", f"fp4_probes:{probe}", tmp_path=tmp_path, path=probes)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "expected failures (known upstream bug https://github.com/example/engine/issues/1)" in result.stdout


@pytest.mark.long(48)
@pytest.mark.parametrize(
    ("probe", "shown"),
    [
        pytest.param("import_error", "ImportError: No module named 'engine_kernels'", id="import-error"),
        pytest.param("other_message", "NotImplementedError: EP is not supported", id="other-message"),
        pytest.param(
            "adapter_bug",
            "RuntimeError: The size of tensor a (3) must match the size of tensor b (4)",
            id="adapter-bug",
        ),
    ],
)
def test_other_failures_where_the_ledger_applies_fail(tmp_path: Path, probes: Path, probe: str, shown: str) -> None:
    result = run_pytest(NVFP4, *CUTLASS_PADDING, "--subject", f"fp4_probes:{probe}", tmp_path=tmp_path, path=probes)
    assert result.returncode == 1, result.stdout[-3000:]
    assert shown in result.stdout
    assert "not the known upstream bug https://github.com/example/engine/issues/1" in result.stdout
    assert "expected failures" not in result.stdout


@pytest.mark.long(26)
def test_missing_library_where_the_ledger_applies_skips(tmp_path: Path, probes: Path) -> None:
    result = run_pytest(
        NVFP4, *CUTLASS_PADDING, "-rs", "--subject", "fp4_probes:missing_library", tmp_path=tmp_path, path=probes
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 skipped" in result.stdout and "probe-lib is not installed" in result.stdout
    assert "expected failures" not in result.stdout


@pytest.mark.long(20)
def test_engine_subject_without_its_engine_is_a_usage_error(tmp_path: Path, probes: Path) -> None:
    result = run_pytest(NVFP4, "--subject", "fp4_probes:no_engine", tmp_path=tmp_path, path=probes)
    one_line_usage_error(result, "cannot run here: probe-engine is not installed")


@pytest.mark.long(21)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_subject_without_vllm_is_a_usage_error(tmp_path: Path) -> None:
    one_line_usage_error(run_pytest(NVFP4, "--subject", "vllm", tmp_path=tmp_path), "vLLM is not installed")


# --- 7, 8, 10: usage errors before the first test --------------------------------------------------


@pytest.mark.long(24)
def test_unwritable_results_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    result = run_pytest(SHARED, "--results", str(tmp_path / "a-file" / "results"), tmp_path=tmp_path)
    one_line_usage_error(result, "--results")


@pytest.mark.long(24)
@pytest.mark.parametrize("how", ["option", "env"])
def test_example_database_that_is_a_file_is_a_usage_error(tmp_path: Path, how: str) -> None:
    db = tmp_path / "db-file"
    db.write_text("")
    args, env = (["--fp4-db", str(db)], {}) if how == "option" else ([], {"FP4_DB": str(db)})
    result = run_pytest(SHARED, "--hypothesis-profile", "nightly", *args, tmp_path=tmp_path, env=env)
    one_line_usage_error(result, "is a file, not a directory")


@pytest.mark.long(21)
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        pytest.param(["--hypothesis-profile", "nightlly"], {}, "unknown Hypothesis profile 'nightlly'", id="option"),
        pytest.param([], {"FP4_PROFILE": "nightlly"}, "unknown Hypothesis profile 'nightlly'", id="env"),
        pytest.param(
            ["--subject", "fp4_broken:subject"],
            {},
            "RuntimeError: engine extension failed to initialise",
            id="module-raises",
        ),
        pytest.param(
            ["--subject", "fp4_probes:factory_raises"], {}, "RuntimeError: engine config file not found", id="factory"
        ),
        pytest.param(["--example-time-limit", "-1"], {}, "--example-time-limit -1: give the seconds", id="limit-neg"),
        pytest.param(["--example-time-limit", "nan"], {}, "--example-time-limit nan: give the seconds", id="limit-nan"),
        pytest.param(
            ["--hypothesis-profile", "nightly", "--fp4-db", f"redis://:{PASSWORD}@127.0.0.1:6379/x"],
            {},
            "'redis://:***@127.0.0.1:6379/x': the port and the database number must be integers",
            id="db-number",
        ),
        pytest.param(
            ["--hypothesis-profile", "nightly"],
            {"FP4_DB": f"redis://:{PASSWORD}@127.0.0.1:1/0"},
            "Redis example database redis://:***@127.0.0.1:1/0 does not answer",
            id="db-unreachable-env",
        ),
    ],
)
def test_bad_input_is_a_one_line_usage_error(
    tmp_path: Path, probes: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    result = run_pytest(SHARED, *args, tmp_path=tmp_path, path=probes, env=env)
    one_line_usage_error(result, message)
    assert PASSWORD not in result.stdout + result.stderr, "the database password was printed"


# --- 9. per-example time limit -----------------------------------------------------------------------


@pytest.mark.long(50)
@pytest.mark.parametrize("workers", [pytest.param([], id="no-xdist"), pytest.param(["-n", "1"], id="xdist")])
def test_hanging_example_fails_named_with_its_reproduction(tmp_path: Path, probes: Path, workers: list[str]) -> None:
    result = run_pytest(
        NVFP4, *CUTLASS_PADDING, *workers, "--subject", "fp4_probes:hangs", "--example-time-limit", "2",
        tmp_path=tmp_path, path=probes, timeout=300,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 1, out[-3000:]
    assert "ExampleTimeout" in out and "per-example time limit of 2 s" in out, out[-3000:]
    assert "test_nvfp4_moe.py::test_padding_invariance[flashinfer-cutlass]" in out
    scripts = list((tmp_path / "results" / "repro" / "fp4_probes_hangs").glob("*.py"))
    assert len(scripts) == 1, out[-3000:]


@pytest.mark.long(61)
def test_uninterruptible_hang_ends_the_worker_with_its_reproduction(tmp_path: Path, probes: Path) -> None:
    result = run_pytest(
        NVFP4, *CUTLASS_PADDING, "-n", "1", "--subject", "fp4_probes:stuck", "--example-time-limit", "1",
        tmp_path=tmp_path, path=probes, timeout=300,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert f"worker crashed during this example; reproduce: {REPRO}" in out, out[-3000:]
    assert list((tmp_path / "results" / "repro" / "fp4_probes_stuck").glob("*-crash.py"))


def test_time_limit_comes_from_the_profile() -> None:
    from harness import profiles

    assert set(profiles.TIME_LIMITS) == set(profiles.PROFILES)
    assert all(limit > 0 for limit in profiles.TIME_LIMITS.values())


# --- 11. JUnit and reproduction scripts ----------------------------------------------------------


@pytest.mark.long(41)
def test_junit_and_scripts_of_an_external_subject(tmp_path: Path, probes: Path) -> None:
    subject_folder = tmp_path / "results" / "repro" / "fp4_probes_end_padding"
    subject_folder.mkdir(parents=True)
    (subject_folder / "stale_from_an_earlier_run.py").write_text("raise SystemExit('stale')\n")
    other = tmp_path / "results" / "repro" / "bad-end-padding"
    other.mkdir(parents=True)
    (other / "kept.py").write_text("")
    junit = tmp_path / "junit.xml"
    result = run_pytest(
        NVFP4, "-k", "padding_invariance", "--backend", "flashinfer-trtllm", "--subject", "fp4_probes:end_padding",
        "--model", "gemma-4-26b-a4b", "--tp", "2", f"--junitxml={junit}", tmp_path=tmp_path, path=probes,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-3000:]
    cases = ET.parse(junit).getroot().iter("testcase")
    props = {p.get("name"): p.get("value") for case in cases for p in case.iter("property")}
    assert props["reproduce"].startswith(
        f"{REPRO} conformance.test_nvfp4_moe:check_padding_invariance --subject fp4_probes:end_padding"
    ), props
    assert f"--subject-path {probes}" in props["reproduce"]
    assert (other / "kept.py").exists(), "another subject's scripts were removed"
    scripts = sorted(p.name for p in subject_folder.glob("*.py"))
    assert scripts == ["test_nvfp4_moe_test_padding_invariance_flashinfer-trtllm.py"], scripts
    text = (subject_folder / scripts[0]).read_text()
    assert str(ROOT) not in text, "the script names the checkout's folder"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the subject's folder comes from the script
    rerun = subprocess.run(
        [sys.executable, str(subject_folder / scripts[0])], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert rerun.returncode != 0 and "padding changed the MoE output" in rerun.stderr, rerun.stderr[-2000:]


# --- 12. --model / --tp / --ep ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "want"),
    [
        pytest.param(("gemma-4-26b-a4b", 4, None), Pin("gemma-4-26b-a4b", 4, False), id="model-means-no-ep"),
        pytest.param(("gemma-4-26b-a4b", 4, True), Pin("gemma-4-26b-a4b", 4, True), id="model-ep"),
        pytest.param((None, 4, None), Pin(None, 4, None), id="tp-only-draws-ep"),
        pytest.param((None, None, False), Pin(None, None, False), id="no-ep"),
    ],
)
def test_session_pin(args: tuple, want: Pin) -> None:
    assert session_pin(*args) == want


PIN_PROBE = """
from hypothesis import given

from strategies.moe import moe_shapes


@given(shape=moe_shapes())
def test_pinned(shape):
    assert shape.tp == {tp}, shape
    assert {ep_check}, shape
"""


@pytest.mark.long(25)
@pytest.mark.parametrize(
    ("args", "tp", "ep_check"),
    [
        pytest.param(["--model", "gemma-4-26b-a4b", "--tp", "4"], 4, "not shape.ep", id="model-tp"),
        pytest.param(["--tp", "2", "--no-ep"], 2, "not shape.ep", id="tp-no-ep"),
        pytest.param(["--tp", "8", "--ep"], 8, "shape.ep", id="tp-ep"),
    ],
)
def test_pins_hold_for_every_draw(tmp_path: Path, args: list[str], tp: int, ep_check: str) -> None:
    module = tmp_path / "test_pin_probe.py"
    module.write_text(PIN_PROBE.format(tp=tp, ep_check=ep_check))
    env = {**os.environ, "FP4_PROFILE": "ci", "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [
        sys.executable, "-m", "pytest", str(module), "-p", "harness.plugin", "-p", "no:cacheprovider",
        "--rootdir", str(tmp_path), "--results", str(tmp_path / "results"), *args,
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "fp4 pin: model" in result.stdout
