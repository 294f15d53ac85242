"""pytest plugin (entry point ``harness.early``): the xdist workers' fork server, started as pytest loads its plugins.

pytest imports its plugins' entry points in the order of their names, and ``harness.early`` comes before the suite's
other three. ``harness.plugin`` imports torch (about 1.4 s on a 16-core H100 host), after which
:mod:`harness.workers` would start the fork server (:mod:`harness.forkserver`) at the controller's configuration,
and the server would import torch again before it forks the first worker. Started here, from the run's
invocation arguments (:func:`harness.workers.start_early`), the server imports torch while the plugins do; the
configuration then uses it, or stops it where the run turns out to start no workers or other threads each. Nothing
starts where ``-p no:harness.workers`` or ``-p no:xdist`` blocks the plugin.
"""

from __future__ import annotations

import os
import sys

import pytest

from harness import workers


def pytest_plugin_registered(plugin: object, manager: pytest.PytestPluginManager) -> None:
    """At this module's own registration (the hook is historic: pytest calls it for each plugin registered, this
    one included), with the run's configuration already registered as ``pytestconfig``."""
    config = manager.get_plugin("pytestconfig")
    if plugin is not sys.modules[__name__] or config is None:
        return
    if not any(manager.is_blocked(name) for name in ("harness.workers", "xdist")):
        workers.start_early(config.invocation_params.args, os.environ)
