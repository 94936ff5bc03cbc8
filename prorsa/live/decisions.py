"""The policy's decisions, in words, on the run's console.

    DecisionTeller(say, policy, min_gap_s)
      .opening(roles)              the split the run opens on, and why (the policy's
                                   opening_reason when it gives one)
      .told(snapshot, decision)    after every control interval: a switch is said at once; a
                                   decision to stay put (not one that asks again for a switch
                                   under way) is said with why (WHY_STAY, then the
                                   policy's own reason) when its reason differs in kind from the
                                   last one said (numbers aside): at once for a kind not said
                                   before, else no more often than every min_gap_s of wall time

Every interval's reason is also in metrics.nc (the controller's records); the console gets what a
person watching the run can read as it goes.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable

from prorsa.control.policy import Decision, Snapshot
from prorsa.roles import Role

_NUMBER = re.compile(r"\d+(\.\d+)?")

# how the adaptive policies' reasons to stay put begin (control/adaptive.py, control/allocator.py)
WHY_STAY = (
    ("keep ", "no other split gains enough over the horizon to pay for the switch"),
    ("vote ", "a new split must win several intervals in a row first"),
    ("hold ", "the split rehearsed for this step is kept to its end"),
    ("next step", "the split for the next step"),
    ("cooldown", "waiting out the cooldown after its last switch"),
)


def split_in_words(roles: list[Role]) -> str:
    n = Counter(roles)
    return ", ".join(f"{n[r]} {r.value}" for r in (Role.PREFILL, Role.DECODE, Role.MIXED) if n[r])


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
        moves = [f"{e} {roles[e].value} -> {r.value}" for e, r in sorted(decision.targets.items())
                 if e in roles and roles[e] is not r]
        if moves:
            self.say(f"{self.name} at {snapshot.time_s:.1f} s: {', '.join(moves)} ({decision.reason})")
            self._last_kind, self._last_at = None, time.monotonic()
            return
        if decision.targets:  # asks for the roles it asked for before: that switch is under way
            return
        kind = _NUMBER.sub("#", decision.reason)
        now = time.monotonic()
        if decision.reason and kind != self._last_kind and (
                kind not in self._kinds or now - self._last_at >= self.min_gap_s):
            why = next((words for start, words in WHY_STAY if decision.reason.startswith(start)), "")
            self.say(f"{self.name} at {snapshot.time_s:.1f} s: stays on {split_in_words(list(roles.values()))}"
                     f"{': ' + why if why else ''} ({decision.reason})")
            self._last_kind, self._last_at = kind, now
            self._kinds.add(kind)
