"""How the dashboard's data reaches the scheduler: on the controller's own call, no extra round trip.

    DashboardFeed(recorder, now)          driver side; report(switching) -> Report, only what is
                                          new in the recorder since the previous report
    observe_and_publish(report, dask_scheduler)
                                          run_on_scheduler, once per control interval in place of
                                          lifecycle_plugin.observe: drains the lifecycle events and
                                          reads the engine loads as before, folds them and the
                                          report into the dashboard plugin's LiveState (when one is
                                          registered), and returns (events, loads) to the controller

The page and the JSON endpoint read that state where it lives, on the scheduler, so nothing polls
the client and the driver's share is building one small Report per interval.
"""

from __future__ import annotations

import logging
from typing import Callable

from prorsa.dashboard.state import Report
from prorsa.metrics.recorder import RunRecorder
from prorsa.rollout.lifecycle_plugin import observe

log = logging.getLogger(__name__)

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


def observe_and_publish(report: Report | None = None, dask_scheduler=None):
    events, loads = observe(dask_scheduler)
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if plugin is not None:
        try:
            plugin.fold(events, loads, report)
        except Exception:  # the page may show stale data; the control loop must not lose its events
            log.exception("prorsa dashboard: fold failed")
    return events, loads
