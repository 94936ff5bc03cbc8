"""No channel to the future, in the Dask body: what the live controller hands the policy is built
only from what the scheduler could observe by then.

A live run is timed by the wall clock, so two runs never see the same interleaving and cannot be
compared decision by decision. What is compared instead is the code between the scheduler and the
policy, fed one observed history: the turns' task groups are built by the runtime's own code
(live/tasks.py, from the TurnRequests the agent loop makes of each trace), and a scheduler that
holds them (the task states and worker assignments the LifecyclePlugin and engine_loads read) is
walked through one sequence of transitions, the same for both traces up to the end of the decode
whose length differs. After every transition the real LiveController.observe() builds the
snapshot (through its one scheduler call, run here on that scheduler), and the policy, prorsa with
and without a prior, decides on it. The two traces differ in one turn's decode length and in the
turns after it, so its tasks carry different annotations from submission on (the replayed length,
whether the trajectory ends there); every snapshot, every EngineLoad field included, and every
decision must still be the same until that decode's end reaches the lifecycle events, and differ
there. Reading the replayed length early (counting it into an engine's KV, as the scheduler's
estimate of context + max_tokens used to) fails the test.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from prorsa.agent.loop import TurnRequest, TurnResult, run_trajectory
from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.agent.workload import context_budget
from prorsa.cluster import lifecycle_plugin
from prorsa.cluster.lifecycle_plugin import PLUGIN_NAME, LifecyclePlugin
from prorsa.config.pipeline import ExpectConfig, PipelineConfig
from prorsa.control.lifecycle import Phase
from prorsa.control.policy import make_policy
from prorsa.live import controller as live_controller
from prorsa.live.controller import ControlPace, EngineCapacity, LiveController
from prorsa.live.tasks import leg_graph, tool_graph
from prorsa.metrics.recorder import RunRecorder
from prorsa.roles import Role
from prorsa.rollout.context import policy_context
from prorsa.rollout.router import Route, Router

ENGINES = {"engine-0": "tcp://e0", "engine-1": "tcp://e1"}  # prefill, decode
TOOLS = "tcp://tool-0"
SLOTS, KV = 8, 1_000_000
CHANGED = ("x", 1)  # the trajectory and turn whose decode differs


def traces() -> tuple[list[TrajectorySpec], list[TrajectorySpec]]:
    """Three trajectories; in the second trace x's turn 1 decodes 900 tokens, not 120, and x goes on
    for a turn more instead of ending there."""
    def spec(tid, turns):
        return TrajectorySpec(traj_id=tid, family="trace", prompt_index=0, group_index=0, step=0,
                              turns=tuple(turns), seed=7)
    y = spec("y", [TurnSpec(800, 200, 0.5, False), TurnSpec(150, 260, 0.0, True)])
    z = spec("z", [TurnSpec(900, 180, 0.5, False), TurnSpec(120, 90, 0.5, False), TurnSpec(60, 40, 0.0, True)])
    a = spec("x", [TurnSpec(1000, 300, 0.5, False), TurnSpec(100, 120, 0.0, True)])
    b = spec("x", [TurnSpec(1000, 300, 0.5, False), TurnSpec(100, 900, 0.8, False), TurnSpec(50, 70, 0.0, True)])
    return [a, y, z], [b, y, z]


def turn_requests(specs: list[TrajectorySpec]) -> dict[tuple[str, int], TurnRequest]:
    """The TurnRequests the agent loop makes of each trajectory, as a runner is handed them."""
    got: dict[tuple[str, int], TurnRequest] = {}

    class Taking:
        needs_token_ids, vocab_size = False, 0

        async def run_turn(self, req: TurnRequest) -> TurnResult:
            got[req.traj_id, req.turn] = req
            return TurnResult(req.traj_id, req.turn, "engine-0", "engine-1", req.appended_tokens, 0,
                              req.decode_tokens)

    async def play():
        for s in specs:
            await run_trajectory(s, Taking(), lambda: 0.0)
    asyncio.run(play())
    return got


@dataclass(eq=False)
class Task:
    key: str
    annotations: dict
    processing_on: object = None


@dataclass(eq=False)
class Worker:
    name: str
    resources: dict
    processing: set = field(default_factory=set)


class Scheduler:
    """What the plugin and engine_loads read of a Dask scheduler: tasks, workers, plugins."""

    def __init__(self, plugin: LifecyclePlugin) -> None:
        self.tasks: dict[str, Task] = {}
        self.workers = {a: Worker(n, {"prefill": SLOTS} if n == "engine-0" else {"decode": SLOTS})
                        for n, a in ENGINES.items()} | {TOOLS: Worker("tool-0", {"env": 1})}
        self.plugins = {PLUGIN_NAME: plugin}
        self.plugin = plugin

    def submit(self, turn: TurnRequest, budget: int | None) -> None:
        """The turn's task group as the driver shape submits it (live/runtime.py)."""
        pf, df = leg_graph(turn, Route("engine-0", "engine-1"), ENGINES, budget=budget)
        tool = tool_graph(turn, pf, df, f"turn-{turn.traj_id}-{turn.turn}", 0.0, 0.0)
        for name, layer in tool.__dask_graph__().layers.items():
            self.tasks[name] = Task(name, dict(layer.annotations or {}))
        for key in (pf.key, df.key, tool.key):
            self.go(key, "released", "waiting")

    def go(self, key: str, start: str, finish: str, worker: str | None = None) -> None:
        ts = self.tasks[key]
        if finish == "processing":
            ts.processing_on = self.workers[worker]
            ts.processing_on.processing.add(ts)
        elif start == "processing":
            ts.processing_on.processing.discard(ts)
            ts.processing_on = None
        self.plugin.transition(key, start, finish)


class Client:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    async def run_on_scheduler(self, fn, *args):
        return fn(*args, dask_scheduler=self.scheduler)


def history() -> list[tuple[str, str, str]]:
    """One observed order of (trajectory, turn, stage) for both traces, to the end of x's turn-1
    decode: every turn 0 first, then turn 1, where x's decode runs while the others' end."""
    steps = []
    for tid in "xyz":
        steps += [(tid, 0, "submit"), (tid, 0, "prefill"), (tid, 0, "prefilled"), (tid, 0, "decode")]
    for tid in "xyz":
        steps += [(tid, 0, "decoded"), (tid, 0, "tool")]
    for tid in "xyz":
        steps += [(tid, 1, "submit"), (tid, 1, "prefill"), (tid, 1, "prefilled"), (tid, 1, "decode")]
    steps += [("y", 1, "decoded"), ("y", 1, "tool"), ("z", 1, "decoded"), ("z", 1, "tool"),
              ("z", 2, "submit"), ("z", 2, "prefill"), ("x", 1, "decoded")]
    return steps


def play(specs, cfg: PipelineConfig, clock: list[float]):
    """Walk the history on a scheduler holding these specs' tasks -> [(snapshot, decision)]."""
    turns, budget = turn_requests(specs), context_budget(cfg.workload)
    plugin = LifecyclePlugin(0.0)
    sched = Scheduler(plugin)
    asyncio.run(plugin.start(sched))
    policy = make_policy("prorsa", policy_context(cfg))
    roles = {"engine-0": Role.PREFILL, "engine-1": Role.DECODE}
    controller = LiveController(Client(sched), policy, Router(roles), ENGINES, RunRecorder(list(ENGINES), SLOTS, 3),
                                EngineCapacity(SLOTS, KV), ControlPace(0.0, interval_s=1.0))
    out = []
    for tid, k, stage in history():
        clock[0] += 0.25  # a transition observed every quarter second, in both histories alike
        key = f"{tid}-{k}"
        if stage == "submit":
            sched.submit(turns[tid, k], budget)
        elif stage == "prefill":
            sched.go(f"prefill-{key}", "waiting", "processing", ENGINES["engine-0"])
        elif stage == "prefilled":
            sched.go(f"prefill-{key}", "processing", "memory")
        elif stage == "decode":
            sched.go(f"decode-{key}", "waiting", "processing", ENGINES["engine-1"])
        elif stage == "decoded":
            sched.go(f"decode-{key}", "processing", "memory")
        else:
            sched.go(f"turn-{key}", "waiting", "processing", TOOLS)
            sched.go(f"turn-{key}", "processing", "memory")
        snap = asyncio.run(controller.observe())
        out.append((snap, policy.decide(snap)))
    return out


def pipeline(prior: bool) -> PipelineConfig:
    d = {"name": "nofuture", "seed": 1, "policy": "prorsa",
         "engines": {"backend": "emulated", "count": 2, "slots": SLOTS, "model": "qwen3-30b-a3b", "ep": 4},
         "workload": {"family": "swe", "mode": "sync", "prompts": 1, "group_size": 3}}
    if prior:
        d["prior"] = ExpectConfig(prompt_tokens=900, observation_tokens=120, decode_tokens=200, tool_s=0.5,
                                  turns=2.5).model_dump()
    return PipelineConfig.model_validate(d)


@pytest.mark.parametrize("prior", [False, True], ids=["no-prior", "prior"])
def test_the_live_snapshot_and_decision_are_alike_until_the_changed_decode_ends(monkeypatch, prior):
    clock = [1000.0]
    fake_time = SimpleNamespace(time=lambda: clock[0], perf_counter=time.perf_counter, thread_time=time.thread_time)
    monkeypatch.setattr(lifecycle_plugin, "time", fake_time)  # event times: the scripted clock
    monkeypatch.setattr(live_controller, "time", fake_time)  # the snapshot's time, too
    cfg = pipeline(prior)
    a_specs, b_specs = traces()
    a_turns, b_turns = turn_requests(a_specs), turn_requests(b_specs)
    assert a_turns[CHANGED].decode_tokens != b_turns[CHANGED].decode_tokens  # the traces do differ
    clock[0] = 1000.0
    a = play(a_specs, cfg, clock)
    clock[0] = 1000.0
    b = play(b_specs, cfg, clock)
    for i, ((sa, da), (sb, db)) in enumerate(zip(a[:-1], b[:-1])):
        assert sa.engines == sb.engines, f"step {i} {history()[i]}: the engines' loads differ"
        assert sa == sb, f"step {i} {history()[i]}"
        assert (da.targets, da.reason) == (db.targets, db.reason)
    # x's changed decode was on the decode engine, counted in its KV, for many of those steps
    on = [s.engines[1] for s, _ in a[:-1] if any(e.traj_id == "x" and e.turn == 1 and e.phase is Phase.DECODE
                                                  for e in s.events)]
    assert on and a[-2][0].engines[1].decode_legs == 1 and a[-2][0].engines[1].kv_tokens == 1000 + 300 + 100
    # its end is where they part: the tokens it came back with
    (ea,), (eb,) = ([e for e in s.events if e.traj_id == "x"] for s in (a[-1][0], b[-1][0]))
    assert ea.phase is eb.phase is Phase.TOOL and (ea.tokens, eb.tokens) == (120, 900)
