"""Synchronous and asynchronous RL drivers: which trajectories run, and when.

    run_sync(workload, cfg, runner, now, hooks)      steps of B x G; a step ends with its last trajectory
    run_async(workload, cfg, runner, now, hooks)     keep N in flight; stop at a count or a duration
    Hooks(on_done, ...)                              what a driver calls back and is told:
      on_done                                        each trajectory's result, as it ends
      on_turn                                        optional: each turn's result, as it ends
      episodes                                       optional: spec -> Episode (an environment's
                                                     tool calls and reward, agent/environment.py)
      update_weights                                 optional: the body's weight update (engines
                                                     stall, prefix caches invalidated); sync: awaited
                                                     between steps; async: started every B x G
                                                     finished trajectories (or every
                                                     weight_update_every_s) while rollout goes on
      skip                                           optional: trajectory ids finished earlier (a
                                                     resumed run); the same slots, left out
      version                                        optional: the engines' policy version now; each
                                                     result is tagged with the one it started under;
                                                     sync: no update before step s once it is s
      gate                                           async, optional: started count -> may another
                                                     start now (the RL loop's staleness bound)
      before_step                                    sync, optional: awaited before each step, after
                                                     the weight update (the roles for the step)
      clock_unit                                     wall seconds per second of `now`: a spec's
                                                     release (start_s) is given in wall seconds,
                                                     like its tool latencies
      load_weights                                   optional: a model directory into every engine
                                                     (the RL loop's push); a driver whose clients
                                                     bring weights (prorsa serve) calls it
    play_spec(spec, runner, now, on_done, ...)       one trajectory, tagged with the version it
                                                     started under, each turn with the one it was
                                                     sent under (VersionedRunner; both drivers,
                                                     rollout/partial.py, the Python API)
    release_of(spec, began, clock_unit)              when a spec may start, in `now`'s seconds

Releases. A spec with a start_s starts no earlier than start_s after its step began (sync: the
step begins once before_step returns) or the run began (async); one without starts as it always
did. Async starts trajectories in index order: a free slot waits for the next index's release, so
a trace replayed async is ordered by release first (agent/workload.py) and no unreleased trajectory
holds back a released one.

Pure asyncio over a TurnRunner, so the same drivers run live and in virtual time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Container
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from prorsa.agent.loop import (Episode, TrajectoryResult, TurnListener, TurnRequest, TurnResult, TurnRunner,
                               run_trajectory)
from prorsa.agent.workload import TrajectorySpec, Workload
from prorsa.config.workload import WorkloadConfig

Done = Callable[[TrajectoryResult], None]
Episodes = Callable[[TrajectorySpec], Episode]
Update = Callable[[], Awaitable[None]]
Version = Callable[[], int]
LoadWeights = Callable[[Path], Awaitable[None]]


@dataclass(frozen=True)
class Hooks:
    """What a driver calls back and what it is told of the run (the module docstring)."""

    on_done: Done
    on_turn: TurnListener | None = None
    episodes: Episodes | None = None
    update_weights: Update | None = None
    skip: Container[str] = frozenset()
    version: Version | None = None
    gate: Callable[[int], bool] | None = None
    before_step: Callable[[int], Awaitable[None]] | None = None
    clock_unit: float = 1.0
    load_weights: LoadWeights | None = None


def expected_trajectories(cfg: WorkloadConfig) -> int | None:
    """None when an async run stops on a duration: the count is whatever fits."""
    if cfg.mode == "sync":
        return cfg.steps * cfg.prompts * cfg.group_size
    return cfg.trajectories if cfg.duration_s is None else None


async def run_sync(workload: Workload, cfg: WorkloadConfig, runner: TurnRunner, now: Callable[[], float],
                   hooks: Hooks) -> list[TrajectoryResult]:
    h = hooks
    skip, update_weights, version = h.skip, h.update_weights, h.version
    results: list[TrajectoryResult] = []
    for step in range(cfg.steps):
        specs = [s for s in workload.trajectories_for_step(step) if s.traj_id not in skip]
        if not specs:
            continue
        # a resumed run whose engines already hold step's version (its update was saved) goes on
        if step and update_weights is not None and (version is None or version() < step):
            await update_weights()
        if h.before_step is not None:
            await h.before_step(step)
        began = now()
        step_results = await asyncio.gather(*(play_spec(s, runner, now, h.on_done, h.on_turn, h.episodes, version,
                                                   release=release_of(s, began, h.clock_unit))
                                              for s in specs))
        results.extend(step_results)
    return results


async def run_async(workload: Workload, cfg: WorkloadConfig, runner: TurnRunner, now: Callable[[], float],
                    hooks: Hooks) -> list[TrajectoryResult]:
    h = hooks
    skip, update_weights, gate = h.skip, h.update_weights, h.gate
    results: list[TrajectoryResult] = []
    batch = cfg.prompts * cfg.group_size  # trajectories per training step
    updates: list[asyncio.Task] = []
    began = now()
    deadline = None if cfg.duration_s is None else began + cfg.duration_s
    every = cfg.weight_update_every_s if update_weights is not None else None
    next_update = None if every is None else now() + every
    limit = cfg.trajectories
    started = 0
    in_flight: set[asyncio.Task] = set()

    def more_to_start() -> bool:
        return (limit is None or started < limit) and (deadline is None or now() < deadline)

    while True:
        held = None  # the release the next index waits for, when a slot is free before it
        while len(in_flight) < cfg.concurrency and more_to_start() and (gate is None or gate(started)):
            spec = workload.trajectory(started)
            if spec.traj_id not in skip and (release := release_of(spec, began, h.clock_unit)) > now():
                # one released after the deadline never starts: the run ends with what is in flight
                held = release if deadline is None or release < deadline else None
                break
            started += 1
            if spec.traj_id not in skip:  # an index is an identity: a skipped one still counts
                in_flight.add(asyncio.create_task(play_spec(spec, runner, now, h.on_done, h.on_turn, h.episodes,
                                                            h.version)))
        pending = [u for u in updates if not u.done()]
        if not in_flight and held is None:
            await asyncio.gather(*updates)
            if pending and more_to_start():  # held back by the gate: the update just made opens it
                continue
            return results
        # past its deadline an async run only waits for what is in flight; an update stays due
        wake = ([deadline] if deadline is not None and deadline > now() else []) + \
            ([next_update] if next_update is not None else []) + ([held] if held is not None else [])
        timeout = max(min(wake) - now(), 0.0) if wake else None
        # an update that ends may open the gate, so it wakes the loop as a finished trajectory does
        done = await _first_done(in_flight | set(pending), timeout)
        finished = done & in_flight
        in_flight -= finished
        before = len(results) // batch
        results.extend(t.result() for t in finished)
        going_on = in_flight or more_to_start()
        if next_update is not None and now() >= next_update:
            next_update += every
            due = bool(going_on)
        else:
            due = every is None and update_weights is not None and going_on and len(results) // batch > before
        if due:
            updates.append(asyncio.create_task(update_weights()))  # the rollout goes on meanwhile


def release_of(spec: TrajectorySpec, began: float, clock_unit: float) -> float:
    """When `spec` may start, in `now`'s seconds: at once (`began`) when it has no release."""
    return began if spec.start_s is None else began + spec.start_s / clock_unit


async def _first_done(tasks: set[asyncio.Task], timeout: float | None) -> set[asyncio.Task]:
    """asyncio.wait's first-completed set; with nothing in flight (a release pending) only the timeout."""
    if not tasks:
        await asyncio.sleep(timeout or 0.0)
        return set()
    done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    return done


class VersionedRunner:
    """A runner whose every TurnResult carries the policy version its request was sent under:
    a trajectory that lives across a weight update (async, a carried partial rollout) has turns
    of several versions."""

    def __init__(self, runner: TurnRunner, version: Version) -> None:
        self.runner, self.version = runner, version

    def __getattr__(self, name: str):  # needs_token_ids, vocab_size and whatever else episodes read
        return getattr(self.runner, name)

    async def run_turn(self, req: TurnRequest) -> TurnResult:
        sent_under = self.version()
        return replace(await self.runner.run_turn(req), policy_version=sent_under)


async def play_spec(spec, runner, now, on_done: Done, on_turn, episodes: Episodes | None,
               version: Version | None = None, release: float | None = None) -> TrajectoryResult:
    if release is not None and (wait := release - now()) > 0:  # a trajectory without a release never yields here
        await asyncio.sleep(wait)
    episode = episodes(spec) if episodes is not None else None
    started_under = version() if version is not None else 0
    if version is not None:
        runner = VersionedRunner(runner, version)
    result = await run_trajectory(spec, runner, now, on_turn, episode)
    result.policy_version = started_under
    on_done(result)
    return result
