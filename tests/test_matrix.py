"""The deployment matrix (``docs/matrix/<engine>.json``, ``docs/matrix.md``) is current.

Each engine's JSON is regenerated with the installed engine (``python -m harness.matrix --engine NAME`` in its
venv) and compared with the checked-in one; a venv without the engine skips with the install command (its
marker). ``docs/matrix.md`` is rendered from the checked-in JSONs on any venv. The judging rules are pinned on
the known findings: the SGLang gpt-oss load overflow at TP4 / TP8 on SM120 (default) and SM90 (a flag), SGLang
#26250 on DeepSeek-V4's SM90 default.
"""

from __future__ import annotations

import json

import pytest

from harness import matrix

INSTALLED = {"vllm": pytest.mark.vllm, "sglang": pytest.mark.sglang}


def checked_in(engine: str) -> dict:
    path = matrix.JSON_DIR / f"{engine}.json"
    assert path.exists(), f"{path} is missing: run `python -m harness.matrix --engine {engine}` in its venv"
    return json.loads(path.read_text())


def cell(engine: str, model: str, hardware: str, tp: int, ep: int = 1) -> dict:
    (found,) = [
        c
        for c in checked_in(engine)["cells"]
        if (c["model"], c["hardware"], c["tp"], c["ep"]) == (model, hardware, tp, ep)
    ]
    return found


@pytest.mark.long(20)  # builds every cell's layers through the engine (15.5 s for SGLang 0.5.23 on 2 CPU cores)
@pytest.mark.parametrize("engine", [pytest.param(e, marks=m) for e, m in INSTALLED.items()])
def test_engine_matrix_is_current(engine: str) -> None:
    want = checked_in(engine)
    got = json.loads(json.dumps(matrix.generate(engine)))
    stale = [
        f"{c['model']} {c['hardware']} TP{c['tp']} EP{c['ep']}: {o['verdict']} -> {c['verdict']}"
        for c, o in zip(got["cells"], want["cells"], strict=False)
        if c != o
    ]
    assert got == want, (
        f"docs/matrix/{engine}.json is stale for {engine} {got['version']} (checked in: {want['version']}; "
        f"{len(stale)} cells differ: {stale[:5]}): regenerate with `.venv-{engine}/bin/python -m harness.matrix "
        f"--engine {engine}` and commit docs/matrix/{engine}.json and docs/matrix.md"
    )


def test_markdown_is_rendered_from_the_jsons() -> None:
    assert matrix.MARKDOWN.read_text() == matrix.render(matrix.load_jsons()), (
        "docs/matrix.md is stale: run `python -m harness.matrix --render`"
    )


def test_every_fp4_model_hardware_and_degree_has_a_cell() -> None:
    from subjects.engine_tools import FP4_CHECKPOINTS, Hardware

    for engine in matrix.ENGINES:
        keys = {(c["model"], c["hardware"], c["tp"], c["ep"]) for c in checked_in(engine)["cells"]}
        want = {(m, h.value, tp, ep) for m in FP4_CHECKPOINTS for h in Hardware for tp, ep in matrix.DEGREES}
        assert keys == want, f"{engine}: missing {sorted(want - keys)[:5]}, extra {sorted(keys - want)[:5]}"


@pytest.mark.parametrize("model", ["gpt-oss-20b", "gpt-oss-120b"])
@pytest.mark.parametrize("tp", [4, 8])
def test_sglang_gpt_oss_overflow_is_in_its_cells(model: str, tp: int) -> None:
    """findings/sglang-gpt-oss-mxfp4-cutlass-tp-load: the SM120 default refuses at load; on SM90 a flag note."""
    sm120 = cell("sglang", model, "sm120", tp)
    assert sm120["verdict"] == "refused at load", sm120
    assert sm120["evidence"]["finding"] == "findings/sglang-gpt-oss-mxfp4-cutlass-tp-load/"
    assert "python -m harness.repro conformance.test_moe_sharding:check_" in sm120["evidence"]["repro"]
    sm90 = cell("sglang", model, "sm90", tp)
    assert any("flashinfer_mxfp4" in note for note in sm90["notes"]), sm90


@pytest.mark.parametrize(("model", "tp"), [("deepseek-v4.1-flash", 4), ("deepseek-v4.1-flash", 8), ("deepseek-v4", 16)])
def test_sglang_26250_is_in_the_dsv4_sm90_cells(model: str, tp: int) -> None:
    sm90 = cell("sglang", model, "sm90", tp)
    assert sm90["verdict"] == "known upstream bug", sm90
    assert sm90["evidence"]["link"] == "https://github.com/sgl-project/sglang/issues/26250"


def test_verdict_of_a_failure() -> None:
    """Known-bad judging: a ledger entry linking an upstream issue makes the cell a known upstream bug; an
    over-padding report is over-padding, another assertion silently wrong, another error a refusal."""
    from harness.repro import Reproduction
    from subjects.registry import Hardware, KnownFailure, Reach

    repro = Reproduction("m:check_x", "s", None, {})
    entry = KnownFailure(
        "c", "r", "https://github.com/o/r/issues/1", applies=lambda _: True, raises=ValueError, match="only this bug",
        reach=Reach.latent("none"), hardware=(Hardware.SM90,),
    )  # fmt: skip
    pad = AssertionError("over-padding: I 288 was padded to 384, but 320 is accepted")
    wrong = AssertionError("padding changed the MoE output")
    refused = RuntimeError("The size of tensor a (1440) must match the size of tensor b (1472)")
    outcomes = [matrix.Outcome("check_x", f"{type(e).__name__}: {e}", e, None, repro) for e in (pad, wrong, refused)]
    assert [matrix.kind(o) for o in outcomes] == [matrix.Verdict.OVER_PADDING, matrix.Verdict.SILENTLY_WRONG,
                                                  matrix.Verdict.REFUSED]  # fmt: skip
    assert matrix.judge(outcomes)[0] is matrix.Verdict.REFUSED
    known = matrix.Outcome("check_x", "ValueError: only this bug", ValueError("only this bug"), entry, repro)
    assert matrix.judge([outcomes[0], known])[0] is matrix.Verdict.KNOWN_BUG
    assert matrix.judge([matrix.Outcome("check_x", None, None, None, repro)])[0] is matrix.Verdict.OK
