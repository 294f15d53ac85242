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

Each end-to-end test runs ``python -m pytest`` on the suite or a probe module, like a user would; the
module's runs share one process (:mod:`tests.batch`, made by :func:`make_runs`), each with its own
environment, working folder and results.
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
from tests import batch

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


BAD_INPUTS = {
    "option": (["--hypothesis-profile", "nightlly"], {}, "unknown Hypothesis profile 'nightlly'"),
    "env": ([], {"FP4_PROFILE": "nightlly"}, "unknown Hypothesis profile 'nightlly'"),
    "module-raises": (["--subject", "fp4_broken:subject"], {}, "RuntimeError: engine extension failed to initialise"),
    "factory": (["--subject", "fp4_probes:factory_raises"], {}, "RuntimeError: engine config file not found"),
    "limit-neg": (["--example-time-limit", "-1"], {}, "--example-time-limit -1: give the seconds"),
    "limit-nan": (["--example-time-limit", "nan"], {}, "--example-time-limit nan: give the seconds"),
    "db-number": (
        ["--hypothesis-profile", "nightly", "--fp4-db", f"redis://:{PASSWORD}@127.0.0.1:6379/x"],
        {},
        "'redis://:***@127.0.0.1:6379/x': the port and the database number must be integers",
    ),
    "db-unreachable-env": (
        ["--hypothesis-profile", "nightly"],
        {"FP4_DB": f"redis://:{PASSWORD}@127.0.0.1:1/0"},
        "Redis example database redis://:***@127.0.0.1:1/0 does not answer"
        if importlib.util.find_spec("redis")
        else "--fp4-db redis://:***@127.0.0.1:1/0 needs the redis client",
    ),
}
PIN_CASES = {
    "model-tp": (["--model", "gemma-4-26b-a4b", "--tp", "4"], 4, "not shape.ep"),
    "tp-no-ep": (["--tp", "2", "--no-ep"], 2, "not shape.ep"),
    "tp-ep": (["--tp", "8", "--ep"], 8, "shape.ep"),
}
VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None


def make_runs(folder: Path) -> dict[str, batch.Run]:
    """Every end-to-end run of this module, each ``python -m pytest ARGS`` from the checkout with results
    under ``folder / name``, the probe subjects (``fp4_probes``) importable where ``probes`` is set."""
    engine = folder / "engine"
    engine.mkdir(parents=True)
    (engine / "fp4_probes.py").write_text(PROBES)
    (engine / "fp4_broken.py").write_text("raise RuntimeError('engine extension failed to initialise')\n")
    runs: dict[str, batch.Run] = {}

    def add(name: str, *args: str, probes: bool = True, env: dict[str, str] | None = None, waits: bool = False) -> None:
        results = [] if any(a.startswith("--results") for a in args) else ["--results", str(folder / name / "results")]
        full_env = batch.suite_env(**(env or {}))
        runs[name] = batch.Run(
            ["-p", "no:cacheprovider", "-q", *results, *args],
            env=batch.with_path(full_env, engine) if probes else full_env,
            waits=waits,
        )

    for probe in ("documented", "upstream_copy", "import_error", "other_message", "adapter_bug"):
        add(probe, NVFP4, *CUTLASS_PADDING, "--subject", f"fp4_probes:{probe}")
    add("missing_library", NVFP4, *CUTLASS_PADDING, "-rs", "--subject", "fp4_probes:missing_library")
    add("no_engine", NVFP4, "--subject", "fp4_probes:no_engine")
    if not VLLM_INSTALLED:
        add("no_vllm", NVFP4, "--subject", "vllm", probes=False)
    (folder / "unwritable").mkdir(parents=True)
    (folder / "unwritable" / "a-file").write_text("")
    add("unwritable", SHARED, "--results", str(folder / "unwritable" / "a-file" / "results"), probes=False)
    (folder / "db-file").write_text("")
    db = str(folder / "db-file")
    add("db-file-option", SHARED, "--hypothesis-profile", "nightly", "--fp4-db", db, probes=False)
    add("db-file-env", SHARED, "--hypothesis-profile", "nightly", probes=False, env={"FP4_DB": db})
    for case, (args, env, _) in BAD_INPUTS.items():
        add(f"bad-{case}", SHARED, *args, env=env)
    for case, workers in (("no-xdist", []), ("xdist", ["-n", "1"])):
        add(f"hangs-{case}", NVFP4, *CUTLASS_PADDING, *workers, "--subject", "fp4_probes:hangs",
            "--example-time-limit", "2", waits=True)  # fmt: skip
    # no replacement worker after the crash (xdist would start one, about 5 CPU s, for no test left)
    add("stuck", NVFP4, *CUTLASS_PADDING, "-n", "1", "--max-worker-restart", "0", "--subject", "fp4_probes:stuck",
        "--example-time-limit", "1", waits=True)  # fmt: skip
    # JUnit and scripts: a stale script of this subject, and another subject's, before the run
    stale = folder / "junit" / "results" / "repro"
    (stale / "fp4_probes_end_padding").mkdir(parents=True)
    (stale / "fp4_probes_end_padding" / "stale_from_an_earlier_run.py").write_text("raise SystemExit('stale')\n")
    (stale / "bad-end-padding").mkdir(parents=True)
    (stale / "bad-end-padding" / "kept.py").write_text("")
    add("junit", NVFP4, "-k", "padding_invariance", "--backend", "flashinfer-trtllm", "--subject",
        "fp4_probes:end_padding", "--model", "gemma-4-26b-a4b", "--tp", "2", f"--junitxml={folder / 'junit.xml'}")  # fmt: skip
    for case, (args, tp, ep_check) in PIN_CASES.items():
        module = folder / f"pin-{case}" / "test_pin_probe.py"
        module.parent.mkdir(parents=True)
        module.write_text(PIN_PROBE.format(tp=tp, ep_check=ep_check))
        env = {**batch.suite_env(), "PYTHONPATH": str(ROOT)}
        runs[f"pin-{case}"] = batch.Run(
            [str(module), "-p", "harness.plugin", "-p", "no:cacheprovider", "--rootdir", str(module.parent),
             "--results", str(module.parent / "results"), *args],
            cwd=module.parent, env=env,
        )  # fmt: skip
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, batch.Ran]]:
    """This module's end-to-end runs, in one process (:mod:`tests.batch`): their folder and results."""
    return batch.shared(tmp_path_factory, "verdicts", make_runs)


def one_line_usage_error(result: batch.Ran, message: str) -> None:
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


@pytest.mark.late
@pytest.mark.parametrize(
    "probe",
    # the first test of this module runs the module's batch (the rest read it): only it is marked long
    [pytest.param("documented", marks=pytest.mark.long(300)), "upstream_copy"],
)
def test_documented_failure_is_expected(runs: tuple[Path, dict[str, batch.Ran]], probe: str) -> None:
    result = runs[1][probe]
    assert result.returncode == 0, result.stdout[-3000:]
    assert "expected failures (known upstream bug https://github.com/example/engine/issues/1)" in result.stdout


@pytest.mark.late
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
def test_other_failures_where_the_ledger_applies_fail(
    runs: tuple[Path, dict[str, batch.Ran]], probe: str, shown: str
) -> None:
    result = runs[1][probe]
    assert result.returncode == 1, result.stdout[-3000:]
    assert shown in result.stdout
    assert "not the known upstream bug https://github.com/example/engine/issues/1" in result.stdout
    assert "expected failures" not in result.stdout


@pytest.mark.late
def test_missing_library_where_the_ledger_applies_skips(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    result = runs[1]["missing_library"]
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 skipped" in result.stdout and "probe-lib is not installed" in result.stdout
    assert "expected failures" not in result.stdout


@pytest.mark.late
def test_engine_subject_without_its_engine_is_a_usage_error(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    one_line_usage_error(runs[1]["no_engine"], "cannot run here: probe-engine is not installed")


@pytest.mark.late
@pytest.mark.skipif(VLLM_INSTALLED, reason="vLLM is installed here")
def test_vllm_subject_without_vllm_is_a_usage_error(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    one_line_usage_error(runs[1]["no_vllm"], "vLLM is not installed")


# --- 7, 8, 10: usage errors before the first test --------------------------------------------------


@pytest.mark.late
def test_unwritable_results_is_a_usage_error(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    one_line_usage_error(runs[1]["unwritable"], "--results")


@pytest.mark.late
@pytest.mark.parametrize("how", ["option", "env"])
def test_example_database_that_is_a_file_is_a_usage_error(runs: tuple[Path, dict[str, batch.Ran]], how: str) -> None:
    one_line_usage_error(runs[1][f"db-file-{how}"], "is a file, not a directory")


@pytest.mark.late
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_a_one_line_usage_error(runs: tuple[Path, dict[str, batch.Ran]], case: str) -> None:
    result = runs[1][f"bad-{case}"]
    one_line_usage_error(result, BAD_INPUTS[case][2])
    assert PASSWORD not in result.stdout + result.stderr, "the database password was printed"


# --- 9. per-example time limit -----------------------------------------------------------------------


@pytest.mark.late
@pytest.mark.parametrize("workers", ["no-xdist", "xdist"])
def test_hanging_example_fails_named_with_its_reproduction(
    runs: tuple[Path, dict[str, batch.Ran]], workers: str
) -> None:
    result = runs[1][f"hangs-{workers}"]
    out = result.stdout
    assert result.returncode == 1, out[-3000:]
    assert "ExampleTimeout" in out and "per-example time limit of 2 s" in out, out[-3000:]
    assert "test_nvfp4_moe.py::test_padding_invariance[flashinfer-cutlass]" in out
    scripts = list((runs[0] / f"hangs-{workers}" / "results" / "repro" / "fp4_probes_hangs").glob("*.py"))
    assert len(scripts) == 1, out[-3000:]


@pytest.mark.late
def test_uninterruptible_hang_ends_the_worker_with_its_reproduction(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    result = runs[1]["stuck"]
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert f"worker crashed during this example; reproduce: {REPRO}" in out, out[-3000:]
    assert list((runs[0] / "stuck" / "results" / "repro" / "fp4_probes_stuck").glob("*-crash.py"))


def test_time_limit_comes_from_the_profile() -> None:
    from harness import profiles

    assert set(profiles.TIME_LIMITS) == set(profiles.PROFILES)
    assert all(limit > 0 for limit in profiles.TIME_LIMITS.values())


# --- 11. JUnit and reproduction scripts ----------------------------------------------------------


@pytest.mark.late
def test_junit_and_scripts_of_an_external_subject(runs: tuple[Path, dict[str, batch.Ran]]) -> None:
    """Before the run (:func:`make_runs`): a stale script of this subject and another subject's script."""
    folder, result = runs[0], runs[1]["junit"]
    subject_folder = folder / "junit" / "results" / "repro" / "fp4_probes_end_padding"
    other = folder / "junit" / "results" / "repro" / "bad-end-padding"
    probes, junit = folder / "engine", folder / "junit.xml"
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


@pytest.mark.late
@pytest.mark.parametrize("case", list(PIN_CASES))
def test_pins_hold_for_every_draw(runs: tuple[Path, dict[str, batch.Ran]], case: str) -> None:
    """A probe module run with the pin options asserts the pin on every draw (:func:`make_runs`)."""
    result = runs[1][f"pin-{case}"]
    assert result.returncode == 0, result.stdout[-3000:]
    assert "fp4 pin: model" in result.stdout
