"""Sharding a run across hosts: ``--shard INDEX/COUNT`` keeps one deterministic slice of the tests.

Every host of a nightly fleet collects the same tests (same checkout, same options) and keeps
the tests whose position in the sorted list of node ids is ``INDEX`` modulo ``COUNT``. So:

* every collected test lands in exactly one shard (the residues mod ``COUNT`` partition the
  positions ``0 .. n-1``);
* shard sizes differ by at most one test (``ceil(n / COUNT)`` vs ``floor(n / COUNT)``);
* the split depends on nothing but the node ids, so it is the same on every host and under
  pytest-xdist, whose workers each collect and would otherwise disagree on the order.

Round-robin over sorted ids also interleaves the contracts and backends, so no shard holds
only the slow kernel properties of one backend. (pytest-split balances by recorded durations;
it needs a durations file kept in the repository, which a hardware-dependent suite lacks.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_SHARD = re.compile(r"^(\d+)/(\d+)$")


def parse_shard(text: str) -> tuple[int, int]:
    """``"INDEX/COUNT"`` -> ``(index, count)`` with ``0 <= index < count``; ValueError otherwise."""
    match = _SHARD.match(text.strip())
    if not match:
        raise ValueError(f"--shard {text!r} is not INDEX/COUNT (for example 0/4)")
    index, count = int(match[1]), int(match[2])
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"--shard {text!r}: need COUNT >= 1 and 0 <= INDEX < COUNT")
    return index, count


def shard_of(nodeids: Sequence[str], count: int) -> dict[str, int]:
    """Shard index of each node id: its position in ``sorted(nodeids)`` modulo ``count``."""
    return {nodeid: position % count for position, nodeid in enumerate(sorted(nodeids))}


def keep(nodeids: Sequence[str], index: int, count: int) -> set[str]:
    """The node ids that shard ``index`` of ``count`` runs."""
    return {nodeid for nodeid, shard in shard_of(nodeids, count).items() if shard == index}
