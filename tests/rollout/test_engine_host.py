"""The engine host on a worker: an engine whose worker is restarted mid-run serves the newest
weight version, not version 0; legs failed by a down engine are not logged as errors."""

from __future__ import annotations

import asyncio
import logging
import types

from prorsa.config.pipeline import EnginesConfig
from prorsa.engine.emulated import EmulatedEngine
from prorsa.roles import Role
from prorsa.rollout.engine_host import EngineHost
from prorsa.rollout.weights import newest_version


def _version(run_dir, name, complete=True):
    d = run_dir / "weights" / name
    d.mkdir(parents=True)
    if complete:
        (d / "config.json").write_text("{}")
    return d


def test_newest_version_is_the_highest_complete_one_after_v0(tmp_path):
    assert newest_version(tmp_path) is None  # not an RL run
    _version(tmp_path, "v0")
    assert newest_version(tmp_path) is None  # the warm-up: what the engines start from anyway
    _version(tmp_path, "v2")
    _version(tmp_path, "v10")
    _version(tmp_path, "v11", complete=False)
    _version(tmp_path, ".v12-tmp")  # a save not yet renamed into place
    assert newest_version(tmp_path) == tmp_path / "weights" / "v10"  # by number, not by name


def test_a_restarted_engine_loads_the_newest_version_before_serving(tmp_path, monkeypatch):
    newest = _version(tmp_path, "v3")
    _version(tmp_path, "v1")
    loaded = []
    original = EmulatedEngine.load_weights

    async def spy(self, model_dir):
        loaded.append(model_dir)
        await original(self, model_dir)

    monkeypatch.setattr(EmulatedEngine, "load_weights", spy)
    host = EngineHost(0, Role.MIXED, EnginesConfig(), str(tmp_path))

    async def restart():
        await host.setup(types.SimpleNamespace(address="tcp://w"))
        await host.teardown(None)

    asyncio.run(restart())
    assert loaded == [newest]


def test_a_leg_failed_by_a_down_engine_is_not_logged_as_an_error_with_a_traceback():
    from prorsa.rollout.engine_host import _RetriedLegs

    def record(exception_text):
        return logging.LogRecord("distributed.worker", logging.ERROR, "worker.py", 1,
                                 "Compute Failed\nKey: %s\nState: %s\nTask: %s\nException: %r\nTraceback: %r\n",
                                 ("decode-t1", "executing", "task", exception_text, "  File ..."), None)

    quiet = _RetriedLegs()
    assert not quiet.filter(record("EngineUnavailable('engine-2: ConnectError: refused')"))
    assert not quiet.filter(record("KvTransferFailed('engine-2: HTTP 500')"))
    assert quiet.filter(record("ValueError('a bug')"))  # anything else is still an error
