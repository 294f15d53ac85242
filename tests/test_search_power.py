"""Self-tests of the boundary strategies and of the bench's in-process detection measurement."""

from __future__ import annotations

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

import bench.run
from bench.detection import (
    Property,
    caught_without_pins,
    common_prefix,
    detect,
    generated,
    properties,
    property_seed,
)
from bench.grids_adapter import guard_truth_table
from bench.run import (
    README_END,
    README_START,
    chosen_subjects,
    grid_catches,
    joined,
    markers,
    readme_section,
    update_readme,
)
from strategies.boundaries import RULE_MODULI, boundary_sizes, moduli_for, straddle
from strategies.linear import ScaleShapeCase, guard_boundary_scales
from strategies.shared_expert import shared_expert_cases
from subjects.registry import builtin, resolve

SCALE_COLS = moduli_for("mxfp4_linear.scale_cols")


@pytest.mark.parametrize(
    ("where", "want"), [("at", 256), ("below", 224), ("above", 288), ("half", 320)], ids=lambda x: str(x)
)
def test_straddle_moves_by_whole_units(where: str, want: int) -> None:
    assert straddle(32, 128, 2, where) == want


def test_straddle_never_goes_below_one_unit() -> None:
    assert straddle(32, 32, 1, "below") == 32


@settings(max_examples=50)
@given(size=boundary_sizes(unit=32, moduli=moduli_for("mxfp4_moe.intermediate", unit=32)))
def test_boundary_sizes_are_whole_units(size: int) -> None:
    assert size >= 32 and size % 32 == 0


def test_rule_moduli_come_first_and_generic_ones_follow() -> None:
    own, generic = moduli_for("mxfp4_moe.intermediate", unit=32)
    assert own == tuple(sorted(set(RULE_MODULI["mxfp4_moe.intermediate"])))
    assert set(generic) == {32, 64, 128, 256} - set(own)
    assert moduli_for("shared_expert.intermediate", scale=8)[0] == (256,)


def test_boundary_sizes_reject_moduli_that_are_not_whole_units() -> None:
    with pytest.raises(ValueError, match="multiples of unit"):
        boundary_sizes(unit=32, moduli=((16,), ()))


def test_a_thin_residue_shrinks_to_a_readable_size() -> None:
    """``cols ≡ 4 (mod 8)`` shrinks to half-way past the rule's first multiple: 8 + 4."""
    assert find(boundary_sizes(unit=1, moduli=SCALE_COLS), lambda c: c % 8 == 4) == 12


@settings(max_examples=50)
@given(shape=guard_boundary_scales())
def test_guard_boundary_scales_hold_the_other_rules(shape: tuple[int, int]) -> None:
    rows, cols = shape
    assert rows % 32 == 0 or cols % 8 == 0


def test_generation_is_reproducible_and_starts_with_a_shared_prefix() -> None:
    strategy = shared_expert_cases()
    a, b = generated(strategy, 1, 20), generated(strategy, 2, 20)
    assert [c.to_json() for c in a] == [c.to_json() for c in generated(strategy, 1, 20)]
    assert 1 <= common_prefix([a, b]) < 20
    assert property_seed("t", 0) != property_seed("u", 0)


def test_properties_are_found_per_backend() -> None:
    names = {p.name for p in properties("mxfp4_moe")}
    assert "test_mxfp4_moe::test_padding_invariance[marlin]" in names
    assert all(not n.startswith("test_mxfp4_moe::test_trtllm_kernel") for n in names)  # needs a GPU


def test_external_subject_is_measured_with_three_figures() -> None:
    (subject,) = chosen_subjects(["bench.mutants:GUARD_COLS_MOD4"])
    found = detect(subject, [0, 1], budget=30, rate_seeds=1)
    row = found.row()
    assert row["subject"] == "mutant-guard-cols-mod4"
    for figure, seeds in (("with_pins", 2), ("ci_without_pins", 2), ("generation", 1), ("search_power", 1)):
        assert row[figure]["caught"].endswith(f"/{seeds}")
    # the ci figure of one seed alone (what tests/test_real_sizes.py asks of the size mutants) is the same count
    alone = caught_without_pins(subject, 0)
    assert alone is not None and alone[0] == found.ci.firsts[0], (alone, found.ci.firsts)


def test_readme_section_is_regenerated_between_its_markers(tmp_path) -> None:
    figure = {
        "caught": "20/20", "budget": 25, "median_examples": 2, "worst_examples": 5,
        "failure_rate": 0.5, "failing_examples": "5/10", "best_property": "p",
    }  # fmt: skip
    row = {"subject": "bad-x", "shortfall": ""} | {
        k: figure for k in ("with_pins", "ci_without_pins", "generation", "search_power")
    }
    report = {
        "seeds": list(range(20)), "budget": 200, "rate_seeds": 5, "date": "2026-12-01 08:00 UTC",
        "machine": "cpu", "versions": "torch 2.13", "wall_seconds": 1, "suite": [row],
        "grids": [{"name": "g1", "catches": {"bad-x": "caught"}}, {"name": "g2", "catches": {"bad-x": "missed"}}],
    }  # fmt: skip
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{README_START}\nold table\n{README_END}\nrest\n")
    update_readme(readme, readme_section(report))
    text = readme.read_text()
    assert "old table" not in text and text.endswith(f"{README_END}\nrest\n")
    assert "| `bad-x` | 20/20, 2 / 5 |" in text and "| 1 of 2: g1 | — |" in text
    assert "python -m bench --seeds 20 --budget 200 --rate-seeds 5" in text
    later_start, later_end = markers("later")  # a second block: rewritten alone, the first one kept
    readme.write_text(f"{text}{later_start}\nolder rows\n{later_end}\n")
    update_readme(readme, readme_section({**report, "date": "2026-12-05 09:00 UTC"}, "later"), "later")
    again = readme.read_text()
    assert again.startswith(text) and "older rows" not in again and "2026-12-05 09:00 UTC" in again


def test_a_grid_catches_a_subject_only_where_the_builtin_passes(monkeypatch) -> None:
    _, cases = guard_truth_table()  # vLLM's guard table pins (96, 160) -> Triton
    verdict, how = grid_catches(resolve("bad-asm-96-rows"), "mxfp4_linear", cases)
    assert verdict == "caught" and "(96, 160)" in how
    assert grid_catches(builtin(), "mxfp4_linear", cases) == ("missed", None)

    def cannot_run(case: ScaleShapeCase, backend: None, policy: object) -> None:
        raise TypeError("'NoneType' object is not callable")  # e.g. a backend record without prepare

    cannot_run.__fp4_check__ = ("mxfp4_linear", ScaleShapeCase)
    monkeypatch.setattr(bench.run, "properties", lambda contract: [Property("t", cannot_run, st.nothing(), (), None)])
    verdict, how = grid_catches(resolve("bad-asm-96-rows"), "mxfp4_linear", cases)
    assert verdict == "suite error" and "built-in subject fails too" in how


def test_reports_of_the_same_options_join_and_a_later_row_replaces_an_earlier_one() -> None:
    def report(date: str, subjects: list[str], seeds: int = 20) -> dict:
        return {
            "seeds": list(range(seeds)), "budget": 200, "rate_seeds": 5, "quick": False, "date": date,
            "wall_seconds": 10, "throughput": [], "suite": [{"subject": s, "v": date} for s in subjects],
            "grids": [{"name": "g", "catches": {s: "missed" for s in subjects}}],
        }  # fmt: skip

    grids_only = report("d3", ["bad-d"], seeds=1) | {"suite": []}  # --no-suite: any seeds
    both = joined([report("d1", ["bad-a", "bad-b"]), report("d2", ["bad-b", "bad-c"]), grids_only])
    assert [(r["subject"], r["v"]) for r in both["suite"]] == [("bad-a", "d1"), ("bad-b", "d2"), ("bad-c", "d2")]
    assert set(both["grids"][0]["catches"]) == {"bad-a", "bad-b", "bad-c", "bad-d"}
    assert (
        both["date"] == "d3"
        and both["wall_seconds"] == 30
        and both["parts"][2] == {"date": "d3", "subjects": [], "grids": 1}
    )
    stamped = joined([report("d1", ["bad-a"]) | {"versions": "python 3.11.7, fp4-conformance commit abc1234"}, both])
    assert stamped["parts"][0] == {"date": "d1", "suite": "commit abc1234", "subjects": ["bad-a"]}
    assert "d1 (commit abc1234): `bad-a`; d1: `bad-a`, `bad-b`" in bench.run._parts(stamped)[0]
    with pytest.raises(SystemExit, match="cannot be joined"):
        joined([report("d1", ["bad-a"]), report("d2", ["bad-c"], seeds=5)])
