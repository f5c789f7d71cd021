"""Loads the harness's pytest plugin (options --impl, --device, --report-dir, --expectations)."""

pytest_plugins = ["harness.fronts.plugin"]
