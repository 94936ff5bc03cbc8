"""The policy's decisions, in words, on the run's console.

    DecisionTeller(say, policy, min_gap_s)
      .opening(roles)              the split the run opens on, and why (the policy's
                                   opening_reason when it gives one)
      .told(snapshot, decision)    after every control interval: a switch is said at once, in
                                   words (console/decision_words.py); a decision to stay put (not
                                   one that asks again for a switch under way) is said with why
                                   when that differs from the last one said: at once for a why
                                   not said before, else no more often than every min_gap_s of
                                   wall time

Lines are said as the decisions are made, so the console's clock (console/clocked.py) orders
them; the control loop's own times are body seconds, and two policy calls in flight at once (a
step's opening beside an interval) can end in either order. Every interval's reason, as the
policy wrote it, is in metrics.nc (the controller's records).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prorsa.console.decision_words import decision_line, split_in_words, stay_in_words
from prorsa.control.policy import Decision, Snapshot
from prorsa.roles import Role

def _fixed(name: str) -> bool:
    return name == "colocated" or name.startswith("static")


class DecisionTeller:
    def __init__(self, say: Callable[[str], None], policy, min_gap_s: float = 15.0) -> None:
        self.say, self.policy, self.min_gap_s = say, policy, min_gap_s
        self.name = getattr(policy, "name", type(policy).__name__)
        self._last_kind: str | None = None
        self._kinds: set[str] = set()
        self._last_at = float("-inf")

    def opening(self, roles: list[Role]) -> None:
        why = getattr(self.policy, "opening_reason", "") or (
            "a fixed split: it never switches" if _fixed(self.name) else "")
        self.say(f"policy {self.name} opens on {split_in_words(roles)}" + (f": {why}" if why else ""))

    def told(self, snapshot: Snapshot, decision: Decision) -> None:
        if _fixed(self.name):
            return
        roles = {e.engine_id: e.role for e in snapshot.engines}
        line = decision_line(roles, decision)
        if line is not None:
            self.say(f"{self.name}: {line}")
            self._last_kind, self._last_at = None, time.monotonic()
            return
        if decision.targets:  # asks for the roles it asked for before: that switch is under way
            return
        kind = why = stay_in_words(decision.reason)
        now = time.monotonic()
        if why and kind != self._last_kind and (kind not in self._kinds or now - self._last_at >= self.min_gap_s):
            self.say(f"{self.name}: stays on {split_in_words(roles.values())}: {why}")
            self._last_kind, self._last_at = kind, now
            self._kinds.add(kind)
