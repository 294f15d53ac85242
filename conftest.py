"""Root conftest: loads the suite's pytest plugin (options, profiles, gating, triage output)."""

pytest_plugins = ["harness.plugin"]
