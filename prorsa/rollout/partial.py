"""Partial rollouts: synchronous steps that end when enough GRPO groups are whole.

    PartialPlan.of(cfg) -> PartialPlan | None    the pipeline's partial_rollout, resolved (None: off)
    run_partial(workload, cfg, runner, now, hooks, partial=plan[, checkpoint=])
                                                 run_sync's contract, steps ended early; roll_out
                                                 calls it instead of run_sync when a plan is given
    Steps(workload, runner, now, hooks, plan)    the steps themselves, for a caller that drives
                                                 them one at a time (prorsa.Rollout.generate):
                                                 set .version, await .run(step, last=False)

A step is `plan.groups` = ceil((1 + over_sample) x prompts) groups in flight. It ends once
`prompts` groups are whole (every member ended: GRPO weighs a member against its group), the
first ones to be whole; those are the step's batch. What is still running then:

    carry     goes on into the next step: its next turns are sent under the new weights (the
              update invalidates every prefix cache, theirs too); the next step starts as many
              fewer new groups as it carries, so each step keeps `plan.groups` in flight
    no carry  is cancelled; its group is dropped whole (the members that ended too)
    last step is cancelled either way: nothing trains on it

Whole groups past the batch (ended at the same instant) wait for the next step's batch.

    overlap   as a group becomes whole, the next step's next group starts at once, so as many
              groups run as the plan starts (plain: the tail runs down to the last few); those
              groups start under this step's version and are carried; at most one step ahead (a
              step's slots run out), none past the last step. One whole before this step's batch
              is filled trains in it (its lag 0, as any member of the batch)

A group's members all start under one version (the step's); a turn is tagged with the version it
was sent under (drivers.VersionedRunner), so a carried trajectory's oldest version is its
start's. At each step's start a carried group whose start version lags the step's version by more
than `max_staleness` is dropped (status `stale`): it could never be trained within the bound. So
a trajectory is trained exactly once, in the step whose batch its group completes into, or is
reported once as `cancelled` or `stale`; `on_done` sees each trajectory once, when its fate is
known (the journal and the learner: a batch's members just before the update that trains them).
Within the bound, a trained trajectory's older turns are corrected by the trainer's importance
ratio against the engine's own logprobs (train/trainer.py: the rollout's logprobs are the
behaviour policy's, per token, whichever version wrote them).

Versions: the `version` callable when given (the learner's), else the step index (a step follows
one update per step before it, modelled or not).

Resume (`prorsa run --resume`): which groups a step started, and which it carried, depends on when
others ended, so it cannot be drawn again from the seed. `checkpoint.current()` says where the run
stands: the step, how many of each step's groups were started, and every group started and not yet
reported with its unreported members. The journal stores it with each commit (metrics/journal.py),
so it agrees with the trajectories committed beside it. A resumed run goes on in that step: those
groups start again from their first turn (what they had played died with the driver) under the
version now in force, the rest of the step's groups are drawn as before, and nothing the journal
holds is played again: each trajectory is still trained once or reported once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Container
from dataclasses import dataclass, field

from prorsa.agent.loop import TrajectoryResult, TrajectoryStatus, TurnResult, TurnRunner
from prorsa.agent.workload import TrajectorySpec, Workload
from prorsa.config.pipeline import PipelineConfig
from prorsa.config.workload import WorkloadConfig
from prorsa.rollout.drivers import Hooks, play_spec, release_of


@dataclass(frozen=True)
class PartialPlan:
    prompts: int  # whole groups a step trains (workload.prompts)
    groups: int  # groups in flight in each step: ceil((1 + over_sample) x prompts)
    carry: bool  # unfinished trajectories go on into the next step (else cancelled)
    max_staleness: int  # versions a trained trajectory's first turn may lag the trained version
    overlap: bool = False  # the next step's groups start as this step's become whole

    @classmethod
    def of(cls, cfg: PipelineConfig) -> PartialPlan | None:
        p = cfg.partial_rollout
        if p is None:
            return None
        b = cfg.workload.prompts
        # the float product of e.g. 0.1 x 10 lands a hair above 1: round it off before the ceiling
        return cls(b, math.ceil(round((1 + p.over_sample) * b, 9)), p.carry, cfg.staleness_bound, p.overlap)


@dataclass
class _Group:
    key: str  # s{step}-p{prompt}: the step it started in and its prompt
    version: int  # what its members started under
    specs: list[TrajectorySpec]
    tasks: dict[str, asyncio.Task] = field(default_factory=dict)  # members still running
    ended: dict[str, TrajectoryResult] = field(default_factory=dict)

    @property
    def whole(self) -> bool:
        return len(self.ended) == len(self.specs)


async def run_partial(workload: Workload, cfg: WorkloadConfig, runner: TurnRunner, now: Callable[[], float],
                      hooks: Hooks, *, partial: PartialPlan, checkpoint: Checkpoint | None = None
                      ) -> list[TrajectoryResult]:
    """rollout/drivers.py run_sync's contract (`hooks`: its Hooks; gate unused), steps ended early."""
    saved = checkpoint.saved if checkpoint is not None else None
    skip, update_weights, version, before_step = hooks.skip, hooks.update_weights, hooks.version, hooks.before_step
    if skip and saved is None:  # which groups a step started depends on when others ended: not drawable again
        raise ValueError("a partial rollout resumes from the state its journal kept, and there is none")
    steps = Steps(workload, runner, now, hooks, partial)
    if checkpoint is not None:
        checkpoint.current = steps.snapshot
    first = 0 if saved is None else int(saved["step"])
    for step in range(first, cfg.steps):
        # a resumed learner whose engines already hold step's version goes on without an update
        if step and update_weights is not None and (version is None or version() < step):
            await update_weights()
        if before_step is not None:
            # unlike plain sync, carried trajectories are in flight here: a switch it asks for
            # drains them, and the step's new groups wait for it
            await before_step(step)
        steps.version = version() if version is not None else step
        if step == first and saved is not None:
            steps.restore(saved, skip)
        await steps.run(step, last=step == cfg.steps - 1)
    return steps.results


@dataclass
class Checkpoint:
    """Where a partial rollout stands, for a resume (module docstring): `saved`, what an earlier
    session's journal kept (None: a fresh run); `current`, set by run_partial, the state now."""

    saved: dict | None = None
    current: Callable[[], dict] | None = None


class Steps:
    """The groups in flight across steps, and each trajectory's fate."""

    def __init__(self, workload: Workload, runner: TurnRunner, now: Callable[[], float], hooks: Hooks,
                 plan: PartialPlan) -> None:
        self.workload, self.now, self.hooks, self.plan = workload, now, hooks, plan
        self.runner = runner
        self.version = 0  # the step's: what a turn sent now is tagged with
        self.running: dict[str, _Group] = {}  # by key, in start order
        self.whole: list[_Group] = []  # in the order they became whole, not yet in a batch
        self.turns: dict[str, list[TurnResult]] = {}  # what a cancelled trajectory had played
        self.results: list[TrajectoryResult] = []  # every trajectory, as on_done saw it
        self.started: dict[int, int] = {}  # step -> groups started from its slots (overlap starts some early)
        self.step = -1  # the step running
        self.batched = 0  # of its batch's groups, those reported
        self.reported: set[str] = set()
        self._reporting = False  # inside a group's reports

    def snapshot(self) -> dict | None:
        """Where the run stands (the module docstring's resume): JSON, read back by restore().
        None while a group's members are being reported: a commit then would keep part of a
        group's fate, so the journal waits for the next (metrics/journal.py)."""
        if self._reporting:
            return None
        left = {g.key: [s.traj_id for s in g.specs if s.traj_id not in self.reported]
                for g in [*self.running.values(), *self.whole]}
        return {"step": self.step, "batched": self.batched, "started": {str(k): v for k, v in self.started.items()},
                "groups": [[g.specs[0].step, g.specs[0].prompt_index, left[g.key]]
                           for g in [*self.running.values(), *self.whole] if left[g.key]]}

    def restore(self, saved: dict, done: Container[str]) -> None:
        """Go on from `saved` (a snapshot an earlier session's journal kept): its groups start
        again from their first turn (none of their members is in `done`: a group's fate is
        committed whole)."""
        self.step, self.batched = int(saved["step"]), int(saved["batched"])
        self.started = {int(k): v for k, v in saved["started"].items()}
        g_size = self.workload.cfg.group_size
        began = self.now()
        for step, prompt, members in saved["groups"]:
            slots = self.workload.trajectories_for_step(step, first=(prompt + 1) * g_size, prompts=self.plan.groups)
            specs = [s for s in slots[prompt * g_size:] if s.traj_id in members]
            if any(s.traj_id in done for s in specs):
                raise ValueError(f"partial rollout: group s{step}-p{prompt} is both in the journal and in flight")
            if specs:
                self._launch(_Group(f"s{step}-p{prompt}", self.version, specs), began)

    async def run(self, step: int, *, last: bool) -> None:
        if step != self.step:  # else restored mid-step
            self.step, self.batched = step, 0
        await self._drop_stale(step)
        self._start(step)
        while len(self.whole) < self.plan.prompts - self.batched:
            await self._next_ended()
            if self.plan.overlap and not last:
                self._begin(step + 1, self.plan.groups - len(self.running))
        for g in self.whole[:self.plan.prompts - self.batched]:
            self._report_group([g.ended[spec.traj_id] for spec in g.specs], trained=step)
            self.whole.remove(g)
            self.batched += 1
        if last:
            await self._cut([*self.running.values(), *self.whole], TrajectoryStatus.CANCELLED,
                            f"in no batch when the last step ({step}) ended")
        elif not self.plan.carry:
            await self._cut(list(self.running.values()), TrajectoryStatus.CANCELLED,
                            f"unfinished when step {step} ended (partial_rollout.carry false)")

    def _start(self, step: int) -> None:
        self._begin(step, self.plan.groups - len(self.running) - len(self.whole))

    def _begin(self, step: int, new: int) -> None:
        """Start the next `new` of `step`'s groups not yet started (fewer where its slots run out)."""
        done = self.started.get(step, 0)
        new = min(new, self.plan.groups - done)
        if new <= 0:
            return
        self.started[step] = done + new
        began = self.now()
        g_size = self.workload.cfg.group_size
        # of a full step's groups: a step's slots stay step x groups apart however many it carried,
        # so a replayed trace never plays one of its trajectories twice at once
        specs = self.workload.trajectories_for_step(step, first=(done + new) * g_size,
                                                    prompts=self.plan.groups)[done * g_size:]
        for i in range(0, len(specs), g_size):
            members = specs[i:i + g_size]
            self._launch(_Group(f"s{step}-p{members[0].prompt_index}", self.version, members), began)

    def _launch(self, group: _Group, began: float) -> None:
        for spec in group.specs:
            group.tasks[spec.traj_id] = asyncio.create_task(self._play(spec, began))
        self.running[group.key] = group

    async def _play(self, spec: TrajectorySpec, began: float) -> TrajectoryResult:
        h = self.hooks
        self.turns[spec.traj_id] = turns = []

        def seen(s: TrajectorySpec, res: TurnResult) -> None:
            turns.append(res)
            if h.on_turn is not None:
                h.on_turn(s, res)

        # each trajectory's on_done waits for its group's fate (_report), so none is handed on here
        return await play_spec(spec, self.runner, self.now, lambda r: None, seen, h.episodes,
                               lambda: self.version, release=release_of(spec, began, h.clock_unit))

    async def _next_ended(self) -> None:
        tasks = {t: g for g in self.running.values() for t in g.tasks.values()}
        if not tasks:
            raise RuntimeError(f"partial rollout: {len(self.whole)} whole groups and none running; "
                               f"a step needs {self.plan.prompts}")
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in sorted(done, key=lambda t: tasks[t].key):  # one instant's ends in a fixed order
            g = tasks[task]
            r = task.result()
            del g.tasks[r.spec.traj_id]
            g.ended[r.spec.traj_id] = r
            if g.whole:
                self.whole.append(self.running.pop(g.key))

    async def _drop_stale(self, step: int) -> None:
        bound = self.plan.max_staleness
        stale = [g for g in [*self.running.values(), *self.whole] if self.version - g.version > bound]
        await self._cut(stale, TrajectoryStatus.STALE, f"started under version {{v}}, more than {bound} behind "
                        f"step {step}'s version {self.version} (partial_rollout max_staleness)")

    async def _cut(self, groups: list[_Group], status: TrajectoryStatus, why: str) -> None:
        """Cancel `groups` whole: their running members stop (engines free their slots and KV),
        and every member, ended or not, is reported untrained with `status`."""
        tasks = [t for g in groups for t in g.tasks.values()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for g in groups:
            # one that ended before its cancel took has its own result
            g.ended |= {i: t.result() for i, t in g.tasks.items() if not t.cancelled()}
            self.running.pop(g.key, None)
            if g in self.whole:
                self.whole.remove(g)
            fates = [g.ended.get(spec.traj_id) or self._unfinished(spec, g.version) for spec in g.specs]
            for r in fates:
                r.status, r.error = status, why.format(v=g.version)
            self._report_group(fates, trained=None)

    def _unfinished(self, spec: TrajectorySpec, version: int) -> TrajectoryResult:
        turns = self.turns.get(spec.traj_id, [])
        start = turns[0].start_s if turns else self.now()
        return TrajectoryResult(spec, list(turns), start_s=start, end_s=self.now(), policy_version=version)

    def _report_group(self, fates: list[TrajectoryResult], trained: int | None) -> None:
        self._reporting = True
        try:
            for r in fates:
                r.trained_step = trained
                self.reported.add(r.spec.traj_id)
                self.turns.pop(r.spec.traj_id, None)
                self.results.append(r)
                self.hooks.on_done(r)
        finally:
            self._reporting = False
