"""How the dashboard's data reaches the scheduler: on the controller's own call, no extra round trip.

    DashboardFeed(recorder, now)          driver side; report(switching) -> Report, only what is
                                          new in the recorder since the previous report

The controller hands the report to its one scheduler call per interval
(cluster/lifecycle_plugin.py: observe_and_publish), which folds it, with the lifecycle events and
engine loads it reads there, into the dashboard plugin's LiveState.

The page and the JSON endpoint read that state where it lives, on the scheduler, so nothing polls
the client and the driver's share is building one small Report per interval.
"""

from __future__ import annotations

from typing import Callable

from prorsa.dashboard.state import Report
from prorsa.metrics.recorder import RunRecorder

PLUGIN_NAME = "prorsa-dashboard"


class DashboardFeed:
    def __init__(self, recorder: RunRecorder, now: Callable[[], float]) -> None:
        self.rec = recorder
        self.now = now  # body seconds, the controller's clock
        # how far each recorder list has been reported (they only grow)
        self._controls = 0
        self._changes = 0
        self._trajectories = 0

    def report(self, switching=()) -> Report:
        rec = self.rec
        decision = rec.controls[-1] if len(rec.controls) > self._controls else None
        changes = tuple(rec.role_changes[self._changes:])
        failed = tuple(r.spec.traj_id for r in rec.trajectories[self._trajectories:] if r.status != "completed")
        self._controls, self._changes, self._trajectories = len(rec.controls), len(rec.role_changes), len(rec.trajectories)
        return Report(
            t=self.now(), samples=tuple(rec.samples[-len(rec.engines):]), decision=decision,
            switches=changes, switching=tuple(switching), failed=failed,
            turns=rec.turns, tokens=rec.prefill_tokens + rec.decode_tokens,
        )  # fmt: skip
