"""The simulator lent to a policy: replay trajectories as one step under a candidate split.

    rehearser(run, simulate) -> Rehearse
                                 rehearse(specs, (p, d, m)[, scale=, events=, told=]) -> makespan, body
                                 seconds, of `specs` (tool times in body seconds) replayed at once
                                 on `run`'s engines under static:p:d:m (colocated when p = d = 0);
                                 in an asynchronous run, more of them than its `concurrency` are
                                 replayed as it runs them, that many in flight, and its weight
                                 updates are replayed as declared; `scale`: the model
                                 corrected by it (the policy's calibration); `events`: a list the
                                 replay's lifecycle events are appended to; `told` False: the
                                 router of a run told no prior (its moves priced at the default
                                 mean decode, not the prior's); `simulate`: sim/run.py's
                                 coroutine (run, policy, workload) -> SimRun
    misfit(run, scale) -> RunContext   `run` as a policy whose model is wrong by `scale` sees it:
                                 its cost models (the fluid model's and every rehearsal's) scaled,
                                 the engines' own untouched
    future_run(run, workload, simulate) -> FutureRun
                                 the run itself, from its start, opening in a split and making
                                 given moves (control/policy.py Replay): the oracle's alone, as it
                                 is the run's future; no live body can give it

With engine groups (engines.groups) a split is one (p, d, m) per group (control/group_search.py)
and the replay opens each group's engines in its counts; future_run gives none there.

Model-predictive control on the step's horizon: the policy (control/adaptive.py) asks which split
would have ended the step it just saw soonest, with the same engines, router and cost model the
run has, instead of trusting the fluid model's steady state. Each rehearsal runs on a virtual clock
of its own, in a thread of its own: the caller may be inside the simulator's own loop.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from prorsa.agent.trace import TrajectorySpec
from prorsa.agent.workload import Workload
from prorsa.control.lifecycle import LifecycleEvent
from prorsa.control.policy import Decision, FutureRun, Move, Rehearse, Replay, make_policy
from prorsa.costmodel.misfit import ModelScale
from prorsa.roles import Role
from prorsa.rollout.context import RunContext
from prorsa.sim.clock import run_virtual
from prorsa.sim.rehearsal_cache import cached, digest


def rehearser(run: RunContext, simulate: Callable[..., Coroutine[Any, Any, Any]]) -> Rehearse | None:
    """rehearse(specs, split) (module docstring); with engine groups `split` is one (p, d, m) per
    group, opened engine by engine (which engines of a group take which role does not matter: they
    are alike)."""
    base = run.cfg
    w0 = base.workload
    # the trajectories as they ran: nothing of the pipeline's shaping is applied to them again but
    # its context bound (in the tokens they ran with: the family's cap scaled, or the pipeline's),
    # which a trajectory carried forward with longer decodes would meet sooner
    cap = run.context_budget or 2**30
    wcfg = w0.model_copy(update={
        "mode": "sync", "steps": 1, "group_size": 1, "token_scale": 1.0, "tool_time_scale": 1.0,
        "decode_growth": 1.0, "max_turns": None, "max_context": cap, "weight_update_s": 0.0, "duration_s": None})

    def rehearse(specs: Sequence[TrajectorySpec], split, *, scale: ModelScale | None = None,
                 events: list[LifecycleEvent] | None = None, told: bool = True) -> float:
        if not run.engines_alike:  # a static opening per engine; "static" names it in the config
            policy, opening = "static", _Opening(_roles(split))
        else:
            p, d, m = split
            policy = opening = "colocated" if p == d == 0 else f"static:{p}:{d}:{m}"
        shape = {"prompts": len(specs)}
        if w0.mode == "async" and (len(specs) > w0.concurrency or w0.weight_update_s):
            # as the run keeps them in flight, its declared weight updates stalling the engines
            # and emptying every prefix cache on their clock or batch: left out, a split whose
            # prefill engines cannot take the recompute after each update rehearsed as the best
            # (SWE and math-tir mixed on MoE engines, 3 s updates every 30 s: P1 beside mixed
            # held, 0.83 of the best fixed split)
            shape = {"mode": "async", "concurrency": w0.concurrency, "trajectories": len(specs),
                     "prompts": w0.prompts * w0.group_size, "weight_update_s": w0.weight_update_s,
                     "weight_update_every_s": w0.weight_update_every_s}
        w = wcfg.model_copy(update=shape)
        if (scale, told) not in world:
            world[scale, told] = _seen(run, scale, told)
        seen, world_key = world[scale, told]
        # the seed draws nothing in a replay of given trajectories: one seed's opening serves the next
        ctx = replace(seen, cfg=base.model_copy(update={"workload": w, "prior": None, "policy": policy, "seed": 0}))
        if events is not None:
            opening = _Watched(opening if not isinstance(opening, str) else make_policy(opening, ctx.policy), events)

        def replay() -> float:
            wall = tuple(specs) if run.unit == 1 else tuple(
                replace(s, turns=tuple(replace(t, tool_latency_s=t.tool_latency_s * run.unit) for t in s.turns))
                for s in specs)
            workload = Workload(w, 0, family=None, trace=wall)
            with ThreadPoolExecutor(1) as pool:
                return pool.submit(lambda: run_virtual(simulate(ctx, opening, workload=workload)).makespan_s).result()

        if events is not None:  # what a stored makespan cannot give back
            return replay()
        return cached((world_key, w.model_dump_json(), policy, split, _specs_key(specs)), replay)

    # (scale, told) -> the run as the policy then sees it, and the digest of what every replay of it
    # reads but its split, shape and trajectories: made once, not once a split
    world: dict[tuple, tuple[RunContext, str]] = {}
    return rehearse


def _seen(run: RunContext, scale: ModelScale | None, told: bool) -> tuple[RunContext, str]:
    seen = misfit(run, scale) if scale is not None else run
    if not told:
        seen = replace(seen, policy=replace(seen.policy, prior=None))
    return seen, digest(_world(seen))


def _world(seen: RunContext) -> tuple:
    """What every rehearsal of a run reads but its split, workload shape and trajectories
    (sim/rehearsal_cache.py): the config as JSON (its pickle holds a set), the cost models and
    engines as the policy sees them. Not the policy's callables, which a static split never calls,
    nor the run's opening prompts, which the replay counts afresh from its trajectories
    (rollout/context.py prior_checked): with them every seed's opening would miss another's."""
    policy = replace(seen.policy, rehearse=None, future_run=None, future=None, opening_prompts=())
    cfg = seen.cfg.model_dump_json(exclude={"name", "output_dir", "workload", "policy", "prior", "seed"})
    return cfg, seen.unit, seen.costs, seen.engine_costs, seen.engine_slots, policy


_last_specs: list = [None, ""]  # the trajectories last keyed, and their digest: a split sweep reuses them


def _specs_key(specs: Sequence[TrajectorySpec]) -> object:
    """A named draw by its name (control/opening.py FamilyDraw: nothing is drawn), others by their
    content; a tuple (which cannot change) is hashed once for the splits a sweep rehearses it under."""
    if (name := getattr(specs, "key", None)) is not None:
        return name
    if not isinstance(specs, tuple):
        return digest(tuple(specs))
    if _last_specs[0] is not specs:
        _last_specs[:] = [specs, digest(specs)]
    return _last_specs[1]


def misfit(run: RunContext, scale: ModelScale | None) -> RunContext:
    """`run` as a policy whose model is wrong by `scale` sees it (module docstring). The router's
    move prices stay the run's: they are part of how the engines are driven, not of the split's
    choice."""
    if scale is None or scale.exact:
        return run
    pol = run.policy
    shared: dict[int, object] = {}  # engines laid out alike keep sharing one model, built once
    for e in run.engines:
        if id(e.costs) not in shared:
            shared[id(e.costs)] = scale.of_roles(e.costs)
    each = tuple(replace(e, costs=shared[id(e.costs)]) for e in run.engines)
    groups = None if pol.groups is None else tuple(replace(g, cost=scale.of(g.cost)) for g in pol.groups)
    return replace(run, costs=scale.of_roles(run.costs), engines=each, policy=replace(
        pol, cost=scale.of(pol.cost), layouts=None if pol.layouts is None else scale.of_roles(pol.layouts),
        groups=groups))


class _Watched:
    """A rehearsal's policy whose snapshots' lifecycle events are kept (calibration reads them)."""

    def __init__(self, inner, sink: list[LifecycleEvent]) -> None:
        self.inner, self.sink, self.name = inner, sink, inner.name

    def initial_roles(self, n_engines: int) -> list[Role]:
        return self.inner.initial_roles(n_engines)

    def decide(self, snapshot) -> Decision:
        self.sink.extend(snapshot.events)
        return self.inner.decide(snapshot)


def _roles(split) -> list[Role]:
    """Engine by engine, each group's (p, d, m) in turn."""
    return [role for counts in split for role, n in zip((Role.PREFILL, Role.DECODE, Role.MIXED), counts)
            for _ in range(n)]


class _Opening:
    """A rehearsal's roles, engine by engine, kept for the whole replay (a static split over groups)."""

    name = "static"

    def __init__(self, roles: list[Role]) -> None:
        self.roles = roles

    def initial_roles(self, n_engines: int) -> list[Role]:
        if len(self.roles) != n_engines:
            raise ValueError(f"a rehearsal's opening on {len(self.roles)} engines, the run has {n_engines}")
        return list(self.roles)

    def decide(self, snapshot) -> Decision:
        return Decision(targets={})


def future_run(run: RunContext, workload: Workload,
               simulate: Callable[..., Coroutine[Any, Any, Any]]) -> FutureRun | None:
    """`run` replayed on `workload`, the very trajectories it runs: with the same engines, router,
    cost model and seeds the replay is the run, so a split or a move it prices is priced exactly.
    None where engines differ in size, as for rehearser: a split of role counts names no engines."""
    if not run.engines_alike:
        return None
    total = run.expected

    def replay(opening: tuple[int, int, int], moves: Sequence[Move], first: int) -> float:
        cut = total is not None and total > first
        ctx, w = _cut(run, workload, first) if cut else (run, workload)
        with ThreadPoolExecutor(1) as pool:
            sim = pool.submit(lambda: run_virtual(simulate(ctx, Replay(opening, moves), workload=w))).result()
        return sim.makespan_s / max(sim.summary["trajectories_completed"], 1)

    return FutureRun(total, replay)


def _cut(run: RunContext, workload: Workload, first: int) -> tuple[RunContext, Workload]:
    """The run's opening `first` trajectories: an async run's first released, a sync run's first
    whole steps (or its first step's first prompts, whole groups)."""
    w = run.cfg.workload
    if w.mode == "sync":
        per_step = w.prompts * w.group_size
        steps = first // per_step
        w = (w.model_copy(update={"steps": steps}) if steps else
             w.model_copy(update={"steps": 1, "prompts": max(first // w.group_size, 1)}))
        if not steps:  # the workload draws a step's prompts from its own config
            workload = Workload(w, workload.seed, family=workload.family, trace=workload.trace)
    else:
        w = w.model_copy(update={"trajectories": first})
    return replace(run, cfg=run.cfg.model_copy(update={"workload": w})), workload
