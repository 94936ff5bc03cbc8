"""Tooling for the project's own tests and docs (a headless browser on the dashboard page); no run uses it."""
