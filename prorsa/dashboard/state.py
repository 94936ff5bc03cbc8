"""What the Prorsa dashboard page shows, kept on the scheduler and folded once per control interval.

    Report(...)                     what the driver adds each interval (frozen; crosses the comm)
    LiveState(meta)                 the page's data: current view plus bounded history
    LiveState.begin(now, loads)     the engines' roles when the plugin starts
    LiveState.fold(now, events, loads, report)   one control interval; called on the scheduler by
                                    lifecycle_plugin.observe_and_publish, inside the controller's own call
    LiveState.to_json()             the JSON endpoint's document (schema below, version 1)
    LiveState.version               bumped by every fold, so a page redraws only when it changed

Two sources meet here. The scheduler knows the lifecycle events (drained from the lifecycle
plugin in the same call) and what it has sent each engine worker, with the worker's role; the
driver knows what only it sees: the policy's last decision and forecast, finished role switches,
the engines' own readings (queue, admitted sequences, KV) and failed trajectories. The driver's
part arrives one interval late (it rides on the next interval's call), stamped with its own time.

Times are wall seconds since the rollout began, the clock of the run's metrics.nc and report: the
driver's records (decisions, switches, forecast horizons) are stamped in body seconds (the policy's
clock, wall / time_unit) and converted as they arrive, so a switch shows at one time everywhere.

JSON (`to_json`):
    version, t, run{name, policy, engines, slots, kv_capacity, time_unit, expected, clock}
    engines{name: {role, switching, queued, active, kv_tokens, kv_capacity, kv_use,
                   legs_prefill, legs_decode, queued_prefill_tokens}}
    trajectories{queued, prefill, decode, tool, done, failed}   now
    decision{t, reason, forecast{}, forecast_error{}} | null    the policy's latest
    roles{engine: [[t0, t1, role], ...]}                        observed, one span per role held
    switches[{t, engine, from, to, reason, drain_s}]            finished role switches
    series{t[], prefill_tps[], prefill_tps_all[], decode_seqs[], queued{engine: []},
           kv_use{engine: []}, trajectories{state: []}}         one point per control interval
    forecasts{t[], horizon_s[], prefill_tps[], decode_seqs[]}   each decision's horizon means
    cost{folds, fold_s}                                         this module's time on the scheduler
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field, replace

from prorsa.control.forecast import ForecastSummary
from prorsa.control.lifecycle import LifecycleEvent, Phase
from prorsa.loads import EngineLoad
from prorsa.metrics.recorder import ControlRecord, EngineSample, RoleChange
from prorsa.roles import Role

SCHEMA_VERSION = 1
STATES = ("queued", "prefill", "decode", "tool", "done", "failed")


@dataclass(frozen=True)
class Report:
    """The driver's part of one interval: only what is new since the previous report."""

    t: float  # body seconds when it was built
    samples: tuple[EngineSample, ...] = ()  # each engine's latest own reading
    decision: ControlRecord | None = None  # the policy's latest decision, if new
    switches: tuple[RoleChange, ...] = ()  # role switches finished since the last report
    switching: tuple[str, ...] = ()  # engines in the middle of a switch now
    failed: tuple[str, ...] = ()  # trajectories that failed since the last report
    turns: int = 0  # totals so far
    tokens: int = 0


class _Census:
    """Trajectories per lifecycle state, kept up to date event by event: a dict lookup each, and
    no pass over every live trajectory per interval (at 1024 in flight, LifecycleTracker's
    bookkeeping cost the scheduler several ms an interval). Stale or repeated events are ignored
    as the tracker does: by (turn, phase rank)."""

    def __init__(self) -> None:
        self.counts = {s: 0 for s in STATES}
        self._at: dict[str, tuple[tuple[int, int], str]] = {}  # live traj -> ((turn, rank), state)
        self._ended: set[str] = set()  # so a late event cannot bring one back

    def apply(self, ev: LifecycleEvent) -> None:
        if ev.traj_id in self._ended:
            return
        order = (ev.turn, ev.phase.rank)
        cur = self._at.get(ev.traj_id)
        if cur is not None:
            if order <= cur[0]:
                return
            self.counts[cur[1]] -= 1
        self.counts[ev.phase.value] += 1
        if ev.phase.finished:
            self._at.pop(ev.traj_id, None)
            self._ended.add(ev.traj_id)
        else:
            self._at[ev.traj_id] = (order, ev.phase.value)

    def fail(self, traj_id: str, t: float) -> None:
        cur = self._at.get(traj_id)
        self.apply(LifecycleEvent(t, traj_id, "", cur[0][0] if cur else 0, Phase.FAILED))


@dataclass
class _Engine:
    """An engine as the page shows it: the scheduler's part of its load (role, legs) and the
    engine's own reading (queue, admitted, KV) met in one EngineLoad."""

    load: EngineLoad
    switching: bool = False


@dataclass
class LiveState:
    meta: dict  # name, policy, engines, slots, kv_capacity, time_unit, expected: fixed for the run
    history: int = 3600  # points kept per series (an hour at the default 1 s interval)
    version: int = 0
    t: float = 0.0
    turns: int = 0
    tokens: int = 0
    decision: ControlRecord | None = None
    fold_s: float = 0.0
    engines: dict[str, _Engine] = field(default_factory=dict)
    roles: dict[str, list[list]] = field(default_factory=dict)  # engine -> [[t0, t1, role], ...]
    switches: deque = field(default_factory=lambda: deque(maxlen=1000))
    points: deque = field(init=False)  # (t, prefill_tps, prefill_tps_all, decode_seqs, queued, kv, states)
    forecasts: deque = field(init=False)  # (t, horizon_s, prefill_tps, decode_seqs)
    n_forecasts: int = 0  # forecasts ever appended (a page streams those it has not sent)
    census: _Census = field(default_factory=_Census)

    def __post_init__(self) -> None:
        self.points = deque(maxlen=self.history)
        self.forecasts = deque(maxlen=self.history)
        self.engines = {e: _Engine(EngineLoad(e, Role.MIXED, kv_capacity=self.meta.get("kv_capacity", 0)))
                        for e in self.meta["engines"]}
        self.roles = {e: [] for e in self.meta["engines"]}

    def begin(self, now: float, loads: dict[str, EngineLoad]) -> None:
        """The engines' roles before the first interval, so each lane starts with the run."""
        self._loads(now, loads)

    def fold(self, now: float, events: list[LifecycleEvent], loads: dict[str, EngineLoad],
             report: Report | None) -> None:
        t0 = time.perf_counter()
        dt = now - self.t if self.points else now
        later = every = 0  # prompt tokens arriving; `later`: of turns k > 0, what the forecaster predicts
        queued, census = Phase.QUEUED, self.census
        for ev in events:
            census.apply(ev)
            if ev.phase is queued:
                every += ev.tokens
                if ev.turn > 0:
                    later += ev.tokens
        self._loads(now, loads)
        if report is not None:
            self._report(report)
        counts = self.census.counts
        engines = list(self.engines)
        self.points.append((
            now, later / dt if dt > 0 else 0.0, every / dt if dt > 0 else 0.0, counts["decode"],
            tuple(self.engines[e].load.queued for e in engines), tuple(self.engines[e].load.kv_use for e in engines),
            tuple(counts[s] for s in STATES),
        ))  # fmt: skip
        self.t = now
        self.version += 1
        self.fold_s += time.perf_counter() - t0

    def _loads(self, now: float, loads: dict[str, EngineLoad]) -> None:
        for name, seen in loads.items():
            e = self.engines.get(name)
            if e is None:  # not an engine of this run
                continue
            e.load = replace(e.load, role=seen.role, prefill_legs=seen.prefill_legs, decode_legs=seen.decode_legs,
                             queued_prefill_tokens=seen.queued_prefill_tokens)
            role = seen.role.value
            spans = self.roles.setdefault(name, [])
            if spans and spans[-1][2] == role:
                spans[-1][1] = now
            else:
                if spans:
                    spans[-1][1] = now
                spans.append([now, now, role])

    @property
    def unit(self) -> float:
        """Wall seconds per body second."""
        u = self.meta.get("time_unit", 1.0)
        return float(u) if isinstance(u, (int, float)) and u > 0 else 1.0

    def _report(self, r: Report) -> None:
        u = self.unit
        self.turns, self.tokens = r.turns, r.tokens
        for s in r.samples:
            e = self.engines.get(s.load.engine_id)
            if e is None:
                continue
            own = s.load
            e.load = replace(e.load, queued=own.queued, active=own.active, kv_tokens=own.kv_tokens,
                             kv_capacity=own.kv_capacity)
        for name, e in self.engines.items():
            e.switching = name in r.switching
        for traj in r.failed:  # the scheduler sees no failure: the driver gave up on the turn
            self.census.fail(traj, r.t)
        self.switches.extend(replace(c, t=c.t * u, drain_s=c.drain_s * u) for c in r.switches)
        if r.decision is not None:
            self.decision = replace(r.decision, t=r.decision.t * u)
            f = r.decision.forecast or ForecastSummary()
            horizon = f.horizon_s * u
            point = (self.decision.t, horizon, f.prefill_tokens / horizon if horizon > 0 else 0.0, f.decode_seqs_mean)
            if horizon > 0 and all(math.isfinite(x) for x in point):  # policies that do not forecast: {}
                self.forecasts.append(point)
                self.n_forecasts += 1

    def to_json(self) -> dict:
        names = list(self.engines)
        cols = list(zip(*self.points)) if self.points else [()] * 7
        fc = list(zip(*self.forecasts)) if self.forecasts else [()] * 4
        counts = self.census.counts
        d = self.decision
        return {
            "version": SCHEMA_VERSION,
            "t": self.t,
            "run": {**self.meta, "clock": "wall seconds since the rollout began (time_unit: wall seconds per "
                                          "body second; decision.forecast horizons stay in body seconds)"},
            "engines": {n: _engine_json(e) for n, e in self.engines.items()},
            "trajectories": {s: counts[s] for s in STATES},
            "turns": self.turns,
            "tokens": self.tokens,
            "decision": None if d is None else {
                "t": d.t, "reason": d.reason, "forecast": _finite(d.forecast.figures() if d.forecast else {}),
                "forecast_error": _finite(d.forecast_error)},
            "roles": {n: [list(s) for s in spans] for n, spans in self.roles.items()},
            "switches": [{"t": c.t, "engine": c.engine, "from": c.from_role.value, "to": c.to_role.value,
                          "reason": c.reason, "drain_s": c.drain_s} for c in self.switches],
            "series": {
                "t": list(cols[0]), "prefill_tps": list(cols[1]), "prefill_tps_all": list(cols[2]),
                "decode_seqs": list(cols[3]),
                "queued": {n: [row[i] for row in cols[4]] for i, n in enumerate(names)},
                "kv_use": {n: [row[i] for row in cols[5]] for i, n in enumerate(names)},
                "trajectories": {s: [row[i] for row in cols[6]] for i, s in enumerate(STATES)},
            },
            "forecasts": {"t": list(fc[0]), "horizon_s": list(fc[1]), "prefill_tps": list(fc[2]),
                          "decode_seqs": list(fc[3])},
            "cost": {"folds": self.version, "fold_s": self.fold_s},
        }


def _engine_json(e: _Engine) -> dict:
    x = e.load
    return {"role": x.role.value, "switching": e.switching, "queued": x.queued, "active": x.active,
            "kv_tokens": x.kv_tokens, "kv_capacity": x.kv_capacity, "kv_use": x.kv_use,
            "legs_prefill": x.prefill_legs, "legs_decode": x.decode_legs,
            "queued_prefill_tokens": x.queued_prefill_tokens}


def _finite(d: dict[str, float]) -> dict[str, float | None]:
    """JSON has no inf or NaN (a policy may report either, e.g. an infeasible split's cost)."""
    return {k: v if math.isfinite(v) else None for k, v in d.items()}
