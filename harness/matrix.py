"""The deployment matrix: ``python -m harness.matrix --engine vllm|sglang`` (then ``--render``).

For every catalogued model with a public FP4 checkpoint (:data:`subjects.engine_tools.FP4_CHECKPOINTS`), every
hardware class (:class:`subjects.engine_tools.Hardware`) and every parallel degree (:data:`DEGREES`: TP 1-16,
and EP 2-16 with whole experts per rank), one cell says what the engine does with every flag at its default:

1. the engine's default backend, read from its own selection code (``subjects/<engine>/defaults.py``);
2. that backend's properties, run once (:func:`alignment_config`, :func:`sharding_config`): the format's alignment
   checks that hold for the backend without a GPU (``conformance/test_<format>_moe.py``) on rank 0, and under plain
   TP the two ``moe_sharding`` checks on the whole layer (under EP every rank holds whole experts at the whole
   ``I``: the alignment checks decide), with the engine's subject as the policy;
3. each failure judged against the subject's ledger (:class:`subjects.registry.KnownFailure`).

A cell reads one of :class:`Verdict`. It links its evidence: the failing check's one-line reproduction
(``python -m harness.repro ...``) and, where the ledger names one, the ``findings/`` folder. Each engine's cells
are written to ``docs/matrix/<engine>.json`` by that engine's venv; ``docs/matrix.md`` is rendered from every
engine's JSON (``tests/test_matrix.py`` regenerates both and fails when a checked-in one is stale).
"""

from __future__ import annotations

import argparse
import enum
import importlib
import importlib.metadata
import json
import re
import shlex
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.errors import LibraryUnavailable
from contracts.moe_sharding import CONTRACT as MOE_SHARDING
from harness.inputs import guard_inputs
from harness.repro import Reproduction
from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK
from strategies.catalog import MODELS, TP_DEGREES, Loader
from strategies.moe import MoeShape, Scale, layer_shape, rank_local, reduce_size
from strategies.moe_sharding import ShardingConfig
from strategies.mxfp4_moe import Mxfp4MoeConfig
from subjects.engine_tools import FP4_CHECKPOINTS, DefaultChoice, Fp4Checkpoint, Hardware
from subjects.registry import Hardware as LedgerHardware
from subjects.registry import KnownFailure, ReachKind, resolve

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
JSON_DIR = DOCS / "matrix"
MARKDOWN = DOCS / "matrix.md"

DEGREES: tuple[tuple[int, int], ...] = (*((tp, 1) for tp in TP_DEGREES), *((1, ep) for ep in TP_DEGREES[1:]))
"""``(tp, ep)``: plain tensor parallelism at every catalogued degree, then expert parallelism over 2-16 GPUs (each
rank holds ``E/ep`` whole experts, ``--enable-expert-parallel`` in vLLM, ``--ep-size`` in SGLang)."""

EXPERTS = 1
"""Experts of a rank's layer in the alignment checks (top-1, :data:`TOKENS` tokens): every rule the properties
check is per expert, so one expert at the real ``(I/tp, H)`` decides the cell at a fraction of the cost."""
TOKENS = 2


class Verdict(enum.Enum):
    """What a cell reads (most severe first among the failing ones)."""

    REFUSED = "refused at load"
    SILENTLY_WRONG = "silently wrong"
    OVER_PADDING = "over-padding"
    KNOWN_BUG = "known upstream bug"
    OK = "ok"
    NOT_SERVED = "not served"
    UNDETERMINED = "undetermined"


SEVERITY = (Verdict.REFUSED, Verdict.SILENTLY_WRONG, Verdict.OVER_PADDING)


@dataclass(frozen=True)
class Engine:
    """An engine of the matrix: its distribution, its defaults module and the subject serving each checkpoint."""

    name: str
    distribution: str
    defaults: str
    subjects: dict[Fp4Checkpoint, str]


ENGINES = {
    "vllm": Engine("vllm", "vllm", "subjects.vllm.defaults", {c: "vllm" for c in Fp4Checkpoint}),
    "sglang": Engine(
        "sglang",
        "sglang",
        "subjects.sglang.defaults",
        {c: "sglang-deepseek-v4" if c is Fp4Checkpoint.DSV4_FP4_EXPERTS else "sglang" for c in Fp4Checkpoint},
    ),
}

INSTALL = {
    "vllm": "scripts/install-cpu.sh .venv-vllm && (source .venv-vllm/bin/activate && scripts/install-vllm-cpu.sh)",
    "sglang": "scripts/install-cpu.sh .venv-sglang && (source .venv-sglang/bin/activate && scripts/install-sglang-cpu.sh)",
}


@dataclass(frozen=True)
class Format:
    """A checkpoint's weight format: its alignment contract's test module, its group size and its config type."""

    module: str
    block: int
    config: type


NVFP4 = Format("conformance.test_nvfp4_moe", NVFP4_BLOCK, MoeShape)
MXFP4 = Format("conformance.test_mxfp4_moe", MXFP4_BLOCK, Mxfp4MoeConfig)


def fmt_of(checkpoint: Fp4Checkpoint) -> Format:
    return NVFP4 if checkpoint is Fp4Checkpoint.MODELOPT_NVFP4 else MXFP4


# --- configurations ---------------------------------------------------------------------------------------


def alignment_config(model: str, fmt: Format, tp: int, ep: int) -> MoeShape | Mxfp4MoeConfig:
    """Rank 0 of ``model`` at ``tp`` x ``ep``: its ``I/tp`` channels as the model's loader splits them (whole
    32-blocks for gpt-oss), the whole ``I`` under EP, and the hidden size, each reduced to at most 512 with its
    residue modulo 256 kept (:data:`strategies.moe.Scale` ``REDUCED``: every padding and acceptance rule of the
    records is modulo 256 or less, so the verdict is the real size's); :data:`EXPERTS` expert, top-1,
    :data:`TOKENS` tokens, seed 0."""
    m = MODELS[model]
    shape = layer_shape(m, tp * ep, ep > 1, 0, fmt.block, m.activation, EXPERTS, 1, TOKENS, 0, Scale.REDUCED)
    return shape if fmt is NVFP4 else Mxfp4MoeConfig(shape, m.checkpoint, m.expert_biases)


def real_sizes(model: str, fmt: Format, tp: int, ep: int) -> tuple[int, int]:
    """Rank 0's real ``(I, H)`` (what :func:`alignment_config` reduces)."""
    m = MODELS[model]
    _, per_rank = rank_local(m.moe_intermediate, tp * ep, ep > 1, fmt.block, m.loader is Loader.WHOLE_BLOCK)
    return per_rank[0], m.hidden


def sharding_config(model: str, fmt: Format, tp: int, ep: int) -> ShardingConfig:
    """The whole layer of ``model`` split over ``tp`` x ``ep`` ranks: the real ``I`` (what the split cuts), the
    hidden size reduced to at most 512 with its residue modulo 256 kept (every hidden-size rule of the loaders is
    modulo 256 or less), one expert per EP rank (the matrix runs it under plain TP only)."""
    m = MODELS[model]
    return ShardingConfig(
        model, tp, m.moe_intermediate, reduce_size(m.hidden), fmt.block, m.checkpoint.layout, m.activation, ep, 1, TOKENS, 0,
        ep_size=ep, bias=m.expert_biases,
    )  # fmt: skip


# --- running the checks -------------------------------------------------------------------------------------


def alignment_checks(fmt: Format, backend: enum.Enum) -> list[Callable[..., None]]:
    """The checks of ``fmt``'s test module that hold for ``backend`` without a GPU: generated tests on the
    format's config type whose backends include it, no kernel and no hardware mark."""
    module = importlib.import_module(fmt.module)
    found = []
    for name in sorted(vars(module)):
        inner = getattr(getattr(getattr(module, name), "hypothesis", None), "inner_test", None)  # Hypothesis keeps it
        spec, fn = getattr(inner, "__fp4_spec__", None), getattr(inner, "__fp4_property__", None)
        if spec is None or fn is None or spec.kernel or spec.marks or fn.__fp4_check__[1] is not fmt.config:
            continue
        members = spec.backends
        if members is None or (isinstance(members, tuple | list) and backend not in members):
            continue
        if fn not in found:
            found.append(fn)
    return found


def sharding_checks() -> list[Callable[..., None]]:
    module = importlib.import_module("conformance.test_moe_sharding")
    return [module.check_every_element_on_one_rank, module.check_ranks_sum_to_layer]


@dataclass(frozen=True)
class Outcome:
    """One check on one configuration: ``error`` (``Type: message``, None: passed), the ledger entry that
    describes it, and the reproduction."""

    check: str
    error: str | None
    exception: BaseException | None
    entry: KnownFailure | None
    repro: Reproduction


def run_one(fn: Callable[..., None], config: Any, backend: enum.Enum, subject: str) -> Outcome:
    """Run the bare check ``fn`` once as :func:`harness.repro.reproduce` does, and find the ledger entry (of
    ``subject``) that describes its failure."""
    contract = fn.__fp4_check__[0]
    resolved = resolve(subject)
    config = config.for_backend(backend)
    repro = Reproduction(f"{fn.__module__}:{fn.__name__}", subject, backend.value, config.to_dict())
    try:
        fn(config, backend, guard_inputs(resolved.policy(contract)))
    except LibraryUnavailable as exc:
        return Outcome(fn.__name__, f"not run: {exc}", None, None, repro)
    except Exception as exc:  # noqa: BLE001  # every failure is judged below
        entry = next(
            (
                k
                for k in resolved.known_failures
                if k.matches(contract, fn.__name__, backend.value, config) and k.recognises(exc)
            ),
            None,
        )
        return Outcome(fn.__name__, f"{type(exc).__name__}: {exc}".split("\n")[0], exc, entry, repro)
    return Outcome(fn.__name__, None, None, None, repro)


# --- judging a cell -----------------------------------------------------------------------------------------

OVER_PADDING = re.compile(r"over-padding: ([IH]) (\d+) was padded to (\d+), but (\d+) is accepted")
FINDING = re.compile(r"findings/([a-z0-9][a-z0-9-]*[a-z0-9])")
UPSTREAM = re.compile(r"github\.com/[^/]+/[^/]+/(issues|pull)/\d+")


def kind(outcome: Outcome) -> Verdict:
    """What a failure means for a deployment: an over-padding report, a property's assertion (a wrong result the
    engine does not notice) or the policy's refusal / an engine error (the model does not load)."""
    message = outcome.error or ""
    if isinstance(outcome.exception, AssertionError):
        if OVER_PADDING.search(message):
            return Verdict.OVER_PADDING
        if "policy refused" in message:
            return Verdict.REFUSED
        return Verdict.SILENTLY_WRONG
    return Verdict.REFUSED


def over_padding_gib(outcome: Outcome, model: str, fmt: Format, ranks: int, ep: bool, other: int) -> float:
    """The memory the extra padding costs one GPU per MoE layer, in GiB: the padded-minus-accepted rows or columns
    of FC1 (``F·I`` rows, gated ``F = 2``) and FC2 for every expert the rank holds, ``other`` the padded size of
    the other dimension, each FP4 code half a byte and each ``block``-group one scale byte."""
    m = MODELS[model]
    match = OVER_PADDING.search(outcome.error or "")
    assert match is not None
    extra = int(match.group(3)) - int(match.group(4))
    halves = 2 if m.activation.gated else 1
    experts = -(-m.experts // ranks) if ep else m.experts
    per_expert = (halves + 1) * extra * other * (0.5 + 1 / fmt.block)
    return per_expert * experts / 2**30


def evidence(outcome: Outcome) -> dict[str, str]:
    """The failing check's reproduction command and, where the ledger entry names it, the finding folder and link."""
    found: dict[str, str] = {"repro": shlex.join(["python", "-m", "harness.repro", *outcome.repro.argv()])}
    if outcome.entry is not None:
        folder = FINDING.search(f"{outcome.entry.reason} {outcome.entry.reach.detail}")
        if folder and (ROOT / "findings" / folder.group(1)).is_dir():
            found["finding"] = f"findings/{folder.group(1)}/"
        found["link"] = outcome.entry.link
        found["reach"] = outcome.entry.reach.describe()
        found["ledger"] = _short(outcome.entry.reason, 300)
    return found


def flag_notes(
    subject: str, hardware: Hardware, configs: dict[str, Any], fmt: Format, default: enum.Enum | None
) -> list[str]:
    """The subject's ledger entries reached here only behind a flag: an entry of reach *flag only* or *default
    path* (on other hardware or models) on this hardware whose condition holds for this cell's configuration loaded
    for another backend of the format than ``default``."""
    on = LedgerHardware(hardware.value.upper() if hardware.value.startswith("sm") else hardware.value)
    members = type(default) if default is not None else None
    notes: dict[str, None] = {}
    for entry in resolve(subject).known_failures:
        if entry.reach.kind is ReachKind.LATENT or on not in entry.hardware or entry.contract not in configs:
            continue
        config = configs[entry.contract]
        candidates = list(members) if members is not None else list(_format_members(fmt))
        for backend in candidates:
            if backend == default or entry.backend not in (None, backend.value):
                continue
            if entry.applies(config.for_backend(backend)):
                notes[f"{entry.reach.describe()} ({entry.link})"] = None
                break
    return list(notes)


def _format_members(fmt: Format) -> tuple[enum.Enum, ...]:
    from strategies.moe_sharding import format_backends

    return format_backends(fmt.block)


def judge(outcomes: list[Outcome]) -> tuple[Verdict, Outcome | None]:
    """The cell's verdict: ok where every check passed; else the most severe failure (:data:`SEVERITY`), read as a
    known upstream bug where the ledger entry describing it links an upstream issue or PR."""
    failed = [o for o in outcomes if o.exception is not None]
    if not failed:
        return Verdict.OK, None
    worst = min(failed, key=lambda o: SEVERITY.index(kind(o)))
    if worst.entry is not None and UPSTREAM.search(worst.entry.link):
        return Verdict.KNOWN_BUG, worst
    return kind(worst), worst


def not_run_verdict(choice: DefaultChoice) -> Verdict:
    """A default without a record: the engine refuses the configuration (not served) or the suite cannot say."""
    refused = ("selects no backend", "refuses")
    return Verdict.NOT_SERVED if any(r in choice.reason for r in refused) else Verdict.UNDETERMINED


# --- the matrix ---------------------------------------------------------------------------------------------


def cells(engine: Engine) -> Iterator[dict[str, Any]]:
    """Every cell of ``engine``'s matrix, in model, hardware, degree order (deterministic: no times, no paths)."""
    defaults = importlib.import_module(engine.defaults)
    cache: dict[tuple[str, str, str, str], Outcome] = {}
    for model, (checkpoint, _) in FP4_CHECKPOINTS.items():
        fmt, subject = fmt_of(checkpoint), engine.subjects[checkpoint]
        for hardware in Hardware:
            for tp, ep in DEGREES:
                choice = defaults.default_backend(model, hardware, tp, ep)
                yield cell(engine, model, hardware, tp, ep, choice, fmt, subject, cache)


def cell(
    engine: Engine,
    model: str,
    hardware: Hardware,
    tp: int,
    ep: int,
    choice: DefaultChoice,
    fmt: Format,
    subject: str,
    cache: dict[tuple[str, str, str, str], Outcome],
) -> dict[str, Any]:
    """One cell (module docstring): the default, the checks run, the verdict, its detail and evidence, notes."""
    configs = {
        importlib.import_module(fmt.module).CONTRACT: alignment_config(model, fmt, tp, ep),
        MOE_SHARDING: sharding_config(model, fmt, tp, ep),
    }
    alignment_contract = next(iter(configs))
    record: dict[str, Any] = {
        "model": model, "hardware": hardware.value, "tp": tp, "ep": ep,
        "default": choice.backend.value if choice.backend is not None else None, "choice": choice.reason,
    }  # fmt: skip
    backend = choice.backend or choice.loader
    if backend is None:
        verdict = not_run_verdict(choice)
        record |= {"verdict": verdict.value, "detail": choice.reason, "checks": [], "evidence": {}}
    else:
        runs = [] if choice.backend is None else [(fn, alignment_contract) for fn in alignment_checks(fmt, backend)]
        runs += [(fn, MOE_SHARDING) for fn in sharding_checks()] if ep == 1 else []
        outcomes = []
        for fn, contract in runs:
            config = configs[contract]
            key = (fn.__module__ + ":" + fn.__name__, subject, backend.value, config.for_backend(backend).to_json())
            if key not in cache:
                cache[key] = run_one(fn, config, backend, subject)
            outcomes.append(cache[key])
        verdict, worst = judge(outcomes)
        detail = "every check passed" if worst is None else worst.error or ""
        if worst is not None:
            detail = f"{worst.check}: {detail}"
            if kind(worst) is Verdict.OVER_PADDING:
                detail = f"{_gib(worst, model, fmt, tp, ep, configs[alignment_contract], backend, subject)}; {detail}"
        if choice.backend is None:
            detail = f"loading only, as {backend.value} loads ({choice.reason}); {detail}"
        record |= {
            "verdict": verdict.value,
            "kind": None if worst is None else kind(worst).value,
            "detail": _short(detail),
            "checks": [{"check": o.check, "passed": o.error is None} for o in outcomes],
            "evidence": {} if worst is None else evidence(worst),
        }
    record["notes"] = flag_notes(subject, hardware, configs, fmt, backend)
    return record


def _gib(worst: Outcome, model: str, fmt: Format, tp: int, ep: int, config: Any, backend: Any, subject: str) -> str:
    """``+X GiB per MoE layer per GPU``, the other dimension taken from the subject's own padding of the rank."""
    formats = importlib.import_module("conformance.moe_formats")  # the properties' layer, loaded as the checks are
    moe_format = formats.NVFP4 if fmt is NVFP4 else formats.MXFP4
    policy = guard_inputs(resolve(subject).policy(moe_format.contract))
    aligned, _ = moe_format.align(config.for_backend(backend), backend, policy)
    what = OVER_PADDING.search(worst.error or "").group(1)  # type: ignore[union-attr]
    real_i, real_h = real_sizes(model, fmt, tp, ep)
    shape = moe_format.shape(config)
    # the padded other dimension at the real size: the reduction subtracts whole multiples of 256, which the
    # padding (to at most 256) keeps
    if what == "I":
        other = aligned.hidden_size + real_h - shape.hidden
    else:
        other = aligned.intermediate_size + real_i - shape.intermediate
    gib = over_padding_gib(worst, model, fmt, tp * ep, ep > 1, other)
    return f"+{gib:.3f} GiB per MoE layer per GPU"


def _short(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def generate(name: str) -> dict[str, Any]:
    """The matrix of engine ``name`` (its installed version), as written to ``docs/matrix/<name>.json``."""
    engine = ENGINES[name]
    return {
        "engine": name,
        "version": importlib.metadata.version(engine.distribution),
        "command": f"python -m harness.matrix --engine {name}",
        "sizes": f"rank 0's I/tp and H, each reduced to <= 512 with its residue modulo 256 kept; {EXPERTS} expert, "
        f"top-1, {TOKENS} tokens, seed 0 (alignment); "
        "the whole I, H reduced to <= 512 with its residue modulo 256 kept, one expert, under plain TP (sharding)",
        "cells": list(cells(engine)),
    }


def write_json(matrix: dict[str, Any], folder: Path = JSON_DIR) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{matrix['engine']}.json"
    path.write_text(json.dumps(matrix, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def load_jsons(folder: Path = JSON_DIR) -> list[dict[str, Any]]:
    return [json.loads((folder / f"{name}.json").read_text()) for name in ENGINES if (folder / f"{name}.json").exists()]


# --- rendering -------------------------------------------------------------------------------------------

SHORT = {
    Verdict.OK.value: "ok",
    Verdict.REFUSED.value: "**refused**",
    Verdict.SILENTLY_WRONG.value: "**wrong**",
    Verdict.OVER_PADDING.value: "over-pad",
    Verdict.KNOWN_BUG.value: "**known bug**",
    Verdict.NOT_SERVED.value: "not served",
    Verdict.UNDETERMINED.value: "?",
}


def _degree(c: dict[str, Any]) -> str:
    return f"TP{c['tp']}" if c["ep"] == 1 else f"EP{c['ep']}"


def _anchor(engine: str, c: dict[str, Any]) -> str:
    return f"{engine}-{c['model']}-{c['hardware']}-{_degree(c)}".lower().replace(".", "")


def _cell_text(engine: str, c: dict[str, Any]) -> str:
    text = SHORT[c["verdict"]]
    if c["verdict"] in (Verdict.OK.value,) and not c["notes"]:
        return text
    return f"[{text}](#{_anchor(engine, c)})" + (" ⚑" if c["notes"] else "")


def render(matrices: list[dict[str, Any]]) -> str:
    """``docs/matrix.md`` from the engines' JSONs."""
    lines = [
        "# Deployment matrix",
        "",
        "<!-- generated by `python -m harness.matrix`; do not edit: tests/test_matrix.py checks it -->",
        "",
        "What each engine does with every flag at its default, for every catalogued model with a public FP4 "
        "checkpoint, on each hardware class (SM90: H100/H200; SM100: B200/GB200; SM120: RTX PRO 6000/RTX 5090; "
        "gfx950: MI350X/MI355X) at each parallel degree (TP1-TP16; EP2-EP16: one rank per GPU holding whole "
        "experts). Each cell is made by `python -m harness.matrix` (harness/matrix.py): the engine's default "
        "backend read from its own selection code (docs/engines.md §4), then that backend's CPU properties (the "
        "format's alignment checks and the two `moe_sharding` checks) on rank 0's real sizes with the engine's "
        "subject, each failure judged against the subject's ledger (docs/findings.md).",
        "",
        "Verdicts: **ok** (every check passed); **refused** (refused at load: the engine's error or its refusal of "
        "a real shape); **wrong** (silently wrong: the property that fails); **over-pad** (over-padding: memory "
        "per MoE layer per GPU); **known bug** (a known upstream bug, linked, with its reach); **not served** (the "
        "engine's selection refuses the configuration); **?** (undetermined: the default depends on something "
        "a CPU machine cannot fake, or the suite has no record of the engine's kernel; the cell says which). "
        "⚑: a known bug is reached here behind a flag (another backend than the default). A linked cell's detail, reproduction and finding are "
        "below its engine's tables.",
        "",
    ]
    totals: Counter[str] = Counter()
    per_engine: dict[str, Counter[str]] = {}
    for matrix in matrices:
        engine = matrix["engine"]
        title = {"vllm": "vLLM", "sglang": "SGLang"}.get(engine, engine)
        lines += [
            f"## {title} {matrix['version']}",
            "",
            f"Regenerate: `{matrix['command']}` in the engine's venv. Sizes: {matrix['sizes']}.",
            "",
        ]
        cells_ = matrix["cells"]
        degrees = list(dict.fromkeys(_degree(c) for c in cells_))
        for model in dict.fromkeys(c["model"] for c in cells_):
            lines += [f"### {title}: {model}", "", "| hardware | " + " | ".join(degrees) + " |"]
            lines.append("|---" * (len(degrees) + 1) + "|")
            for hw in dict.fromkeys(c["hardware"] for c in cells_ if c["model"] == model):
                row = [c for c in cells_ if c["model"] == model and c["hardware"] == hw]
                lines.append(f"| {hw} | " + " | ".join(_cell_text(engine, c) for c in row) + " |")
            lines.append("")
        lines += [f"### {title}: cell details", ""]
        for c in cells_:
            if c["verdict"] == Verdict.OK.value and not c["notes"]:
                continue
            head = f'<a id="{_anchor(engine, c)}"></a>**{c["model"]} {c["hardware"]} {_degree(c)}**: {c["verdict"]}'
            default = f"default `{c['default']}`" if c["default"] else "no default record"
            lines.append(f"- {head} ({default}). {c['detail']}")
            ev = c.get("evidence") or {}
            if "link" in ev:
                lines.append(f"  Ledger: {ev['link']} ({ev['reach']}): {ev['ledger']}")
            if "finding" in ev:
                lines.append(f"  Finding: [{ev['finding']}](../{ev['finding']}).")
            if "repro" in ev:
                lines.append(f"  Reproduce: `{ev['repro']}`")
            for note in c["notes"]:
                lines.append(f"  ⚑ Behind a flag: {note}")
        lines.append("")
        per_engine[title] = Counter(c["verdict"] for c in cells_)
        totals.update(per_engine[title])
    lines += ["## Cell counts", "", "| verdict | " + " | ".join(per_engine) + " | total |"]
    lines.append("|---" * (len(per_engine) + 2) + "|")
    for v in Verdict:
        counts = [str(per_engine[e][v.value]) for e in per_engine]
        lines.append(f"| {v.value} | " + " | ".join(counts) + f" | {totals[v.value]} |")
    counts = [str(sum(per_engine[e].values())) for e in per_engine]
    lines.append("| all cells | " + " | ".join(counts) + f" | {sum(totals.values())} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m harness.matrix", description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=sorted(ENGINES), help="generate this engine's docs/matrix/<engine>.json")
    p.add_argument("--render", action="store_true", help="only render docs/matrix.md from the JSONs")
    args = p.parse_args(argv)
    if args.engine is None and not args.render:
        p.error("give --engine NAME (then docs/matrix.md is rendered too) or --render")
    if args.engine:
        print(f"wrote {write_json(generate(args.engine)).relative_to(ROOT)}")
    MARKDOWN.write_text(render(load_jsons()), encoding="utf-8")
    print(f"wrote {MARKDOWN.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
