"""Self-tests of the pytest plugin: options, profiles, worker-to-device mapping, reproductions.

The end-to-end tests run the real conformance suite in a subprocess (``python -m pytest``) on
one property and assert on its exit status and output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import devices, profiles
from harness.repro import Reproduction
from subjects.registry import SubjectError, known_bad, resolve

ROOT = Path(__file__).resolve().parent.parent
NVFP4 = "conformance/test_nvfp4_moe.py"


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
    with pytest.raises(ValueError, match="unknown Hypothesis profile 'fast'"):
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


def test_cli_rejects_unknown_subject_backend_and_model(tmp_path: Path) -> None:
    for args, message in (
        (["--subject", "no_such_engine.moe:align"], "cannot import module 'no_such_engine.moe'"),
        (["--backend", "flashinfer-trtlm"], "unknown backend(s) flashinfer-trtlm"),
        (["--model", "gemma-5"], "is not catalogued"),
    ):
        result = run_pytest(NVFP4, *args, tmp_path=tmp_path)
        assert result.returncode == 4, result.stdout + result.stderr
        assert message in result.stderr, result.stderr


def test_external_policy_by_import_path(tmp_path: Path) -> None:
    (tmp_path / "my_engine.py").write_text(
        "from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment\n\n"
        "class MyAlignment(BuiltinNvfp4MoeAlignment):\n    pass\n\npolicy = MyAlignment()\n"
    )
    result = run_pytest(
        NVFP4,
        "-k",
        "padding_invariance",
        "--subject",
        "my_engine:policy",
        tmp_path=tmp_path,
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))},
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "2 passed" in result.stdout


def test_known_bad_failure_writes_a_reproduction_that_fails_the_same_way(tmp_path: Path) -> None:
    result = run_pytest(
        NVFP4,
        "-k",
        "padding_invariance and trtllm",
        "--subject",
        "bad-end-padding",
        "--model",
        "gemma-4-26b-a4b",
        "--tp",
        "2",
        tmp_path=tmp_path,
    )
    assert result.returncode == 1, result.stdout[-3000:]
    assert "reproduce: python -m harness.repro conformance.test_nvfp4_moe:check_padding_invariance" in result.stdout
    scripts = list((tmp_path / "results" / "repro").glob("*.py"))
    assert len(scripts) == 1
    rerun = subprocess.run([sys.executable, str(scripts[0])], capture_output=True, text=True, timeout=300)
    assert rerun.returncode != 0
    assert "padding changed the MoE output" in rerun.stderr


def test_summary_table_reports_contract_backend_hardware(tmp_path: Path) -> None:
    result = run_pytest(NVFP4, "-k", "layout_contract", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "fp4 conformance summary (contract x backend x hardware)" in result.stdout
    assert (tmp_path / "results" / "summary.json").exists()


def test_reproduction_command_round_trips() -> None:
    r = Reproduction("conformance.test_nvfp4_moe:check_layout_contract", "builtin", "flashinfer-cutlass", {"a": 1})
    assert r.command().startswith("python -m harness.repro conformance.test_nvfp4_moe:check_layout_contract")
    assert "--backend flashinfer-cutlass" in r.command()


def test_policy_class_by_import_path_is_instantiated() -> None:
    subject = resolve("subjects.nvfp4_moe:BuiltinNvfp4MoeAlignment")
    assert not isinstance(subject.policy("nvfp4_moe"), type)


def test_plugin_loads_without_xdist(tmp_path: Path) -> None:
    result = run_pytest(NVFP4, "-p", "no:xdist", "-k", "layout_contract and cutlass", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


CRASHING_MODULE = """
import os
from dataclasses import dataclass

from harness.repro import check, run_check
from strategies.config import Config


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


def test_worker_crash_is_reported_with_its_reproduction(tmp_path: Path) -> None:
    """A check that kills its xdist worker is that test's failure, with the in-flight reproduction."""
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
    assert "worker crashed during a kernel call; reproduce: python -m harness.repro" in out, out[-3000:]
    assert list((tmp_path / "results" / "repro").glob("*-crash.py"))


def test_model_pins_select_the_pinned_regressions() -> None:
    from strategies.moe import pinned_shape
    from strategies.pins import Pin, matches_pin

    gemma_tp4 = pinned_shape("gemma-4-26b-a4b", 4)
    assert matches_pin(gemma_tp4, Pin())
    assert matches_pin(gemma_tp4, Pin("gemma-4-26b-a4b", 4))
    assert not matches_pin(gemma_tp4, Pin("gemma-4-26b-a4b", 2))
    assert not matches_pin(gemma_tp4, Pin("qwen3-30b-a3b"))
    assert not matches_pin(gemma_tp4, Pin(tp=4, ep=True))
