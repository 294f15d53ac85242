"""The self-tests' batch runner (:mod:`tests.batch`): how many runs go at once, and that each run, forked from the
run server, keeps its own result, a crashed one included."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import batch


@pytest.mark.parametrize(
    ("runs", "workers", "want"),
    [(26, 1, 1), (26, 2, 1), (26, 7, 1), (26, 8, 2), (26, 16, 4), (26, 64, 4), (3, 16, 3), (1, 16, 1)],
)
def test_a_batch_is_split_only_with_many_workers(runs: int, workers: int, want: int) -> None:
    assert batch.drivers(runs, workers) == want


def module_run(tmp_path: Path, name: str, source: str, *args: str, waits: bool = False, **env: str) -> batch.Run:
    """``python -m pytest test_NAME.py ARGS`` from ``tmp_path``, the module's text ``source``, results in
    ``tmp_path / name``, the suite's environment plus ``env``."""
    module = tmp_path / f"test_{name}.py"
    module.write_text(source)
    args = (str(module), "-p", "no:cacheprovider", "-q", *args, "--results", str(tmp_path / name))
    return batch.Run(args, cwd=tmp_path, env=batch.suite_env(**env), waits=waits)


def test_a_split_batch_keeps_each_runs_result(tmp_path: Path) -> None:
    """Four runs, two at a time: each test's own exit status and output come back under its name; a run that ends
    its process outside pytest (``os._exit(3)``) has its process's exit status, and the others are not affected."""
    bodies = {"passes": "pass", "fails": "assert False", "exits": "import os; os._exit(3)"}
    runs = {
        name: module_run(tmp_path, name, f"def test_{name}():\n    {body}\n", "-p", "no:xdist")
        for name, body in bodies.items()
    }
    runs["usage"] = batch.Run(["--no-such-option"], cwd=tmp_path, env=batch.suite_env())
    results = batch.run_all(runs, tmp_path / "out", parts=2)
    assert {name: ran.returncode for name, ran in results.items()} == {"passes": 0, "fails": 1, "exits": 3, "usage": 4}
    assert "1 passed" in results["passes"].stdout and "1 failed" in results["fails"].stdout
    assert "exit status 3: the run's process ended outside pytest" in results["exits"].stderr


def test_a_waiting_run_goes_beside_the_queue(tmp_path: Path) -> None:
    """A run that :attr:`~tests.batch.Run.waits` starts while the queue's one driver is busy: the queued run waits
    for a file only the waiting run (named after it) writes, which it would never see if the waiting run were
    queued behind it."""
    flag = tmp_path / "flag"
    queued = (
        "import pathlib, time\n\n\ndef test_queued():\n    deadline = time.monotonic() + 60\n"
        f"    while not pathlib.Path({str(flag)!r}).exists():\n"
        "        assert time.monotonic() < deadline, 'the waiting run did not start beside the queue'\n"
        "        time.sleep(0.05)\n"
    )
    waiting = f"import pathlib\n\n\ndef test_waiting():\n    pathlib.Path({str(flag)!r}).write_text('')\n"
    runs = {
        "queued": module_run(tmp_path, "queued", queued, "-p", "no:xdist"),
        "waiting": module_run(tmp_path, "waiting", waiting, "-p", "no:xdist", waits=True),
    }
    results = batch.run_all(runs, tmp_path / "out", parts=1)
    assert {name: ran.returncode for name, ran in results.items()} == {"queued": 0, "waiting": 0}, results


def test_a_runs_xdist_worker_is_forked_by_the_server(tmp_path: Path) -> None:
    """``-n 1`` in a run: the worker's parent is the run server (the run's parent, whose pid the run's ``conftest.py``
    writes), the worker has the run's environment and folder, its test passes, and its CPU seconds are in the run's
    ``workers-cpu`` file."""
    (tmp_path / "conftest.py").write_text(
        "import os, pathlib\n\n\ndef pytest_configure(config):\n"
        "    if not hasattr(config, 'workerinput'):\n"
        "        pathlib.Path('run-server').write_text(str(os.getppid()))\n"
    )
    source = (
        "import os, pathlib\n\n\ndef test_forked():\n"
        "    assert os.getppid() == int(pathlib.Path('run-server').read_text())\n"
        "    assert os.environ['FP4_BATCH_PROBE'] == 'seen' and pathlib.Path.cwd() == pathlib.Path(__file__).parent\n"
    )
    result = batch.run(module_run(tmp_path, "forked", source, "-n", "1", FP4_BATCH_PROBE="seen"), tmp_path / "out")
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    assert len((tmp_path / "out" / "run" / batch.WORKERS_CPU).read_text().split()) == 1
