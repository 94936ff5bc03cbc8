"""The policy contract: how engine roles are chosen.

A policy is a pure function of a snapshot (no clock, no I/O, no engine handles): the live Dask
plugin and the simulator each build the snapshot and carry out the decision, so one policy object
runs in both bodies.

    initial_roles(n_engines)   once, before the first turn: the roles engines start in
    decide(snapshot)           every control interval: a target role map (possibly unchanged)

Register a policy with `@register("name", args=Record)`; the pipeline names it as `policy: name[:args]`
or a mapping, both parsed into the record (config/policies.py) and checked as the pipeline is read.
`make_policy(spec, context)` builds one; a factory that takes `context` gets the PolicyContext
(what one engine is: cost model, slots, KV capacity, and the control interval).
The built-in adaptive policies (`reactive`, `prorsa`) live in control/adaptive.py and are loaded
on the first make_policy call.

Engine groups (engines.groups, PolicyContext.engine_roles): every policy is held to the roles each
engine may take (WithinGroups): an opening role the engine may not take becomes its group's opening
role (colocated: mixed wherever a group allows it), and a target it may not take is dropped, so no
switch ever leaves a group's roles. `static` with no split opens every engine in its group's
opening role. `prorsa` plans over the groups (control/adaptive_groups.py): its splits are role
counts per group, priced with each group's own cost model and slots (control/group_search.py) and
rehearsed engine by engine (sim/rehearse.py); `reactive` and the oracle still plan as if every
engine were the first group's, their decisions clipped to the groups' roles.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol, Sequence

from prorsa.agent.trace import TrajectorySpec
from prorsa.config.engines import MAX_ENGINES
from prorsa.config.policies import POLICY_ARGS, NoArgs, PolicyArgs, StaticArgs, parse_policy
from prorsa.control.forecast import ForecastSummary
from prorsa.control.lifecycle import LifecycleEvent
from prorsa.costmodel import CostModel, RoleCosts
from prorsa.engine.registry import engine_name
from prorsa.loads import EngineLoad
from prorsa.roles import Role


RECENT_FINISHED = 1024  # completed trajectories a decide snapshot carries, the most recent


@dataclass(frozen=True)
class Snapshot:
    time_s: float  # seconds since the rollout began (the body's clock)
    engines: tuple[EngineLoad, ...]  # each engine as the body sees it now (prorsa/loads.py)
    trajectories_by_state: dict[str, int] = field(default_factory=dict)  # lifecycle state -> count
    events: tuple[LifecycleEvent, ...] = ()  # lifecycle events since the previous decide()
    # trajectories as they ran (observed appends, decodes and tool times, in body seconds): to
    # between_steps, the step that just ended; to decide, the most recent to have completed
    # (up to RECENT_FINISHED, oldest first)
    finished: tuple[TrajectorySpec, ...] = ()
    # switches under way: engine -> the role it is becoming. A draining engine reports the role it
    # serves meanwhile (mixed), for as long as its decodes take to finish.
    heading: dict[str, Role] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    targets: dict[str, Role]  # engine_id -> wanted role; engines not named keep theirs
    reason: str = ""  # why, for the decision log
    forecast: ForecastSummary | None = None  # the demand that justified it (a PlanSummary: and the plan)
    forecast_error: dict[str, float] = field(default_factory=dict)  # MAPE per horizon bin, e.g.
    # "prefill_tps@0-0.5s"; only policies that forecast fill it


@dataclass(frozen=True)
class WorkloadHint:
    """A workload as means over its trajectories: enough to plan a split for its steady state
    (never the split itself). A policy gets one as a prior (an earlier run's, or what the pipeline
    declares: PolicyContext.prior), learns one from the turns it observes, and only the oracle
    gets the run's own (PolicyContext.future_means)."""

    concurrency: int  # trajectories in flight (sync: B x G; async: concurrency)
    prompt_tokens: float  # the first turn's append
    observation_tokens: float  # a later turn's append
    decode_tokens: float  # per turn
    tool_s: float  # per tool call, body seconds
    turns: float  # per trajectory


@dataclass(frozen=True)
class WeightUpdates:
    """An asynchronous run's weight updates as the pipeline declares them: each stalls the engines
    and empties every prefix cache, so each trajectory's next turn prefills its whole context."""

    every_s: float | None = None  # body seconds between two (a trainer on a clock) ...
    every_trajectories: int | None = None  # ... or one per this many finished (a batch)

    def period_s(self, completions_per_s: float) -> float:
        """Seconds between two updates, at `completions_per_s` finished trajectories a second."""
        if self.every_s is not None:
            return self.every_s
        return (self.every_trajectories or 0) / max(completions_per_s, 1e-9)


# (trajectories, (prefill, decode, mixed) engines, or with engine groups one such per group) -> the
# makespan, body seconds, of replaying the
# trajectories as one synchronous step on the run's engines in that split: the simulator, which the
# body lends the policy (control/ never imports it); tool times in body seconds
Rehearse = Callable[[Sequence[TrajectorySpec], tuple], float]

# A switch of a replayed run: at the first `hook` call ("decide" or "between_steps") at or after
# `time_s` (body seconds), the engines named take those roles (Replay carries it out).
Move = tuple[str, float, tuple[tuple[str, Role], ...]]


@dataclass(frozen=True)
class FutureRun:
    """The run itself, replayable from its start in the simulator: its own trajectories, mode,
    concurrency, releases, steps and weight updates, as they will be. It is the run's future, so
    only the oracle is given it (PolicyContext.future_run), and only the simulator can give it.

    replay(opening, moves, first) -> body seconds per completed trajectory (lower is better: a
    synchronous run's makespan over the count it fixes, an asynchronous run's inverse throughput)
    of the run opening in the split `opening` (prefill, decode, mixed engines, in that order) and
    making `moves`; a run of more than `first` trajectories is cut to its first `first`. Always
    the whole run: one stopped early once behind a bound (a timer on the virtual clock) did not
    end as the run does, and ranked splits wrongly."""

    trajectories: int | None  # the run's, every step (None: an asynchronous run that stops on a duration)
    replay: Callable[[tuple[int, int, int], Sequence[Move], int], float]


@dataclass(frozen=True)
class GroupShape:
    """One engine group as a policy sees it (engines.groups): its engines are alike."""

    count: int  # engines in the group, in engine order after the previous groups'
    roles: tuple[Role, ...]  # the roles they may take, the opening one first
    cost: CostModel  # step times of one of them
    slots: int  # concurrent sequences one admits
    kv_capacity_tokens: int  # KV tokens one holds


@dataclass(frozen=True)
class PolicyContext:
    """What an adaptive policy knows about the engines it steers (all engines alike)."""

    cost: CostModel  # step times of one engine (in the mixed role, where roles differ in layout)
    slots: int  # concurrent sequences one engine admits
    kv_capacity_tokens: int  # KV tokens one engine holds
    interval_s: float  # seconds between decide() calls
    # traj_id -> the trajectory's whole spec: the future, which only a simulator can give (oracle)
    future: Callable[[str], TrajectorySpec] | None = None
    prior: WorkloadHint | None = None  # what the run may assume before it observes (pipeline `prior:`)
    prior_dropped: str = ""  # why the pipeline's prior was set aside before the run opened ("": it was not)
    future_means: WorkloadHint | None = None  # the run's own means: the oracle's alone, like `future`
    concurrency: int = 0  # trajectories in flight as the pipeline declares them (sync: B x G)
    asynchronous: bool = False  # workload.mode async: `concurrency` kept in flight, one started as one ends
    prior_trajectories: tuple[TrajectorySpec, ...] = ()  # an earlier run's, as they ran (a prior run dir)
    rehearse: Rehearse | None = None  # None: the body lends no simulator; plan with the fluid model alone
    layouts: RoleCosts | None = None  # per-role cost models (engines.parallelism); None: `cost` in every role
    # per engine, the roles it may take, its opening role first (engines.groups); None: any role
    engine_roles: tuple[tuple[Role, ...], ...] | None = None
    future_run: FutureRun | None = None  # the run itself to replay: the oracle's alone, like `future`
    groups: tuple[GroupShape, ...] | None = None  # engines.groups, each priced as itself; None: engines alike
    # the prompt tokens of the trajectories the run opens with, counted before any prefill (the batch
    # in hand); () where the body cannot count them (a live environment, an open-ended server)
    opening_prompts: tuple[int, ...] = ()
    updates: WeightUpdates | None = None  # an asynchronous run's declared weight updates; None: none
    max_turns: int | None = None  # the pipeline's cap on a trajectory's turns (None: each family's own)

    @classmethod
    def default(cls) -> PolicyContext:
        """An H200 serving Qwen3-8B, 16 slots, a 1 s interval: for specs checked without a run."""
        cost = CostModel.from_names("h200", "qwen3-8b")
        return cls(cost=cost, slots=16, kv_capacity_tokens=cost.kv_capacity_tokens(), interval_s=1.0)


class Policy(Protocol):
    name: str

    def initial_roles(self, n_engines: int) -> list[Role]: ...

    def decide(self, snapshot: Snapshot) -> Decision: ...

    # Optional: between two synchronous steps, when no trajectory is in flight and a switch costs
    # no drain, the roles for the next step (ControlLoop.before_step carries them out at once).
    # def between_steps(self, snapshot: Snapshot) -> Decision: ...


POLICIES: dict[str, Callable[..., Policy]] = {}


def register(name: str, args: type[PolicyArgs] | None = None) -> Callable[[Callable[..., Policy]], Callable[..., Policy]]:
    """A policy factory under `name`. With `args` (a config.policies.PolicyArgs record), the
    factory is given the record, parsed from the shorthand or a pipeline's mapping and checked;
    without, the shorthand's strings as positional arguments."""
    def deco(factory: Callable[..., Policy]) -> Callable[..., Policy]:
        POLICIES[name] = factory
        if args is not None:
            POLICY_ARGS[name] = args
        return factory

    return deco




def _finite(arg: str) -> bool:
    try:
        return math.isfinite(float(arg))
    except ValueError:
        return True  # not a number: the policy's own parser says what it expected


def make_policy(spec: str | Mapping[str, Any], context: PolicyContext | None = None) -> Policy:
    """`colocated`, `static:2:1`, `reactive`, `prorsa:4`, {"name": "prorsa", "horizon_s": 4} ...
    -> a policy object. Policies that take a context get `context` (None: they build
    PolicyContext.default())."""
    # Registers reactive, prorsa and oracle; imported here, not at the top, as they import this module.
    import prorsa.control.adaptive  # noqa: F401, PLC0415
    import prorsa.control.adaptive_groups  # noqa: F401, PLC0415  (prorsa over engine groups)
    import prorsa.control.oracle  # noqa: F401, PLC0415

    name = spec.get("name") if isinstance(spec, Mapping) else spec.split(":")[0]
    if name not in POLICIES:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown policy {name!r}; known: {known}")
    factory = POLICIES[name]
    try:
        _, typed = parse_policy(spec)
    except ValueError as e:
        raise ValueError(f"bad policy {_shown(spec)!r}: {e}") from None
    args = (typed,) if typed is not None else tuple(str(spec).split(":")[1:])
    if typed is None and not all(_finite(a) for a in args):
        raise ValueError(f"bad policy {spec!r}: its numbers must be finite")
    kwargs = {"context": context} if "context" in inspect.signature(factory).parameters else {}
    try:
        policy = factory(*args, **kwargs)
    except (TypeError, ValueError) as e:
        usage = POLICIES[name].__doc__.strip().split("\n\n")[0] if POLICIES[name].__doc__ else ""
        usage = " ".join(usage.split())  # the first paragraph, unwrapped
        raise ValueError(f"bad policy {_shown(spec)!r}: {usage}") from e
    if context is not None and context.engine_roles is not None:
        return WithinGroups(policy, context.engine_roles)
    return policy


def _shown(spec: str | Mapping[str, Any]) -> str:
    return spec if isinstance(spec, str) else str(dict(spec))


class _FixedRoles:
    """Roles set once; decide() never changes them."""

    name: str
    roles: list[Role]

    def initial_roles(self, n_engines: int) -> list[Role]:
        if self.roles is None:
            raise ValueError("static with no split takes its roles from engines.groups; "
                             "without groups write static:P:D[:M]")
        if len(self.roles) != n_engines:
            raise ValueError(f"policy {self.name} assigns {len(self.roles)} engines, the run has {n_engines}")
        return list(self.roles)

    def decide(self, snapshot: Snapshot) -> Decision:
        return Decision(targets={})


class Replay:
    """Roles set to `opening` (prefill, decode, mixed engines, in that order), then switched by
    `moves` at their times: a run the oracle has already made, and a move it weighs, replayed
    (FutureRun). Not registered: a pipeline cannot name it. Its between_steps (which returns no
    targets unless a move is due) keeps the step boundaries' bookkeeping what the oracle's was."""

    def __init__(self, opening: tuple[int, int, int], moves: Sequence[Move] = ()) -> None:
        p, d, m = opening
        self.name = "replay"
        self.roles = [Role.PREFILL] * p + [Role.DECODE] * d + [Role.MIXED] * m
        self._moves = sorted(moves, key=lambda mv: mv[1])

    def initial_roles(self, n_engines: int) -> list[Role]:
        if len(self.roles) != n_engines:
            raise ValueError(f"a replay opening on {len(self.roles)} engines, the run has {n_engines}")
        return list(self.roles)

    def _due(self, hook: str, snapshot: Snapshot) -> Decision:
        if self._moves and self._moves[0][0] == hook and self._moves[0][1] <= snapshot.time_s:
            _, t, targets = self._moves.pop(0)
            return Decision(dict(targets), f"replayed move of {t:.3f} s")
        return Decision(targets={})

    def decide(self, snapshot: Snapshot) -> Decision:
        return self._due("decide", snapshot)

    def between_steps(self, snapshot: Snapshot) -> Decision:
        return self._due("between_steps", snapshot)


@register("colocated", args=NoArgs)
class Colocated(_FixedRoles):
    """Every engine does both phases (chunked prefill co-batched with decode): the baseline."""

    def __init__(self, args: NoArgs | None = None) -> None:
        self.name = "colocated"
        self.roles = []

    def initial_roles(self, n_engines: int) -> list[Role]:
        return [Role.MIXED] * n_engines


@register("static", args=StaticArgs)
class Static(_FixedRoles):
    """static:P:D[:M], a fixed split of P prefill, D decode and M mixed engines (P, D >= 1, or
    M >= 1); with engines.groups, `static` alone: each group's opening role."""

    def __init__(self, args: StaticArgs | None = None) -> None:
        args = args or StaticArgs()
        if args.prefill is None or args.decode is None:
            self.name, self.roles = "static", None  # the groups' opening roles (WithinGroups)
            return
        p, d, m = args.prefill, args.decode, args.mixed
        # with no prefill engine the mixed ones prefill for the decode engines (rollout/router.py)
        if (m == 0 and (p == 0 or d == 0)) or p + d + m > MAX_ENGINES:  # negatives: StaticArgs
            raise ValueError("a static split needs a prefill and a decode engine, or mixed ones")
        self.name = f"static:{p}:{d}" + (f":{m}" if m else "")
        self.roles = [Role.PREFILL] * p + [Role.DECODE] * d + [Role.MIXED] * m


class WithinGroups:
    """A policy held to each engine's roles (engines.groups): what it opens with and every target
    it sets, an engine's disallowed role replaced by its group's opening one, or dropped."""

    def __init__(self, inner: Policy, allowed: Sequence[Sequence[Role]]) -> None:
        if isinstance(inner, Static) and inner.roles is not None:
            raise ValueError(f"{inner.name} with engine groups: a static split's roles are the groups' "
                             "opening roles (each group's first); use static")
        self.inner = inner
        self.allowed = [tuple(a) for a in allowed]
        self.name = inner.name
        self._allowed_of = {engine_name(i): a for i, a in enumerate(self.allowed)}

    def __getattr__(self, name: str):  # what else a body or a report reads of the policy
        if name == "inner":  # not set yet (a copy being unpickled): no lookup through itself
            raise AttributeError(name)
        found = getattr(self.inner, name)
        if name == "between_steps":  # present only where the inner policy has it, and clipped too
            return lambda snapshot: self._clip(found(snapshot), snapshot)
        return found

    def initial_roles(self, n_engines: int) -> list[Role]:
        if len(self.allowed) != n_engines:
            raise ValueError(f"the groups declare {len(self.allowed)} engines, the run has {n_engines}")
        if isinstance(self.inner, Static) and self.inner.roles is None:
            return [a[0] for a in self.allowed]
        if isinstance(self.inner, Colocated):  # both phases wherever a group allows it
            return [Role.MIXED if Role.MIXED in a else a[0] for a in self.allowed]
        return [r if r in a else a[0] for r, a in zip(self.inner.initial_roles(n_engines), self.allowed)]

    def decide(self, snapshot: Snapshot) -> Decision:
        return self._clip(self.inner.decide(snapshot), snapshot)

    def _clip(self, decision: Decision, snapshot: Snapshot | None = None) -> Decision:
        if not decision.targets:
            return decision
        kept = {e: r for e, r in decision.targets.items() if r in self._allowed_of.get(e, ())}
        if len(kept) == len(decision.targets):
            return decision
        dropped = len(decision.targets) - len(kept)
        reason = f"{decision.reason}; {dropped} target(s) outside their group's roles dropped".lstrip("; ")
        return replace(decision, targets=kept, reason=reason)
