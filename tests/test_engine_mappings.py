"""Every engine subject accounts for every backend record of every contract it implements.

Runs without the engines installed: the engine packages import their engine lazily, so their mappings
(``subjects.<engine>.bridge.BACKEND_MAPS``) are plain data here. A backend record the engine neither maps to one
of its own backends nor explicitly does not map, with a reason, fails here, and raises
:class:`~subjects.engine_tools.UnmappedBackend` where a property asks for it.
"""

from __future__ import annotations

import enum

import pytest

from backends.nvfp4_moe import Nvfp4MoeBackend
from subjects.engine_tools import BackendMap, UnmappedBackend, mapped_member
from subjects.registry import backends, named_subjects
from subjects.sglang import bridge as sglang_bridge
from subjects.sglang.dsv4 import bridge as dsv4_bridge
from subjects.vllm import bridge as vllm_bridge

ENGINE_MAPS = {
    "vllm": vllm_bridge.BACKEND_MAPS,
    "sglang": sglang_bridge.BACKEND_MAPS,
    "sglang-deepseek-v4": dsv4_bridge.BACKEND_MAPS,
}
"""Each engine subject's backend mapping, contract -> :class:`~subjects.engine_tools.BackendMap`."""

NOT_MAPPED = {
    "vllm": vllm_bridge.not_mapped,
    "sglang": sglang_bridge.not_mapped,
    "sglang-deepseek-v4": dsv4_bridge.not_mapped,
}


def test_every_engine_subject_has_a_mapping() -> None:
    """An engine subject (one that can be missing on a machine) is listed here, so its mapping is checked."""
    engines = {name for name, subject in named_subjects().items() if subject.missing is not None}
    assert engines == set(ENGINE_MAPS)


@pytest.mark.parametrize("engine", sorted(ENGINE_MAPS))
def test_every_backend_is_mapped_or_explained(engine: str) -> None:
    maps = ENGINE_MAPS[engine]
    for contract in named_subjects()[engine].policies:
        members = backends(contract)
        if not members:
            continue
        assert contract in maps, f"{engine} implements {contract} but maps none of its backends"
        assert maps[contract].unaccounted(members) == [], f"{engine}: {contract} backends neither mapped nor explained"
        for member, reason in maps[contract].not_mapped.items():
            assert NOT_MAPPED[engine](member) == reason
            assert len(reason) > 40, f"{engine}: {member.value} needs a reason citing the engine's source"
    assert set(maps) <= set(named_subjects()[engine].policies), f"{engine} maps contracts it does not implement"


@pytest.mark.parametrize("engine", sorted(ENGINE_MAPS))
def test_an_unknown_backend_is_an_error(engine: str) -> None:
    """No silent fall-through: a backend no map mentions raises, a mapped one has no not-mapped reason."""

    class Unknown(enum.Enum):
        NEW = "new-kernel"

    with pytest.raises(UnmappedBackend, match="new-kernel"):
        NOT_MAPPED[engine](Unknown.NEW)
    mapped = next(iter(next(iter(ENGINE_MAPS[engine].values())).mapped))
    with pytest.raises(ValueError, match="maps"):
        NOT_MAPPED[engine](mapped)


def test_a_backend_cannot_be_both_mapped_and_not() -> None:
    with pytest.raises(ValueError, match="both mapped and not mapped"):
        BackendMap({Nvfp4MoeBackend.B12X: "B12X"}, {Nvfp4MoeBackend.B12X: "no path to b12x"})
    with pytest.raises(ValueError, match="without a reason"):
        BackendMap({}, {Nvfp4MoeBackend.B12X: " "})


def test_mapped_member_inverts_a_one_to_one_mapping() -> None:
    paths = vllm_bridge.LINEAR_PATHS
    assert all(mapped_member(paths, flag) is path for path, flag in paths.items())
    with pytest.raises(UnmappedBackend):
        mapped_member({Nvfp4MoeBackend.B12X: "x", Nvfp4MoeBackend.VLLM_CUTLASS: "x"}, "x")
