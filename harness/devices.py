"""pytest-xdist worker -> GPU pinning.

Each worker ``gwN`` is pinned to GPU ``N mod count`` by setting ``CUDA_VISIBLE_DEVICES`` and
``HIP_VISIBLE_DEVICES`` in ``pytest_configure``, before anything in the worker initialises
CUDA/HIP (torch initialises lazily, on first device use). How many workers ``-n auto`` starts,
and how many threads each gets, is :mod:`harness.workers`'s.
"""

from __future__ import annotations

import os


def visible_devices(env: dict[str, str], gpus: int) -> list[str]:
    """Device ids the controller can see, honouring an existing visibility mask."""
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if env.get(var):
            return [d.strip() for d in env[var].split(",") if d.strip()]
    return [str(i) for i in range(gpus)]


def device_for_worker(worker_id: str, devices: list[str]) -> str | None:
    """The device id worker ``gwN`` is pinned to (``devices[N mod len]``), or None without GPUs."""
    if not devices or not worker_id.startswith("gw"):
        return None
    return devices[int(worker_id[2:]) % len(devices)]


def pin_worker(env: dict[str, str] = os.environ, gpus: int | None = None) -> str | None:
    """Pin this xdist worker to its GPU by editing ``env``; returns the device id or None."""
    from harness.hardware import count_gpus_without_init

    worker = env.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return None
    n = count_gpus_without_init() if gpus is None else gpus
    device = device_for_worker(worker, visible_devices(env, n))
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
        env["HIP_VISIBLE_DEVICES"] = device
    return device
