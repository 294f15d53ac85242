#!/usr/bin/env python3
"""Build FlashInfer's SM90 CUTLASS fused-MoE module with ``FAST_BUILD`` for host *and* nvcc.

FlashInfer 0.7.4's ``gen_cutlass_fused_moe_sm90_module(use_fast_build=True)`` puts ``-DFAST_BUILD``
in the host-compiler flags only; the spec built here (``adapters.flashinfer_sm90_moe.fast_build_spec``)
adds it to the nvcc flags and is named ``fused_moe_90_fastbuild``, so it never clashes with the
stock ``fused_moe_90``. ``adapters/flashinfer_sm90_moe.py`` loads the result for the W4A16 tests.

Usage, on the SM90 host from the project root, after ``source .device/setup.sh``:

  # start in the background (survives the 10-minute command limit; logs to --log):
  setsid nohup python3 scripts/build_fused_moe_sm90_fast.py --log /tmp/fastbuild.log >/dev/null 2>&1 &
  # poll from later commands (exit 0 built, 1 failed, 2 still running, 3 died without a result):
  python3 scripts/build_fused_moe_sm90_fast.py --status --log /tmp/fastbuild.log
  # foreground (prints to the terminal):
  python3 scripts/build_fused_moe_sm90_fast.py
  # check the spec without a GPU or a compiler run (on a CPU host it sets FLASHINFER_CUDA_ARCH_LIST=9.0a):
  python3 scripts/build_fused_moe_sm90_fast.py --dry-run

Cost (``--dry-run`` prints the census): FAST_BUILD on nvcc turns 67 of the 220 generated CUTLASS
units into throw-stubs (same-type grouped GEMMs and dense fpA_intB GEMMs other than 128x128 tiles
with 1x1x1 clusters), but the 118 SM90 mixed-input units (940 kernels: W4A16, W4A8, FP8xMXFP4) have
no FAST_BUILD gate and compile in full. Measured with nvcc 13.0 on a 1x H200 host (16 cores, 128 GB): a
mixed-input unit ~146 CPU-s and 7 GB peak RSS, a stubbed unit ~50 CPU-s and 2.2 GB. Expect roughly
430 CPU-min in all: ~27 min at ``-j 16`` (near the 128 GB of one H200 host at 7 GB a job), ~14 min
at ``-j 32`` on a 2x H200 host (32 cores, 256 GB).

The build prints ninja progress with the elapsed wall time, then the slowest compile units (from
``.ninja_log``), loads the ``.so`` and ends with one JSON line
``{"build_seconds", "module_path", "ok", "error", ...}``, also written to ``<log>.json``. It exits
non-zero on failure. ``MAX_JOBS`` (or ``--jobs``) sets ninja's parallelism.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REQUIRED_ATTRS = ("init", "interleave_moe_weights_for_sm90_mixed_gemm", "set_deepgemm_jit_include_dirs")
DEFAULT_RESULT = Path("/tmp/fused_moe_90_fastbuild.json")
_STATUS = re.compile(r"^\[(\d+)/(\d+)\] ")
_INT3 = r"cute::Shape<cute::Int<(\d+)>, cute::Int<(\d+)>, cute::Int<(\d+)>>"
_CTA_CGA = re.compile(f"{_INT3}, {_INT3}")
_GROUPED = re.compile(r"INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM\(([^;]*)\);")

from adapters.flashinfer_sm90_moe import W4A16_LAUNCHER  # noqa: E402 - after the project root is on the path

NARROW = False
"""``--w4a16``: build :func:`adapters.flashinfer_sm90_moe.w4a16_spec` instead of the whole FAST_BUILD spec."""


def fast_spec():
    from adapters.flashinfer_sm90_moe import fast_build_spec, w4a16_spec

    return w4a16_spec() if NARROW else fast_build_spec()


def _kept_under_fast_build(cta_m: int, cta_n: int, cga: tuple[int, ...], dynamic: bool) -> bool:
    """``should_filter_tma_warp_specialized_gemm_problem_shape`` with FAST_BUILD: keep 128x128xK, 1x1x1."""
    return (cta_m, cta_n) == (128, 128) and all(c == 1 for c in cga) and not dynamic


def census(sources: Iterable[Path]) -> tuple[dict[str, list[int]], list[str]]:
    """Per kind of generated CUTLASS unit: ``[units, instantiations, kept by FAST_BUILD, units fully stubbed]``.

    FAST_BUILD only gates ``moe_gemm_tma_ws_launcher.inl`` (same-type grouped GEMMs) and
    ``fpA_intB_launcher_sm90.inl`` (dense mixed GEMMs); the SM90 mixed-input grouped launcher (W4A16,
    W4A8, FP8xMXFP4) and the SM80 launchers compile in full. Also returns the units that hold the
    W4A16 (BF16 x MXFP4) 128x128x128 kernels, the only W4A16 tile FAST_BUILD's heuristic offers.
    """
    table: dict[str, list[int]] = {}
    w4a16_units = []
    for src in sources:
        if not src.name.endswith(".generated.cu"):
            continue
        text = src.read_text()
        if "mixed_input_launcher.inl" in text:
            kind, n = "sm90 mixed-input grouped (W4A16/W4A8/FP8xFP4)", text.count("template void")
            kept = n
            if any(
                W4A16_LAUNCHER in inst and "cute::Int<128>, cute::Int<128>, cute::Int<128>>" in inst
                for inst in text.split("template void")
            ):
                w4a16_units.append(src.name)
        elif "fpA_intB_launcher_sm90.inl" in text:
            kind = "sm90 dense fpA_intB GEMM"
            shapes = [tuple(map(int, m)) for m in _CTA_CGA.findall(text)]
            n, kept = len(shapes), sum(_kept_under_fast_build(s[0], s[1], s[3:], False) for s in shapes)
        elif "moe_gemm_tma_ws_launcher.inl" in text:
            kind = "sm90 same-type grouped (BF16/FP16/FP32/FP8)"
            args = [[a.strip() for a in m.split(",")] for m in _GROUPED.findall(text)]
            n = len(args)
            kept = sum(
                _kept_under_fast_build(int(a[7]), int(a[8]), (int(a[10]), int(a[11]), int(a[12])), a[14] == "true")
                for a in args
            )
        else:
            kind, n = "sm80 grouped", text.count("template void")
            kept = n
        row = table.setdefault(kind, [0, 0, 0, 0])
        row[0] += 1
        row[1] += n
        row[2] += kept
        row[3] += kept == 0
    return table, sorted(w4a16_units)


def print_census(spec) -> None:
    table, w4a16 = census(spec.sources)
    print(f"{'generated CUTLASS units':<48} {'units':>6} {'insts':>6} {'kept':>6} {'stubbed units':>14}")
    for kind, (units, insts, kept, stubbed) in table.items():
        print(f"{kind:<48} {units:>6} {insts:>6} {kept:>6} {stubbed:>14}")
    other = sum(not s.name.endswith(".generated.cu") for s in spec.sources)
    print(f"hand-written sources (dispatch, binding, runtime): {other}")
    print(f"units holding the W4A16 128x128x128 kernels FAST_BUILD's heuristic selects: {', '.join(w4a16) or 'NONE'}")


def dry_run() -> int:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    spec = fast_spec()
    commands = {Path(c["file"]).name: c["command"] for c in spec.get_compile_commands()}
    cuda = next(c for f, c in commands.items() if f.endswith(".cu") and not f.endswith(".generated.cu"))
    cxx = next(c for f, c in commands.items() if f.endswith(".cpp"))
    print(f"module: {spec.name}\nlibrary: {spec.get_library_path()}\nbuild dir: {spec.build_dir}")
    print(f"sources: {len(spec.sources)} ({sum(s.suffix == '.cu' for s in spec.sources)} CUDA)")
    print(f"nvcc command (first CUDA source):\n  {cuda}\nhost command (first C++ source):\n  {cxx}")
    for label, cmd in (("nvcc", cuda), ("host", cxx)):
        print(f"-DFAST_BUILD in {label} flags: {'-DFAST_BUILD' in cmd.split()}")
    print_census(spec)
    missing = [s for s in spec.sources if not s.exists()]
    if missing or "-DFAST_BUILD" not in cuda.split() or "-DFAST_BUILD" not in cxx.split():
        print(f"spec is malformed: missing sources {missing[:3]}")
        return 1
    return 0


def _ninja_durations(build_dir: Path) -> list[tuple[float, str]]:
    """``(seconds, output name)`` per edge of the last build, from ninja's ``.ninja_log``."""
    log = build_dir / ".ninja_log"
    if not log.exists():
        return []
    latest: dict[str, float] = {}
    for line in log.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit():
            latest[Path(parts[3]).name] = (int(parts[1]) - int(parts[0])) / 1000
    return sorted(((s, n) for n, s in latest.items()), reverse=True)


def _check_loadable(spec) -> None:
    module = spec.load()
    missing = [a for a in REQUIRED_ATTRS if not hasattr(module, a)]
    if missing:
        raise RuntimeError(f"{spec.get_library_path()} loads but lacks {missing}")


def build(jobs: int, result_path: Path) -> int:
    from filelock import FileLock

    start = time.monotonic()
    result = {"build_seconds": None, "module_path": None, "ok": False, "error": None}
    try:
        spec = fast_spec()
        result["module_path"] = str(spec.get_library_path())
        print(f"module {spec.name} -> {result['module_path']}; ninja -j {jobs}; {os.cpu_count()} CPUs", flush=True)
        print_census(spec)
        if shutil.which("ninja") is None:
            raise RuntimeError("ninja is not on PATH (FlashInfer's JIT needs it too)")
        with FileLock(spec.lock_path, thread_local=False):
            spec.write_ninja()
            cmd = ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path), "-j", str(jobs)]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
            assert proc.stdout is not None
            for line in proc.stdout:
                elapsed = time.monotonic() - start
                m = _STATUS.match(line)
                if m:
                    target = line.split(" -o ")[-1].split()[0] if " -o " in line else line.split()[-1]
                    print(f"[{elapsed / 60:5.1f} min] [{m[1]}/{m[2]}] {Path(target).name}", flush=True)
                else:
                    print(line.rstrip()[:4000], flush=True)
            if proc.wait() != 0:
                raise RuntimeError(f"ninja exited {proc.returncode} (see the log above)")
        result["build_seconds"] = round(time.monotonic() - start, 1)
        slowest = _ninja_durations(spec.build_dir)
        print("slowest compile units (s):")
        for seconds, name in slowest[:12]:
            print(f"  {seconds:8.1f}  {name}")
        result["ninja_edges"] = len(slowest)
        result["slowest"] = [[round(s, 1), n] for s, n in slowest[:12]]
        result["so_bytes"] = spec.get_library_path().stat().st_size
        _check_loadable(spec)
        result["ok"] = True
    except Exception as exc:  # noqa: BLE001 - every failure must still end in the JSON result line
        result["error"] = f"{type(exc).__name__}: {exc}"[-4000:]
        result["build_seconds"] = round(time.monotonic() - start, 1)
    line = json.dumps(result)
    print(line, flush=True)
    result_path.write_text(line + "\n")
    return 0 if result["ok"] else 1


def status(log: Path, result_path: Path) -> int:
    """0 built, 1 failed, 2 still running, 3 no result and no live builder."""
    if result_path.exists():
        text = result_path.read_text().strip()
        print(text)
        return 0 if json.loads(text)["ok"] else 1
    lines = log.read_text().splitlines() if log.exists() else []
    progress = [ln for ln in lines if ln.startswith("[") and " min] [" in ln]
    print(progress[-1] if progress else (lines[-1] if lines else f"{log} is empty or absent"))
    pid_file = log.with_name(log.name + ".pid")
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        print("builder is not running and left no result")
        return 3
    print("still building")
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the flags, sources and census; compile nothing")
    parser.add_argument("--status", action="store_true", help="report on a background build started with --log")
    parser.add_argument("--log", type=Path, help="send all output here (for background runs)")
    parser.add_argument("--result", type=Path, help="JSON result file (default <log>.json, else /tmp/...)")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1))
    parser.add_argument("--w4a16", action="store_true", help="only the units the W4A16 path instantiates")
    args = parser.parse_args(argv)
    global NARROW
    NARROW = args.w4a16
    result_path = args.result or (args.log.with_name(args.log.name + ".json") if args.log else DEFAULT_RESULT)
    if args.dry_run:
        return dry_run()
    if args.status:
        if args.log is None:
            parser.error("--status needs --log")
        return status(args.log, result_path)
    if args.log is not None:
        result_path.unlink(missing_ok=True)
        args.log.with_name(args.log.name + ".pid").write_text(str(os.getpid()))
        out = open(args.log, "w", buffering=1)  # noqa: SIM115 - stays open for the process lifetime
        os.dup2(out.fileno(), sys.stdout.fileno())
        os.dup2(out.fileno(), sys.stderr.fileno())
        sys.stdout.reconfigure(line_buffering=True)
    return build(args.jobs, result_path)


if __name__ == "__main__":
    sys.exit(main())
