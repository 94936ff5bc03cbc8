"""The engine host on a worker: an engine whose worker is restarted mid-run serves the newest
weight version, not version 0; legs failed by a down engine are not logged as errors."""

from __future__ import annotations

import asyncio
import logging
import types

import pytest

from prorsa.cluster.engine_host import EngineHost
from prorsa.config.pipeline import EnginesConfig
from prorsa.engine.emulated import EmulatedEngine
from prorsa.roles import Role
from prorsa.train.weights import newest_version


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


def test_a_restarted_engine_loads_the_shared_region_when_the_run_syncs_in_memory(tmp_path, monkeypatch):
    """train.weight_sync: memory writes no weights/v<N>: the region weights/shared names is the newest;
    a region gone with its session's driver is left for the resume to publish anew."""
    import torch

    from prorsa.shared_weights import SharedRegion
    from prorsa.train.weights import SHARED, SHARED_MANIFEST

    region = SharedRegion(tmp_path / "region")
    manifest = region.publish([("lm_head.weight", torch.ones(2, 2))])
    (tmp_path / "weights" / SHARED).mkdir(parents=True)
    (tmp_path / "weights" / SHARED / SHARED_MANIFEST).write_text(manifest.whole().to_json())
    _version(tmp_path, "v1")  # older than the region: a disk version from before
    shared, dirs = [], []

    async def load_shared(self, m):
        shared.append(m)

    async def load_weights(self, model_dir):
        dirs.append(model_dir)

    monkeypatch.setattr(EmulatedEngine, "load_shared", load_shared, raising=False)
    monkeypatch.setattr(EmulatedEngine, "load_weights", load_weights)

    def restart():
        host = EngineHost(0, Role.MIXED, EnginesConfig(), str(tmp_path))

        async def go():
            await host.setup(types.SimpleNamespace(address="tcp://w"))
            await host.teardown(None)
        asyncio.run(go())

    restart()
    assert shared == [manifest.whole()] and dirs == []
    region.unlink()
    restart()
    assert len(shared) == 1 and dirs == [tmp_path / "weights" / "v1"]


def test_a_leg_failed_by_a_down_engine_is_not_logged_as_an_error_with_a_traceback():
    from prorsa.cluster.worker_logs import SurvivedFaults

    def record(exception_text):
        return logging.LogRecord("distributed.worker", logging.ERROR, "worker.py", 1,
                                 "Compute Failed\nKey: %s\nState: %s\nTask: %s\nException: %r\nTraceback: %r\n",
                                 ("decode-t1", "executing", "task", exception_text, "  File ..."), None)

    quiet = SurvivedFaults()
    assert not quiet.filter(record("EngineUnavailable('engine-2: ConnectError: refused')"))
    assert not quiet.filter(record("KvTransferFailed('engine-2: HTTP 500')"))
    assert quiet.filter(record("ValueError('a bug')"))  # anything else is still an error


def _raise_closed_comm():
    """What distributed raises when the other end of a connection died: a closed stream chained
    to a closed comm, so logger.exception prints two tracebacks."""
    from distributed.comm.core import CommClosedError
    from tornado.iostream import StreamClosedError

    try:
        raise StreamClosedError()
    except StreamClosedError as e:
        raise CommClosedError("in <TCP (closed) local=tcp://127.0.0.1:4001>: Stream is closed") from e


@pytest.mark.parametrize("logger_name,level,message,args", [
    # worker.gather_dep: the worker it fetched a leg's result from died mid-transfer
    ("distributed.worker", logging.ERROR, "Worker stream died during communication: %s", ("tcp://127.0.0.1:4000",)),
    # worker.get_data: the worker it served a result to died before saying OK
    ("distributed.worker", logging.ERROR, "failed during get data with %s -> %s",
     ("tcp://127.0.0.1:4001", "tcp://127.0.0.1:4000")),
    # core._handle_comm: the same, one frame up, at INFO but with the traceback
    ("distributed.core", logging.INFO, "Lost connection to %r", ("tcp://127.0.0.1:4000",)),
])
def test_a_connection_to_a_dead_process_is_one_line_not_two_tracebacks(logger_name, level, message, args):
    """A worker killed mid-rollout closes its connections mid-exchange; distributed logs each with
    logger.exception (or exc_info=True) inside `except OSError`: two tracebacks in the run's output
    for a fault the scheduler recovers from (it fetches the data again or re-runs the leg)."""
    import io

    from prorsa.cluster.worker_logs import quiet_survived_faults

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(name)s - %(levelname)s - %(message)s"))
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        quiet_survived_faults()
        try:
            _raise_closed_comm()
        except OSError:
            logger.log(level, message, *args, exc_info=True)
        try:
            raise ValueError("data failed to deserialize")
        except Exception as e:
            logger.exception(e)  # any other failure keeps its traceback
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    first, *rest = out.getvalue().splitlines()
    assert first == (f"{logger_name} - {logging.getLevelName(min(level, logging.WARNING))} - {message % args} "
                     "(CommClosedError: in <TCP (closed) local=tcp://127.0.0.1:4001>: Stream is closed)")
    assert "ERROR - data failed to deserialize" in rest[0]
    assert sum("Traceback" in line for line in rest) == 1 and "Traceback" in rest[1]


def _filters_in_worker(dask_worker) -> list[str]:
    return [type(f).__name__ for f in logging.getLogger("distributed.worker").filters]


def test_every_worker_process_is_quiet_from_its_start_plugin_or_none(tmp_path):
    """A tool worker of a pipeline without an environment has no plugin: it was the one worker
    process that logged a dead engine's closed connection with two tracebacks. The filter comes
    with every worker spec's preload, so a process that never sets a plugin up has it too."""
    from distributed import Client, SpecCluster

    from prorsa.config.pipeline import PipelineConfig
    from prorsa.cluster.local import worker_specs

    cfg = PipelineConfig.model_validate({
        "name": "quiet", "seed": 0, "policy": "colocated",
        "engines": {"backend": "emulated", "count": 1, "slots": 2, "gpu": "h200", "model": "qwen3-8b"},
        "workload": {"family": "search", "mode": "sync", "prompts": 1, "group_size": 1},
        "runtime": {"processes": True, "tool_workers": 1},
    })
    assert cfg.environment is None
    spec = worker_specs(cfg, [Role.MIXED], tmp_path)
    tool = {k: v for k, v in spec.items() if not v["options"]["plugins"]}
    assert tool, "the tool worker of this pipeline has no plugin"

    async def main():
        async with SpecCluster(workers=tool, asynchronous=True, silence_logs=logging.ERROR) as cluster, \
                Client(cluster, asynchronous=True) as client:
            return await client.run(_filters_in_worker)

    seen = asyncio.run(main())
    assert seen and all("SurvivedFaults" in names for names in seen.values()), seen


def test_a_restart_whose_new_server_dies_too_is_one_warning_not_a_traceback(tmp_path, caplog):
    """A server killed again while it restarts: the watch says so in a line and tries again."""
    import asyncio
    import logging

    from prorsa.cluster.engine_host import EngineHost
    from prorsa.engine.vllm.errors import EngineUnavailable

    class DeadServer:
        def alive(self):
            return False

    class Engine:
        engine_id, server, tries = "engine-0", DeadServer(), 0

        async def ensure_healthy(self):
            self.tries += 1
            raise EngineUnavailable("vLLM server exited with code -9 while starting; last lines of x.log:\nboom")

    from prorsa.config.engines import EnginesConfig
    from prorsa.roles import Role

    host = EngineHost(0, Role.MIXED, EnginesConfig(), str(tmp_path))
    host.engine, host.health_interval_s, host.health_misses = Engine(), 0.01, 1

    async def main():
        watch = asyncio.create_task(host._watch_health())
        while host.engine.tries < 2:
            await asyncio.sleep(0.01)
        watch.cancel()

    with caplog.at_level(logging.WARNING, logger="prorsa.cluster.engine_host"):
        asyncio.run(main())
    records = [r for r in caplog.records if "restart failed" in r.getMessage()]
    assert records and all(r.levelno == logging.WARNING and r.exc_info is None for r in records)
    assert records[0].getMessage() == ("engine-0: restart failed, tried again next interval: vLLM server exited "
                                       "with code -9 while starting; last lines of x.log:")
