"""The README is a short user guide whose commands run as written.

* It stays a guide (at most 300 lines); measurements and findings live in ``docs/``.
* Its two quick-start commands are the ones CI runs (``.ci/run``).
* Its worked verdict is what the command above it prints: the pasted reproduction line and summary row.
* Its external-subject example runs as written: the ``<!-- readme-test: my_fp4_engine.py -->`` block is
  saved as that module in a folder of its own, and the ``<!-- readme-test: command -->`` block runs from the
  checkout with ``$HOME/my-engine`` naming that folder (as the run it is, ``python -m pytest`` with its
  environment, in a process forked from the self-tests' pre-imported server, :mod:`tests.batch`); every
  selected property passes. The same module padding gated layers to 16 instead of 64 fails
  ``test_backend_accepts`` the way the worked verdict shows, so the example's command can tell.
* The options its table and ``docs/running.md`` name are registered ones, and ``docs/running.md`` names every
  registered marker.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests import batch

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme() -> str:
    return README.read_text(encoding="utf-8")


def block_after(marker: str) -> str:
    """The fenced block right after the HTML comment ``<!-- readme-test: {marker} -->``."""
    text = readme()
    start = text.index(f"<!-- readme-test: {marker} -->")
    m = _FENCE.search(text, start)
    assert m is not None, f"no code block after the {marker!r} marker"
    return m.group(1)


def section(title: str) -> str:
    """The README's ``## title`` section, up to the next ``## `` heading."""
    text = readme()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def commands(block: str) -> list[str]:
    """Shell command lines of a block: continuations joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    return [" ".join(line.split("#")[0].split()) for line in joined.splitlines() if line.split("#")[0].strip()]


def as_run(command: str, tmp_path: Path, env: dict[str, str] | None = None) -> batch.Run:
    """``command`` (``[NAME=VALUE ...] .venv/bin/python -m pytest ARGS``, as the README writes its commands) as the
    run it is (:mod:`tests.batch`): from the checkout, its ``NAME=VALUE`` words in its environment, ``ci`` profile
    unless it names one, its results under ``tmp_path`` and no GPU (the README shows the CPU machine's output).
    A command of another form fails the test: the README's commands stay ones this reads exactly."""
    words = shlex.split(command)
    assigned = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        assigned[name] = value
    assert words[:3] == [".venv/bin/python", "-m", "pytest"], f"not a `python -m pytest` command: {command}"
    args = [*words[3:], "-p", "no:cacheprovider", "--results", str(tmp_path / "results")]
    return batch.Run(args, env=batch.suite_env(**batch.CPU_ONLY, **(env or {}), **assigned))


def engine_path(folder: Path) -> str:
    """The README's ``PYTHONPATH=$HOME/my-engine`` for ``folder``, keeping how this interpreter finds its libraries
    (shell-quoted: it replaces a word of the command)."""
    return shlex.quote(os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))


def test_readme_is_a_short_guide() -> None:
    assert len(readme().splitlines()) <= 300, "move measurements and findings to docs/"


def test_quick_start_commands_are_the_ones_ci_runs() -> None:
    block = _FENCE.search(section("Install and run")).group(1)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    quick = [part.strip() for line in commands(block) for part in line.split("&&")]
    assert quick == [
        "scripts/install-cpu.sh",
        ".venv/bin/python -m pytest -n auto conformance",
        ".venv/bin/python -m pytest -n auto tests",
    ]
    for command in quick:
        assert command in ci, f".ci/run does not run {command!r}"


@pytest.mark.long(25)
def test_worked_verdict_is_what_its_command_prints(tmp_path: Path) -> None:
    text = section("Reading a verdict")
    (command,) = commands(_FENCE.search(text).group(1))
    pasted = _FENCE.findall(text)[1]
    triage = {"FP4_DB": str(tmp_path / "db")}  # the triage profile keeps a database
    result = batch.run(as_run(command, tmp_path, env=triage), tmp_path / "run")
    assert result.returncode == 1, result.stdout[-3000:]
    # the line starts with the interpreter that ran the suite (harness.repro.shell_command; a run forks from a
    # server this interpreter started, and it may be named python3): compare the rest
    marker = " -m harness.repro "
    reproduce = next(line for line in pasted.splitlines() if marker in line and line.endswith("}'"))
    printed = [line for line in result.stdout.splitlines() if marker in line and line.endswith("}'")]
    assert [line.split(marker, 1)[1] for line in printed].count(reproduce.split(marker, 1)[1]) >= 1, printed
    assert all(line.split(marker, 1)[0].endswith(shlex.quote(sys.executable)) for line in printed), printed
    lines = result.stdout.splitlines()
    for line in pasted.splitlines():
        if line.startswith(("nvfp4_moe ", "fp4 pin: ")):
            assert line in lines, line
        elif line.startswith("FAILED "):  # pytest appends " - <message>" where the terminal is wide enough
            assert any(printed == line or printed.startswith(line + " - ") for printed in lines), line


@pytest.mark.long(150)
def test_external_subject_example_runs_as_written(tmp_path: Path) -> None:
    source = block_after("my_fp4_engine.py")
    (command,) = commands(block_after("command"))
    assert "$HOME/my-engine" in command
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    (good / "my_fp4_engine.py").write_text(source, encoding="utf-8")
    pad16 = source.replace("64 if gated else 128", "16 if gated else 128")
    assert pad16 != source
    (bad / "my_fp4_engine.py").write_text(pad16, encoding="utf-8")

    ran = batch.run_all(
        {
            "good": as_run(command.replace("$HOME/my-engine", engine_path(good)), good),
            "bad": as_run(command.replace("$HOME/my-engine", engine_path(bad)) + " -k backend_accepts", bad),
        },
        tmp_path / "runs",
    )
    result, broken = ran["good"], ran["bad"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"\b5 passed\b", result.stdout), result.stdout[-3000:]
    assert "failed" not in result.stdout.splitlines()[-1]

    assert broken.returncode == 1, broken.stdout[-3000:]
    assert "flashinfer-trtllm rejects Ip=" in broken.stdout
    assert "input_tensor.shape[0]=" in broken.stdout and "must be a multiple of 128" in broken.stdout


@pytest.mark.long(10)
def test_documented_options_are_registered(tmp_path: Path) -> None:
    """Every option the README's table and ``docs/running.md`` name is one ``pytest --help`` lists."""
    ask = ["--help", "-p", "no:cacheprovider", "--results", str(tmp_path / "results")]
    help_text = batch.run(batch.Run(ask, env=batch.suite_env()), tmp_path / "run", 300).stdout
    running = (ROOT / "docs" / "running.md").read_text(encoding="utf-8")
    for text in (section("Options and profiles"), running):
        named = {o for row in text.splitlines() if row.startswith("| `--") for o in re.findall(r"`(--[a-z0-9-]+)", row)}
        assert named, "no option table found"
        assert not {o for o in named if not re.search(rf"(?<![\w-]){o}\b", help_text)}


def test_documented_markers_are_the_registered_ones() -> None:
    """``docs/running.md`` §2 names every marker the plugin registers (requirements, contract, backends, long)."""
    from harness import hardware, plugin, scheduling

    running = (ROOT / "docs" / "running.md").read_text(encoding="utf-8")
    registered = [m.split("(")[0].split(":")[0] for m in [*plugin.MARKERS, scheduling.MARKER, scheduling.LATE]]
    assert set(hardware.REQUIREMENTS) <= set(registered)
    assert not [m for m in registered if f"`{m}" not in running]
