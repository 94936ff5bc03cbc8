"""The scheduler's view of every trajectory: lifecycle events read off task transitions.

    LifecyclePlugin(started_wall, unit)  a SchedulerPlugin; register it before the first turn;
                                         event times are (wall - started) / unit: body seconds
    drain_events(dask_scheduler)         run_on_scheduler: the events since the last call
    engine_loads(dask_scheduler)         run_on_scheduler: per engine worker, what it holds now
    observe(dask_scheduler)              both in one call: what a control interval reads
    observe_and_publish(report, dask_scheduler)   run_on_scheduler, the controller's one call per
                                         interval: observe(), and the driver's `report` with what
                                         was observed handed to every scheduler plugin that folds
                                         it (a Subscriber: the dashboard's), in the same call

A turn's tasks carry annotations (traj, turn, family, phase, append, max_tokens (the reply's cap),
context, done; replay_tokens on a replayed decode leg; see tasks.py), and their transitions are
the lifecycle:

    first leg released -> waiting         QUEUED   (tokens: the append)
    prefill  -> processing                PREFILL  (engine: the worker it was sent to)
    decode / generate -> processing       DECODE
    decode / generate -> memory           TOOL     (tokens: the tokens the decode generated)
    tool (turn task) -> memory, done      DONE

No future. A replayed decode generates exactly its replay_tokens (ignore_eos): the world's
length, which a real run learns when the reply comes back. So the plugin reads it only off a
decode leg that has finished (-> memory), as the count the result holds. A live model's decode
carries none: its TOOL event counts the cap, the most it can have generated (the result's own
length would need the result). What an engine holds (engine_loads) counts only what has been
written by then that the scheduler can see: each decode leg's context.

The hook runs inside the scheduler's transition engine on every transition, so it does a dict
lookup and returns for every task that is not a turn leg, and appends a tuple for those that are.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol, runtime_checkable

from distributed.diagnostics.plugin import SchedulerPlugin

from prorsa.control.lifecycle import LifecycleEvent, Phase
from prorsa.loads import EngineLoad
from prorsa.roles import Role
from prorsa.rollout.legs import DECODE_LEGS, FIRST_LEGS

PLUGIN_NAME = "prorsa-lifecycle"

log = logging.getLogger(__name__)


@runtime_checkable
class Subscriber(Protocol):
    """A scheduler plugin that folds each interval's observation and the driver's report."""

    def fold(self, events: list[LifecycleEvent], loads: dict[str, EngineLoad], report: Any) -> None: ...


class LifecyclePlugin(SchedulerPlugin):
    name = PLUGIN_NAME

    def __init__(self, started_wall: float, time_unit: float = 1.0) -> None:
        self.started = started_wall
        self.unit = time_unit if time_unit > 0 else 1.0
        self._events: list[LifecycleEvent] = []
        self.hook_s = 0.0  # time spent in transition(): the controller's cost to the scheduler
        self.hook_calls = 0

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        t0 = time.perf_counter()
        ts = self.scheduler.tasks.get(key)
        a = ts.annotations if ts is not None else None
        if a and "traj" in a:
            self._on_leg(ts, a, start, finish)
        self.hook_s += time.perf_counter() - t0
        self.hook_calls += 1

    def _on_leg(self, ts, a: dict, start: str, finish: str) -> None:
        leg = a["phase"]
        first = leg in FIRST_LEGS
        if start == "released" and finish == "waiting" and first:
            self._emit(a, Phase.QUEUED, a.get("append", 0))
        elif finish == "processing":
            if leg == "prefill":
                self._emit(a, Phase.PREFILL, a.get("append", 0), ts)
            elif leg in DECODE_LEGS:
                self._emit(a, Phase.DECODE, 0, ts)
        elif finish == "memory":
            if leg in DECODE_LEGS:
                self._emit(a, Phase.TOOL, a.get("replay_tokens") or a.get("max_tokens") or 0)
            elif leg == "tool" and a.get("done"):
                self._emit(a, Phase.DONE, 0)

    def _emit(self, a: dict, phase: Phase, tokens: int, ts=None) -> None:
        ws = ts.processing_on if ts is not None else None
        self._events.append(LifecycleEvent(
            time_s=(time.time() - self.started) / self.unit, traj_id=a["traj"], family=a.get("family", ""),
            turn=a["turn"], phase=phase, tokens=int(tokens), context=int(a.get("context", 0)),
            engine=str(ws.name) if ws is not None else "",
        ))  # fmt: skip

    def take_events(self) -> list[LifecycleEvent]:
        events, self._events = self._events, []
        return events


def _plugin(dask_scheduler) -> LifecyclePlugin:
    return dask_scheduler.plugins[PLUGIN_NAME]


def drain_events(dask_scheduler) -> list[LifecycleEvent]:
    return _plugin(dask_scheduler).take_events()


def worker_role(resources: dict[str, float]) -> Role:
    prefill, decode = resources.get("prefill", 0) > 0, resources.get("decode", 0) > 0
    return Role.MIXED if prefill and decode else (Role.PREFILL if prefill else Role.DECODE)


def engine_loads(dask_scheduler) -> dict[str, EngineLoad]:
    """engine name -> its EngineLoad as the scheduler sees it: its worker's role and the engine
    legs sent there and not yet seen finish (their prompt tokens, and the KV the decodes have
    written: their contexts; what they have decoded so far the scheduler cannot see, and what
    they will decode no one can); queued, active and kv_capacity are the engine's to say, 0 here."""
    out: dict[str, EngineLoad] = {}
    for ws in dask_scheduler.workers.values():
        if not str(ws.name).startswith("engine-"):
            continue
        prefills = decodes = prompt = kv = 0
        for ts in ws.processing:
            a = ts.annotations or {}
            if a.get("phase") == "prefill":
                prefills += 1
                prompt += a.get("append", 0)
            elif a.get("phase") in DECODE_LEGS:
                decodes += 1
                kv += a.get("context", 0) + a.get("append", 0)
        out[str(ws.name)] = EngineLoad(str(ws.name), worker_role(ws.resources), kv_tokens=kv,
                                       queued_prefill_tokens=prompt, prefill_legs=prefills, decode_legs=decodes)
    return out


def observe(dask_scheduler=None) -> tuple[list[LifecycleEvent], dict[str, EngineLoad]]:
    return drain_events(dask_scheduler), engine_loads(dask_scheduler)


def hook_cost(dask_scheduler) -> tuple[float, int]:
    p = _plugin(dask_scheduler)
    return p.hook_s, p.hook_calls


def observe_and_publish(report: Any = None, dask_scheduler=None) -> tuple[list[LifecycleEvent], dict[str, EngineLoad]]:
    events, loads = observe(dask_scheduler)
    for plugin in list(dask_scheduler.plugins.values()):
        if isinstance(plugin, Subscriber):
            try:
                plugin.fold(events, loads, report)
            except Exception:  # a page may show stale data; the control loop must not lose its events
                log.exception("%s: fold failed", getattr(plugin, "name", type(plugin).__name__))
    return events, loads
