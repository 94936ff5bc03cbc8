"""The resolve step: a pipeline (config/, schema only) becomes the frozen RunContext both bodies run
from, once. What needs more than the schema to check (policies, cost-model profiles, rewards, a
trace's content) is checked here, and the values derived from the pipeline are computed here.

    load_run(path, overrides) -> RunContext   load_pipeline, then resolve: what a command starts from
    resolve(cfg[, source]) -> RunContext      the cross-checks (one ConfigError line naming the field),
                                              then the clock, engine costs and policy context
    check(cfg) -> list[str]                   the cross-checks alone: "field: problem" lines
    prior_checked(run, workload)              the run, told the prompts it opens with (the batch in
                                              hand, counted), its prior set aside if they contradict it
    make_router(ctx, roles, clock)            the Router of a run: engine -> role, runtime's routing settings
    make_scheduler(ctx[, future])             the TurnScheduler of a run (its scheduling: options;
                                              `future`: the simulator's, for scheduling.oracle)

The pieces a RunContext holds, for callers that need one alone:
    time_unit(cfg)        wall seconds per body second (emulated engines may run time-scaled)
    engine_costs(cfg)     RoleCosts: an engine's cost model in each role (engines.parallelism)
    update_seconds(cfg)   a weight update's stall in wall seconds: declared, or "auto" priced by bytes
    each_engine_costs(cfg)   RoleCosts of every engine, in engine order: its group's layout
                          (engines.groups); without groups every engine has engine_costs(cfg)
    engine_specs(cfg, costs) -> (EngineSpec, ...)   every engine's name, costs, slots, KV and
                          roles: RunContext.engines, what the bodies build their engines from
    policy_context(cfg)   the PolicyContext adaptive policies plan with
    prior_hint(cfg)       the pipeline's `prior:` as a WorkloadHint (an earlier run's measured
                          means, or declared ones), None without one; an earlier run's
                          trajectories themselves go to PolicyContext.prior_trajectories

Nothing here reads the run's own workload ahead: a policy learns it from the turns it observes,
and starts from the prior, if the pipeline gives one (the oracle's future is the simulator's).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from prorsa.agent.datasets.hf import DatasetError
from prorsa.agent.environment import dataset_tasks
from prorsa.agent.rewards import REWARDS, make_reward
from prorsa.agent.tools.registry import ToolLoadError, load_object
from prorsa.agent.trace import TraceError, TrajectorySpec, read_trace
from prorsa.agent.workload import Workload, context_budget
from prorsa.config.load import ConfigError, config_hash, load_pipeline
from prorsa.config.pipeline import PipelineConfig
from prorsa.control.prior_check import opening_contradiction
from prorsa.control.forecast_stats import Priors
from prorsa.control.policy import GroupShape, PolicyContext, WeightUpdates, WorkloadHint, make_policy
from prorsa.control.tail import RemainingWork, TurnScheduler
from prorsa.costmodel import CostModel, RoleCosts
from prorsa.engine.registry import backend_of, engine_name
from prorsa.metrics.prior import PriorError, prior_trajectories, read_prior
from prorsa.roles import Role
from prorsa.rollout.drivers import expected_trajectories
from prorsa.rollout.placement import MoveCost
from prorsa.rollout.router import Router
from prorsa.sampling import Sampling


@dataclass(frozen=True)
class EngineSpec:
    """One engine as both bodies build, size and price it; engines without groups are one group."""

    name: str  # engine/registry.py engine_name: the router's, the recorder's and the worker's
    costs: RoleCosts  # its cost model in each role (engines.groups: its group's layout)
    slots: int  # requests it admits at once
    kv_tokens: int  # KV it holds: every DP rank's, for an MoE engine under expert parallelism
    roles: tuple[Role, ...] | None  # the roles it may take, its opening one first; None: any


@dataclass(frozen=True)
class RunContext:
    """A pipeline resolved once; the bodies read these instead of deriving them again."""

    cfg: PipelineConfig
    unit: float  # wall seconds per body second (1 unless emulated engines run time-scaled)
    costs: RoleCosts  # an engine's cost model in each role (with engines.groups: the first group's)
    policy: PolicyContext  # what adaptive policies plan with (the prior included)
    engines: tuple[EngineSpec, ...] = ()  # every engine, in engine order
    switch: str = "in_place"  # how engines change role (engines.role_switch resolved): or "restart"

    @property
    def engine_costs(self) -> tuple[RoleCosts, ...]:
        return tuple(e.costs for e in self.engines)

    @property
    def engine_slots(self) -> tuple[int, ...]:
        return tuple(e.slots for e in self.engines)

    @property
    def engines_alike(self) -> bool:
        """Every engine free to take any role (no engines.groups): a split of role counts (P, D, M)
        names them; engines of declared roles are named one by one."""
        return all(e.roles is None for e in self.engines)

    def body_s(self, wall_s: float) -> float:
        """A duration the pipeline gives in wall seconds, in the body's (the cost model's) seconds."""
        return wall_s / self.unit

    # Derived from `cfg` when first read, so a run made with another cfg (dataclasses.replace: a
    # rehearsal's workload, a warm start's weights) derives its own: the bodies read these, not cfg.
    @cached_property
    def digest(self) -> str:
        """The pipeline's hash, which a run directory and its journal are stamped with."""
        return config_hash(self.cfg)

    @cached_property
    def update_s(self) -> float:
        """A weight update's stall in wall seconds (update_seconds)."""
        return update_seconds(self.cfg)

    @cached_property
    def context_budget(self) -> int | None:
        """The most context a trajectory reaches, in the tokens the run scales to (None: unbounded)."""
        return context_budget(self.cfg.workload)

    @cached_property
    def expected(self) -> int | None:
        """Trajectories the run will end with; None where an async run stops on a duration."""
        return expected_trajectories(self.cfg.workload)

    @cached_property
    def sampling(self) -> Sampling:
        return sampling_of(self.cfg)


def load_run(path: str | Path, overrides: dict[str, Any] | None = None) -> RunContext:
    return resolve(load_pipeline(path, overrides), path)


def resolve(cfg: PipelineConfig, source: str | Path | None = None) -> RunContext:
    problems = check(cfg)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"{source}: {problems[0]}{more}" if source is not None else problems[0] + more)
    each = each_engine_costs(cfg)
    return RunContext(cfg, time_unit(cfg), each[0], policy_context(cfg), engine_specs(cfg, each),
                      backend_of(cfg.engines).switch_path())


def engine_specs(cfg: PipelineConfig, costs: tuple[RoleCosts, ...]) -> tuple[EngineSpec, ...]:
    roles = engine_roles(cfg) or (None,) * len(costs)
    return tuple(EngineSpec(engine_name(i), c, n, c.mixed.kv_capacity_tokens() * c.mixed.ep, r)
                 for i, (c, n, r) in enumerate(zip(costs, engine_slots(cfg), roles)))


def check(cfg: PipelineConfig) -> list[str]:
    """What the schema cannot know: every name resolves to a profile, policy, reward, user tool,
    trainer or readable trace (a user's `package.module:name` is imported here, as the tool workers
    and the learner will)."""
    return [p for p in (_profiles(cfg), _policy(cfg), _reward(cfg), _user_tools(cfg), _trainer(cfg), _trace(cfg),
                        _prior(cfg), _dashboard(cfg), _hf_dataset(cfg), _role_switch(cfg)) if p]


def _role_switch(cfg: PipelineConfig) -> str | None:
    try:
        backend_of(cfg.engines).switch_path()
    except ValueError as err:  # in_place on a vLLM that no longer takes kv_both
        return str(err)
    return None


def restart_price(cfg: PipelineConfig) -> float | None:
    """What the cost model charges a switch by restart (engines.restart_s), None where every
    switch is in place. Resolved again wherever a cost model is made: kv_roles reads a file."""
    return cfg.engines.restart_s if backend_of(cfg.engines).switch_path() == "restart" else None


def _trainer(cfg: PipelineConfig) -> str | None:
    """A trainer that does not import or lacks a method fails here, not after the engines started."""
    if cfg.train is None or cfg.train.trainer is None:
        return None
    from prorsa.train.protocol import load_trainer_class  # torch: only for a pipeline that names one

    try:
        load_trainer_class(cfg.train.trainer)
    except ValueError as err:
        return f"train.trainer: {err}"
    return None


def _hf_dataset(cfg: PipelineConfig) -> str | None:
    """Read a Hugging Face dataset's tasks now: a column the mapping names and the data lacks is
    the pipeline's mistake, found before the cluster starts."""
    env = cfg.environment
    if env is None or env.columns is None:
        return None
    try:
        dataset_tasks(env, cfg.seed)
    except DatasetError as err:
        return f"environment.{err}"
    return None


def _prior(cfg: PipelineConfig) -> str | None:
    if isinstance(cfg.prior, str):
        try:
            read_prior(cfg.prior)
        except PriorError as err:
            return f"prior: {err}"
    return None


def _profiles(cfg: PipelineConfig) -> str | None:
    e = cfg.engines
    for i, g in enumerate(e.engine_groups if e.groups is not None else ()):
        try:
            cost = CostModel.from_names(e.gpu, e.model, tp=g.tp, ep=g.ep)
        except ValueError as err:
            return f"engines.groups[{i}]: {err}"
        if g.vllm is not None and g.vllm.expert_parallel and not cost.model.is_moe:
            return f"engines.groups[{i}].enable_expert_parallel: {e.model} is dense, it has no experts to spread"
    roles = ("prefill", "decode", "mixed") if e.parallelism is not None else ()
    vllm_layout = backend_of(e).vllm_layout
    for role, (tp, ep) in [(None, (e.tp, e.ep)), *((r, e.layout(r)) for r in roles)]:
        try:
            cost = CostModel.from_names(e.gpu, e.model, tp=tp, ep=ep)
        except ValueError as err:
            if vllm_layout:  # tp and ep were derived from the vLLM layout: name what was written
                return f"engines.vllm: data_parallel_size {e.vllm.data_parallel_size} (the cost model's ep): {err}"
            return f"engines: {'' if role is None else f'parallelism.{role}: '}{err}"
        if vllm_layout and e.vllm.enable_expert_parallel and not cost.model.is_moe:
            return f"engines.vllm.enable_expert_parallel: {e.model} is dense, it has no experts to spread"
    return None


def _policy(cfg: PipelineConfig) -> str | None:
    groups = cfg.engines.groups is not None
    if groups and cfg.policy.startswith("static:"):
        return (f"policy: {cfg.policy} with engines.groups: a static split's roles are the groups' opening "
                "roles (each group's first); write policy: static")
    try:
        policy = make_policy(cfg.policy, replace(PolicyContext.default(), engine_roles=engine_roles(cfg)))
    except ValueError as err:
        return f"policy: got {cfg.policy!r}; expected: {err}"
    try:
        policy.initial_roles(cfg.engines.count)
    except ValueError as err:
        return f"engines.count: {err}"
    return None


def _reward(cfg: PipelineConfig) -> str | None:
    reward = cfg.environment.reward if cfg.environment is not None else None
    if reward is None or reward in REWARDS:
        return None
    if ":" not in reward:
        return f"environment.reward: unknown reward {reward!r}; expected one of {sorted(REWARDS)} or 'package.module:fn'"
    try:
        make_reward(reward)
    except ValueError as err:  # ToolLoadError included: the module or the name is not there
        return f"environment.reward: {err}"
    return None


def _user_tools(cfg: PipelineConfig) -> str | None:
    for spec in cfg.environment.tools if cfg.environment is not None else ():
        if ":" in spec:
            try:
                load_object(spec)
            except ToolLoadError as err:
                return f"environment.tools: {err}"
    return None


def _trace(cfg: PipelineConfig) -> str | None:
    """Read the trace now: a bad line found after the cluster is up would cost its start-up."""
    trace = cfg.workload.trace
    if not trace:
        return None
    try:
        if not read_trace(trace):
            raise TraceError(f"{trace}: the trace holds no trajectories")
    except TraceError as err:
        return f"workload.trace: {err}"
    return None


def _dashboard(cfg: PipelineConfig) -> str | None:
    """The dashboard's address must be one this machine can listen on, or the cluster's start
    fails later with an error that seems to be about the engines."""
    address = cfg.runtime.dashboard_address
    if address is None:
        return None
    host, sep, port = address.rpartition(":")
    host = host.strip("[]") if sep else address
    if not sep or not port.isdigit() or int(port) > 65535:
        return f"runtime.dashboard_address: got {address!r}; expected HOST:PORT, e.g. 127.0.0.1:8787 (port 0: any free one)"
    try:
        socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as err:
        return f"runtime.dashboard_address: host {host!r} does not resolve ({err})"
    return None


def time_unit(cfg: PipelineConfig) -> float:
    """Wall seconds per body second: emulated engines run the cost model's time scaled."""
    scale = cfg.engines.time_scale if backend_of(cfg.engines).time_scaled else 1.0
    return scale if scale > 0 else 1.0


def engine_costs(cfg: PipelineConfig) -> RoleCosts:
    e, restart_s = cfg.engines, restart_price(cfg)
    base = CostModel.from_names(e.gpu, e.model, tp=e.tp, ep=e.ep, restart_s=restart_s)
    if e.parallelism is None:
        return RoleCosts.uniform(base)
    # one model per distinct layout: roles laid out alike share it, so they never reshard
    models = {base.layout: base}
    for role in ("prefill", "decode", "mixed"):
        tp, ep = e.layout(role)
        if (tp, ep) not in models:
            models[tp, ep] = CostModel.from_names(e.gpu, e.model, tp=tp, ep=ep, restart_s=restart_s)
    return RoleCosts(*(models[e.layout(role)] for role in ("prefill", "decode", "mixed")))


def each_engine_costs(cfg: PipelineConfig) -> tuple[RoleCosts, ...]:
    e = cfg.engines
    if e.groups is None:
        return (engine_costs(cfg),) * e.count
    # a group's engines share one model; groups laid out alike share it too
    models: dict[tuple[int, int], RoleCosts] = {}
    restart_s = restart_price(cfg)
    for g in e.engine_groups:
        if (g.tp, g.ep) not in models:
            models[g.tp, g.ep] = RoleCosts.uniform(CostModel.from_names(e.gpu, e.model, tp=g.tp, ep=g.ep,
                                                                        restart_s=restart_s))
    return tuple(models[g.tp, g.ep] for g in e.engine_groups for _ in range(g.count))


def engine_slots(cfg: PipelineConfig) -> tuple[int, ...]:
    return tuple(g.slots for g in cfg.engines.engine_groups for _ in range(g.count))


def engine_roles(cfg: PipelineConfig) -> tuple[tuple[Role, ...], ...] | None:
    """The roles each engine may take, its opening one first (engines.groups); None: any role."""
    if cfg.engines.groups is None:
        return None
    return tuple(tuple(Role(r) for r in g.roles) for g in cfg.engines.engine_groups for _ in range(g.count))


def policy_context(cfg: PipelineConfig) -> PolicyContext:
    layouts = each_engine_costs(cfg)[0]
    cost = layouts.mixed
    # an MoE engine under expert parallelism is a DP-attention group: KV of every rank
    return PolicyContext(cost=cost, slots=engine_slots(cfg)[0], kv_capacity_tokens=cost.kv_capacity_tokens() * cost.ep,
                         interval_s=cfg.runtime.control_interval_s / time_unit(cfg), prior=prior_hint(cfg),
                         concurrency=concurrency(cfg), asynchronous=cfg.workload.mode == "async",
                         layouts=None if layouts.is_uniform else layouts,
                         prior_trajectories=prior_trajectories(cfg.prior) if isinstance(cfg.prior, str) else (),
                         engine_roles=engine_roles(cfg), groups=group_shapes(cfg), updates=weight_updates(cfg),
                         max_turns=cfg.workload.max_turns)


def update_seconds(cfg: PipelineConfig) -> float:
    """Wall seconds a weight update stalls the engines: workload.weight_update_s as declared, or for
    "auto" the cost model's price of moving every weight of an engine over its node's link."""
    declared = cfg.workload.weight_update_s
    if declared != "auto":
        return declared
    return engine_costs(cfg).mixed.weight_update_time() * time_unit(cfg)


def weight_updates(cfg: PipelineConfig) -> WeightUpdates | None:
    """An asynchronous run's weight updates as declared (synchronous ones fall between steps)."""
    w = cfg.workload
    if w.mode != "async" or update_seconds(cfg) <= 0:
        return None
    if w.weight_update_every_s is not None:
        return WeightUpdates(every_s=w.weight_update_every_s / time_unit(cfg))
    return WeightUpdates(every_trajectories=w.prompts * w.group_size)


def group_shapes(cfg: PipelineConfig) -> tuple[GroupShape, ...] | None:
    """Each engine group as the policy prices it (its own layout, slots and KV); None without groups."""
    if cfg.engines.groups is None:
        return None
    out, restart_s = [], restart_price(cfg)
    for g in cfg.engines.engine_groups:
        cost = CostModel.from_names(cfg.engines.gpu, cfg.engines.model, tp=g.tp, ep=g.ep, restart_s=restart_s)
        out.append(GroupShape(g.count, tuple(Role(r) for r in g.roles), cost, g.slots,
                              cost.kv_capacity_tokens() * cost.ep))
    return tuple(out)


def concurrency(cfg: PipelineConfig) -> int:
    """Trajectories in flight, as the pipeline declares them (sync: a whole step)."""
    w = cfg.workload
    return w.prompts * w.group_size if w.mode == "sync" else w.concurrency


def sampling_of(cfg: PipelineConfig) -> Sampling:
    """The pipeline's `sampling:` as the record a turn carries to its engine."""
    return Sampling(**cfg.sampling.model_dump())


def prior_hint(cfg: PipelineConfig) -> WorkloadHint | None:
    prior = cfg.prior
    if prior is None:
        return None
    means = read_prior(prior) if isinstance(prior, str) else prior
    return WorkloadHint(concurrency=concurrency(cfg), **means.model_dump())


def prior_checked(run: RunContext, workload: Workload) -> RunContext:
    """`run`, its prior set aside (for the policy, the router and the scheduler alike) when the
    prompts `workload` opens with contradict it (control/prior_check.py opening_contradiction); the
    run then opens as it would with no prior, and PolicyContext.prior_dropped says why. The prompts
    go to the policy either way (PolicyContext.opening_prompts): the batch in hand, counted."""
    prompts = tuple(workload.opening_prompts())
    run = replace(run, policy=replace(run.policy, opening_prompts=prompts))
    if run.policy.prior is None:
        return run
    why = opening_contradiction(run.policy.prior, prompts)
    if not why:
        return run
    why = f"{why.removesuffix('; ')} in the {len(prompts)} prompts the run opens with"
    return replace(run, policy=replace(run.policy, prior=None, prior_trajectories=(), prior_dropped=why))


def make_router(ctx: RunContext, roles: dict[str, Role], clock: Callable[[], float]) -> Router:
    """`clock`: the run's body seconds (live: wall seconds over the time unit)."""
    e, r = ctx.cfg.engines, ctx.cfg.runtime
    move_cost = engine_prices = None
    if r.sticky_overload == "cost":  # priced as the mixed role's layout, as the allocator plans
        prior = ctx.policy.prior
        decode = prior.decode_tokens if prior else Priors().decode_tokens
        move_cost = MoveCost(ctx.costs.mixed, e.slots, decode)
        if e.groups is not None:  # each engine priced by its own group's layout and slots
            shared: dict[tuple, MoveCost] = {}
            engine_prices = {}
            for name, spec in zip(roles, ctx.engines):
                key = (spec.costs.mixed.layout, spec.slots)
                engine_prices[name] = shared.setdefault(key, MoveCost(spec.costs.mixed, spec.slots, decode))
    slots = e.slots if e.groups is None else dict(zip(roles, ctx.engine_slots))
    return Router(roles, overload=r.sticky_overload, local_prefill_tokens=r.local_prefill_tokens, slots=slots,
                  move_cost=move_cost, clock=clock, engine_prices=engine_prices,
                  mixed_exports_kv=ctx.switch == "in_place")


def make_scheduler(ctx: RunContext, future: Callable[[str], TrajectorySpec] | None = None) -> TurnScheduler:
    """Its decode mean starts from the prior's, as the router's does, and an earlier run's
    trajectories (a prior run directory) give it their turn counts; max_turns and the context
    budget (the task family's cap in the tokens the run scales to, or max_context if tighter) are
    declared."""
    prior, w = ctx.policy.prior, ctx.cfg.workload
    work = RemainingWork(w.max_turns, prior.decode_tokens if prior else Priors().decode_tokens,
                         max_context=ctx.context_budget)
    work.learn_from(ctx.policy.prior_trajectories)
    s = ctx.cfg.scheduling
    if s.oracle and future is None:
        raise ConfigError("scheduling.oracle reads the workload's future: the simulator's alone (prorsa sim)")
    if s.tail_layout and future is None:
        raise ConfigError("scheduling.tail_layout merges engines into a wider tensor-parallel layout, which a "
                          "live vLLM engine cannot take without a restart: the simulator's alone (prorsa sim)")
    return TurnScheduler(work, priority=s.priority, spread=s.spread, future=future if s.oracle else None,
                         migrate=s.migrate, tail=s.tail_layout)
