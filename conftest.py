"""Root conftest: loads the suite's pytest plugins (options, profiles, gating, triage output; xdist worker sizing and scheduling)."""

pytest_plugins = ["harness.early", "harness.plugin", "harness.workers", "harness.scheduling"]
