"""Root conftest: loads the suite's pytest plugins (options, profiles, gating, triage output; xdist worker sizing)."""

pytest_plugins = ["harness.plugin", "harness.workers"]
