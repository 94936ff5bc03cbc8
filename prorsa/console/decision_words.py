"""A policy's decision as a person reads it: what moved, why, and the gain it predicted.

    moves_in_words(roles, targets) -> str   "1 engine (engine-2) mixed -> prefill"; "" when
                                            nothing changes role
    split_in_words(roles) -> str            "2 prefill, 1 mixed"
    why_in_words(decision, targets, roles) -> str   the reason, in words, from the decision's
                                            record: its forecast's figures for the allocator's
                                            moves, the kind of its reason otherwise
    goal_in_words(forecast) -> str          "toward 4 prefill, 4 decode": the plan's goal split
    gain_in_words(forecast) -> str          "predicted gain 4%": the plan's cost of the goal
                                            against the current split ("" without a plan)
    stay_in_words(reason) -> str            why a policy that could move stays
    decision_line(roles, decision) -> str | None   a move in one line: what, toward what, why,
                                            the gain; None when nothing moves

The allocator writes its reasons for its own log ("keep P0 D1 M2 3.5 seq-s: P1 D1 M1 gains -0.0,
needs 2x switch 0.00 + 15%"), which metrics.nc keeps; a console reads these words instead, taken
from the same record.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping

from prorsa.control.allocator import PlanSummary
from prorsa.control.forecast import ForecastSummary
from prorsa.control.policy import Decision
from prorsa.metrics.words import number, plain_reason
from prorsa.roles import Role

_ORDER = (Role.PREFILL, Role.DECODE, Role.MIXED)

# how the adaptive policies' reasons to stay put begin (control/adaptive.py, control/allocator.py)
WHY_STAY = (
    ("keep ", "no other split gains enough over the horizon to pay for the switch"),
    ("vote ", "a new split must win several intervals in a row first"),
    ("hold ", "the split rehearsed for this step is kept to its end"),
    ("next step", "the split rehearsed for the next step is the one it has"),
    ("cooldown", "waiting out the cooldown after its last switch"),
)
_NEXT_STEP = re.compile(r"next step: P\d+ D\d+ M\d+ \((?P<how>[^)]*)\)")


def split_in_words(roles) -> str:
    n = Counter(roles)
    return ", ".join(f"{n[r]} {r.value}" for r in _ORDER if n[r])


def moves_in_words(roles: Mapping[str, Role], targets: Mapping[str, Role]) -> str:
    moved: dict[tuple[Role, Role], list[str]] = {}
    for engine, new in sorted(targets.items()):
        old = roles.get(engine)
        if old is not None and old is not new:
            moved.setdefault((old, new), []).append(engine)
    return ", ".join(f"{len(names)} engine{'s' if len(names) > 1 else ''} ({', '.join(names)}) "
                     f"{old.value} -> {new.value}" for (old, new), names in moved.items())


def _prefill_words(f: ForecastSummary) -> str:
    parts = []
    if f.backlog_tokens >= 1:
        parts.append(f"{number(round(f.backlog_tokens))} prefill tokens queued")
    if f.prefill_peak_tps >= 1:
        parts.append(f"up to {number(round(f.prefill_peak_tps))} prefill tokens a second arriving")
    return ", ".join(parts) or "little prefill ahead"


def _decode_words(f: ForecastSummary) -> str:
    if f.decode_seqs_peak < 0.5:
        return "little decoding ahead"
    return f"up to {number(round(f.decode_seqs_peak))} sequences decoding"


def _forecast_words(f: ForecastSummary, gained: set[Role]) -> str:
    """The demand the moves answer: prefill's for engines taking prefill, decode's for decode."""
    parts = []
    if gained & {Role.PREFILL, Role.MIXED}:
        parts.append(_prefill_words(f))
    if gained & {Role.DECODE, Role.MIXED}:
        parts.append(_decode_words(f))
    horizon = f" for the next {f.horizon_s:g} s" if f.horizon_s > 0 else ""
    return f"forecast{horizon}: {', '.join(parts)}"


def goal_in_words(forecast: ForecastSummary | None) -> str:
    """"toward 4 prefill, 4 decode": the split a plan moves toward, when it is more than this move."""
    if not isinstance(forecast, PlanSummary):
        return ""
    goal = (round(forecast.goal_prefill), round(forecast.goal_decode), round(forecast.goal_mixed))
    return "toward " + ", ".join(f"{n} {r.value}" for n, r in zip(goal, _ORDER) if n) if sum(goal) else ""


def why_in_words(decision: Decision, targets: Mapping[str, Role], roles: Mapping[str, Role]) -> str:
    reason = decision.reason
    dropped = ""
    if reason.startswith("prior dropped:"):  # "prior dropped: <what>; <the decision's own reason>"
        head, _, reason = reason.partition("; ")
        dropped = f"its prior proved wrong ({head.removeprefix('prior dropped: ')}); "
    if reason.startswith("next step"):
        how = _NEXT_STEP.match(reason)
        return f"{dropped}the split for the next step" + (f" ({how['how']})" if how else "")
    if reason.startswith("reopen"):
        return f"{dropped}reopening as a run with no prior would"
    if reason.startswith("replayed move"):
        return "a recorded run's move, replayed"
    if "; " in reason and " -> " in reason.split("; ")[0]:  # reactive: "<engine> -> <role>; <state>"
        return f"{dropped}thresholds crossed: {reason.split('; ', 1)[1]}"
    if decision.forecast is not None and (reason.startswith("move to") or "move to" in reason):
        gained = {new for e, new in targets.items() if roles.get(e) not in (None, new)}
        return dropped + _forecast_words(decision.forecast, gained)
    return dropped + plain_reason(reason)


def gain_in_words(forecast: ForecastSummary | None) -> str:
    """"predicted gain 4%": the sequence-seconds the plan's goal saves over the horizon against
    the split now, as a share of the latter."""
    if not isinstance(forecast, PlanSummary):
        return ""
    now, goal = forecast.cost_now_seq_s, forecast.cost_goal_seq_s
    if not (math.isfinite(now) and math.isfinite(goal)) or now <= 0:
        return ""
    pct = 100.0 * (now - goal) / now
    return f"predicted gain {pct:.0f}%" if pct >= 0.5 else ""


def stay_in_words(reason: str) -> str:
    return next((words for start, words in WHY_STAY if reason.startswith(start)), "")


def decision_line(roles: Mapping[str, Role], decision: Decision) -> str | None:
    """A decision that moves engines in words ("1 engine (engine-2) mixed -> prefill, toward 1
    prefill, 2 mixed (forecast: ...; predicted gain 4%)"); None when it moves none."""
    moves = moves_in_words(roles, decision.targets)
    if not moves:
        return None
    after = {**roles, **decision.targets}
    goal = goal_in_words(decision.forecast)
    if goal == f"toward {split_in_words(after.values())}":  # this move reaches it
        goal = ""
    why = "; ".join(w for w in (why_in_words(decision, decision.targets, roles), gain_in_words(decision.forecast)) if w)
    return f"{moves}{', ' + goal if goal else ''}" + (f" ({why})" if why else "")
