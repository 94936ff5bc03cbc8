"""Switches a policy asked for and has not seen yet: plan, requested and observed kept apart.

    Requests(timeout_s)
      .engines(snapshot) -> [EngineLoad]   the engines in the roles asked for (else heading to)
      .ask(targets, now_s)                 a decision's targets, asked at now_s
      .locked(now_s, dwell_s) -> {engine}  engines that switched less than dwell_s ago
"""

from __future__ import annotations

from dataclasses import replace

from prorsa.control.policy import Snapshot
from prorsa.loads import EngineLoad
from prorsa.roles import Role


class Requests:
    """Switches asked for and not yet observed, and when each engine last switched."""

    def __init__(self, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self._pending: dict[str, tuple[Role, float]] = {}
        self._switched_at: dict[str, float] = {}

    def engines(self, snap: Snapshot) -> list[EngineLoad]:
        """The snapshot's engines in the roles requested for them, else in the roles the body is
        switching them to. A request the body is still carrying out does not time out: a mixed
        engine turning prefill drains its decodes first, 100 s and more when they are long, and
        planned as mixed meanwhile the split on the way priced as a bad goal and was undone (drivers
        tokens x4, one step: 820.7 s with it undone, 752.2 s without)."""
        out = []
        for e in snap.engines:
            want = self._pending.get(e.engine_id)
            heading = snap.heading.get(e.engine_id)
            if want is not None and (e.role is want[0] or (
                    heading is not want[0] and snap.time_s - want[1] > self.timeout_s)):
                del self._pending[e.engine_id]
                want = None
            role = want[0] if want is not None else heading
            out.append(e if role is None else replace(e, role=role))
        return out

    def ask(self, targets: dict[str, Role], now_s: float) -> None:
        for engine_id, role in targets.items():
            self._pending[engine_id] = (role, now_s)
            self._switched_at[engine_id] = now_s

    def locked(self, now_s: float, dwell_s: float) -> set[str]:
        return {e for e, t in self._switched_at.items() if now_s - t < dwell_s}
