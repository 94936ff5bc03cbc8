"""Role switching on a real LocalCluster with emulated engines: the switch protocol's pitfalls,
each pinned, and a controlled run in which engines change role and no trajectory is lost."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import xarray as xr
from distributed import Client

from prorsa.agent.loop import TurnRequest
from prorsa.cluster.lifecycle_plugin import LifecyclePlugin
from prorsa.cluster.local import engine_addresses, start_local_cluster
from prorsa.config.pipeline import PipelineConfig
from prorsa.control.policy import make_policy
from prorsa.engine.registry import engine_name
from prorsa.live.controller import ControlPace, EngineCapacity, LiveController, _legs_on
from prorsa.live.runtime import DaskTurnRunner
from prorsa.metrics.recorder import RunRecorder
from prorsa.roles import Role
from prorsa.rollout.legs import DECODE_LEGS
from prorsa.rollout.router import Router

MOE = """\
name: switching
seed: 5
policy: prorsa:4:1:2:1:0.02  # a low bar: this test is about the switches, not their pay-off
engines: {backend: emulated, count: 4, slots: 128, time_scale: 0.1, model: qwen3-30b-a3b, ep: 8}
workload: {family: swe, mode: async, concurrency: 128, trajectories: 128, tool_time_scale: 0.1, max_turns: 3}
runtime: {turn_shape: driver, metrics_interval_s: 0.2, control_interval_s: 0.2, dashboard_address: null}
# declared means of a light workload with SWE's prompts (shorter ones would be set aside before
# the run opens): their steady split is all mixed, so the run opens there and its SWE turns move it
# (with no prior these engines would open on the split it moves to)
prior: {prompt_tokens: 2000, observation_tokens: 50, decode_tokens: 50, tool_s: 0.1, turns: 2}
"""


def test_prorsa_switches_roles_and_every_trajectory_completes_once(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(MOE)
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(f), f"output_dir={tmp_path / 'runs'}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_completed"] == 128 and summary["trajectories_failed"] == 0
    assert summary["role_switches"] >= 1 and summary["turns_retried"] == 0
    rows = pq.read_table(run_dir / "trajectories.parquet").to_pylist()
    assert len({r["traj_id"] for r in rows}) == 128
    turns = [(r["traj_id"], t["turn"]) for r in rows for t in r["turns"]]
    assert len(turns) == len(set(turns)) == summary["turns"]  # no turn lost or run twice
    ds = xr.open_dataset(run_dir / "metrics.nc")
    assert ds.sizes["switch"] == summary["role_switches"]
    assert (ds.switch_drain_s >= 0).all() and (ds.switch_from != ds.switch_to).all()
    assert all(json.loads(str(f)) for f in ds.switch_forecast.values)  # the forecast behind each
    assert ds.sizes["control"] > 10 and ds.sizes["forecast_bin"] > 0
    assert summary["forecast_mape"] and summary["control"]["plugin_calls"] > 0


def _cfg(**engines) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "name": "pin", "policy": "colocated",
        "engines": {"backend": "emulated", "count": 2, "slots": 4, "time_scale": 1.0} | engines,
        "runtime": {"turn_shape": "driver", "dashboard_address": None},
    })  # fmt: skip


def _turn(traj: str, appended: int, decode: int) -> TurnRequest:
    return TurnRequest(traj, 0, "swe", appended, appended, decode, 0.0, True, 1)


async def _controlled(client, roles: list[Role], restarts: bool = False):
    """The live control pieces over a started cluster's engines, with no policy of their own."""
    engines = [engine_name(i) for i in range(len(roles))]
    addresses = await engine_addresses(client)
    t0 = time.time()
    await client.register_plugin(LifecyclePlugin(t0))
    router = Router(dict(zip(engines, roles)), mixed_exports_kv=not restarts)
    runner = DaskTurnRunner(client, router, addresses, "driver", False, 0, t0)
    rec = RunRecorder(engines=engines, slots=4, expected=None)
    ctl = LiveController(client, make_policy("colocated"), router, addresses, rec,
                         EngineCapacity(4, 10**6, restarts=restarts), ControlPace(t0, 0.05))
    return addresses, router, runner, rec, ctl


def test_a_leg_bound_for_a_switching_engine_still_runs_there(tmp_path):
    """A decode routed to engine E waits for its prefill while E switches to prefill-only. The
    scheduler would send it, resources ignored, to any worker (a tool worker: it would block
    that worker's queue forever); the drain keeps E serving decodes until it has run there."""
    cfg = _cfg()

    async def main():
        async with await start_local_cluster(cfg, [Role.PREFILL, Role.MIXED], tmp_path) as cluster, \
                Client(cluster, asynchronous=True) as client:
            assert "stealing" not in cluster.scheduler.extensions  # stealing moves legs off their prefix
            addresses, router, runner, rec, ctl = await _controlled(client, [Role.PREFILL, Role.MIXED])
            turn = asyncio.create_task(runner.run_turn(_turn("t0", 30_000, 8)))  # ~0.5 s of prefill
            # its decode leg bound for engine-1 as the drain sees it: on the scheduler (the router
            # counts it a loop tick before its graph gets there)
            e1 = addresses["engine-1"]
            while not cluster.scheduler.tasks or not _legs_on(e1, DECODE_LEGS, cluster.scheduler):
                assert not turn.done(), "the turn ended before its decode leg was seen bound"
                await asyncio.sleep(0.01)
            assert router.load["engine-1"] == 1 and not turn.done()  # bound, and still in its prefill
            await ctl.switch("engine-1", Role.PREFILL, "test")
            result = await asyncio.wait_for(turn, 30)
            # The order, not the drain's length: the decode ran on engine-1, and engine-1 has no
            # decode resource now, so the drain kept the role until the decode had run.
            assert result.decode_engine == "engine-1" and result.decode_tokens == 8
            roles = await client.run(lambda dask_worker: dict(dask_worker.state.total_resources),
                                     workers=[addresses["engine-1"]])
            assert roles[addresses["engine-1"]]["decode"] == 0

    asyncio.run(main())


def test_switch_back_and_forth_under_load_loses_nothing(tmp_path):
    cfg = _cfg()
    roles = [Role.MIXED, Role.MIXED]

    async def main():
        async with await start_local_cluster(cfg, roles, tmp_path) as cluster, \
                Client(cluster, asynchronous=True) as client:
            addresses, router, runner, rec, ctl = await _controlled(client, roles)
            turns = [asyncio.create_task(runner.run_turn(_turn(f"t{i}", 2000 + 500 * i, 32))) for i in range(24)]
            for target in (Role.PREFILL, Role.MIXED, Role.DECODE, Role.MIXED):
                await ctl.switch("engine-0", target, "test")
                await asyncio.sleep(0.05)
            results = await asyncio.wait_for(asyncio.gather(*turns), 60)
            assert sorted(r.traj_id for r in results) == sorted(f"t{i}" for i in range(24))
            assert all(r.decode_tokens == 32 for r in results)
            assert [c.to_role for c in rec.role_changes] == [Role.PREFILL, Role.MIXED, Role.DECODE, Role.MIXED]
            assert runner.retried == 0

    asyncio.run(main())


RESTART_S = 0.5  # wall seconds at time scale 1


def test_a_prefill_engine_restarts_as_decode_once_its_kv_is_pulled_and_then_decodes(tmp_path):
    cfg = _cfg(role_switch="restart", restart_s=RESTART_S)
    roles = [Role.PREFILL, Role.MIXED]

    async def main():
        async with await start_local_cluster(cfg, roles, tmp_path) as cluster, \
                Client(cluster, asynchronous=True) as client:
            addresses, router, runner, rec, ctl = await _controlled(client, roles, restarts=True)
            assert ctl.empties("engine-0", Role.PREFILL, Role.DECODE)
            assert not ctl.empties("engine-1", Role.MIXED, Role.DECODE)
            # prefill on engine-0, then a decode on engine-1 that pulls engine-0's KV: the switch
            # below is asked for in the same loop tick the decode is seen running, so a few seconds
            # of decode is margin enough (3000 tokens took ~17 s and showed nothing more)
            turn = asyncio.create_task(runner.run_turn(_turn("t0", 4000, 600)))
            e1 = addresses["engine-1"]
            while not cluster.scheduler.tasks or not any(
                    ts.state == "processing" and (ts.annotations or {}).get("phase") in DECODE_LEGS
                    for ts in cluster.scheduler.tasks.values()):
                assert not turn.done(), "the turn ended before its decode began"
                await asyncio.sleep(0.005)
            assert _legs_on(e1, DECODE_LEGS, cluster.scheduler) == 1
            change = await ctl.switch("engine-0", Role.DECODE, "test")
            # the restart waited for the decode that needed engine-0's KV, then held RESTART_S
            assert turn.done() and (await turn).prefill_engine == "engine-0"
            assert change is not None and change.drain_s >= RESTART_S
            held = await client.run(lambda dask_worker: dict(dask_worker.state.total_resources),
                                    workers=[addresses["engine-0"]])
            assert held[addresses["engine-0"]]["decode"] > 0 == held[addresses["engine-0"]]["prefill"]
            # no prefill engine left: every engine that decodes runs its turns whole, engine-0 too
            results = await asyncio.wait_for(asyncio.gather(
                *(runner.run_turn(_turn(f"n{i}", 500, 8)) for i in range(6))), 60)
            assert {r.decode_engine for r in results} == {"engine-0", "engine-1"}
            assert all(r.prefill_engine == "" and r.decode_tokens == 8 for r in results)
            assert runner.retried == 0
            assert [(c.from_role, c.to_role) for c in rec.role_changes] == [(Role.PREFILL, Role.DECODE)]

    asyncio.run(main())


class _Dear:
    """colocated's decisions, each after `cpu_s` of CPU spent in the policy's own thread."""

    def __init__(self, cpu_s: float) -> None:
        self.inner = make_policy("colocated")
        self.name = self.inner.name
        self.cpu_s = cpu_s

    def initial_roles(self, n):
        return self.inner.initial_roles(n)

    def decide(self, snap):
        c = time.thread_time()
        while time.thread_time() - c < self.cpu_s:
            pass
        return self.inner.decide(snap)


def test_a_dear_policy_waits_longer_between_steps_and_its_cpu_is_counted(tmp_path):
    """Live, the policy shares the GIL with the in-process scheduler and workers: a 40 ms plan
    every 50 ms would take most of a core from the rollout. Its CPU is counted where it is spent
    (the policy's thread, the scheduler call) and the next step waits until the steps' share of
    a core is back under control_cpu_share."""
    cfg = _cfg()
    engines = [engine_name(i) for i in range(2)]

    async def steps_of(client, addresses, share: float, n: int) -> tuple[LiveController, list[float]]:
        """n control steps, and each wait the loop took before one (read off pause(), which the
        loop sleeps for: the steps are counted, not a wall-clock window)."""
        router = Router(dict(zip(engines, [Role.MIXED, Role.MIXED])))
        rec = RunRecorder(engines=engines, slots=4, expected=None)
        ctl = LiveController(client, _Dear(0.04), router, addresses, rec, EngineCapacity(4, 10**6),
                             ControlPace(time.time(), 0.05, max_cpu_share=share))
        waits, pause, enough = [], ctl.pause, asyncio.Event()

        def recorded() -> float:
            if len(ctl.step_s) >= n:
                enough.set()
            waits.append(pause())
            return waits[-1]

        ctl.pause = recorded
        loop = asyncio.create_task(ctl.run())
        await asyncio.wait_for(enough.wait(), 120)  # a hang guard
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        return ctl, waits[:n]

    async def main():
        async with await start_local_cluster(cfg, [Role.MIXED, Role.MIXED], tmp_path) as cluster, \
                Client(cluster, asynchronous=True) as client:
            addresses = await engine_addresses(client)
            await client.register_plugin(LifecyclePlugin(time.time()))
            free, free_waits = await steps_of(client, addresses, 1.0, 4)  # a share of 1: the interval alone
            capped, capped_waits = await steps_of(client, addresses, 0.1, 4)
            assert all(c >= 0.04 for c in free.step_cpu_s + capped.step_cpu_s)  # the plan's CPU counted
            assert free_waits[0] == capped_waits[0] == 0.05  # before the first step: the interval
            # after a step of >= 40 ms of CPU a share of 0.1 waits >= 0.4 s; a share of 1 does not
            assert max(free_waits) < 0.4 <= min(capped_waits[1:]), (free_waits, capped_waits)
            # the steps' CPU over the waits after them: the share it was held to
            assert sum(capped.step_cpu_s[:3]) / sum(capped_waits[1:]) <= 0.15

    asyncio.run(main())


STEPS = """\
name: rehearsing
seed: 3
policy: prorsa
engines: {backend: emulated, count: 4, slots: 128, time_scale: 0.05, model: qwen3-30b-a3b, ep: 4}
workload: {family: swe, mode: sync, prompts: 4, group_size: 8, steps: 2, tool_time_scale: 0.1, max_turns: 4}
runtime: {metrics_interval_s: 0.2, control_interval_s: 0.2, dashboard_address: null}
"""  # 32 trajectories a step: a step's Dask tasks, not its engines' time, set the test's length


def test_live_prorsa_rehearses_the_step_that_ran_before_the_next(tmp_path):
    """Between the two steps of a live run the policy (in its thread) replays the first step in
    the simulator under every candidate split, and the second step starts on its pick."""
    f = tmp_path / "p.yaml"
    f.write_text(STEPS)
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(f), f"output_dir={tmp_path / 'runs'}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_completed"] == 64
    ds = xr.open_dataset(run_dir / "metrics.nc")
    between = [str(r) for r in ds.control_reason.values if str(r).startswith("next step")]
    assert len(between) == 1 and "rehearsed on 32 trajectories" in between[0]
    first_step_end = max(r["end_s"] for r in pq.read_table(run_dir / "trajectories.parquet").to_pylist() if r["step"] == 0)
    assert ds.attrs["time_scale"] == 0.05 and ds.attrs["clock"] == "wall"  # control_t and end_s: one clock
    codes = json.loads(ds.attrs["role_codes"])
    opening = sorted(int(x) for x in ds.control_role.values[0])
    # the first step opens where the policy, told no prior and the prompts in hand, opens with the
    # simulator lent: the split of least worst-case regret over the families SWE's prompts fit
    assert ds.control_t.values[0] < first_step_end
    from dataclasses import replace

    import yaml

    from prorsa.agent.workload import Workload
    from prorsa.rollout.context import prior_checked, resolve
    from prorsa.sim.rehearse import rehearser
    from prorsa.sim.run import simulate_async

    run = resolve(PipelineConfig.model_validate(yaml.safe_load(STEPS)))
    told = prior_checked(run, Workload.from_config(run.cfg.workload, run.cfg.seed)).policy
    expected = make_policy("prorsa", replace(told, rehearse=rehearser(run, simulate_async))).initial_roles(4)
    assert opening == sorted(codes[r.value] for r in expected)
