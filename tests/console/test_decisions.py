"""The run's console hears the policy: its opening split and why, each switch, and why it stays."""

from __future__ import annotations

from pathlib import Path

from prorsa.console.decisions import DecisionTeller
from prorsa.control.policy import Decision, Snapshot, make_policy
from prorsa.loads import EngineLoad
from prorsa.roles import Role
from prorsa.rollout.context import load_run

REPO = Path(__file__).resolve().parents[2]


def snap(t: float, *roles: Role) -> Snapshot:
    return Snapshot(time_s=t, engines=tuple(EngineLoad(f"engine-{i}", r) for i, r in enumerate(roles)))


def test_prorsa_with_no_prior_opens_all_mixed_and_says_why():
    run = load_run(REPO / "pipelines" / "quickstart.yaml", {"engines.backend": "emulated"})
    policy = make_policy("prorsa", run.policy)
    said: list[str] = []
    roles = policy.initial_roles(3)
    DecisionTeller(said.append, policy).opening(roles)
    assert roles == [Role.MIXED] * 3
    assert said == [f"policy prorsa opens on 3 mixed: {policy.opening_reason}"] and "no prior" in said[0]


def test_switches_are_said_at_once_and_stays_once_per_kind():
    said: list[str] = []
    teller = DecisionTeller(said.append, make_policy("reactive"), min_gap_s=3600)
    M, D = Role.MIXED, Role.DECODE
    teller.told(snap(1.0, M, M), Decision({}, "keep P0 D0 M2 3.5 seq-s: gains 0.1"))
    teller.told(snap(2.0, M, M), Decision({}, "keep P0 D0 M2 3.9 seq-s: gains 0.2"))  # same kind: quiet
    teller.told(snap(3.0, M, M), Decision({"engine-1": D}, "move to P0 D1 M1"))
    teller.told(snap(3.5, M, D), Decision({"engine-1": D}, "move to P0 D1 M1"))  # asked again: under way
    teller.told(snap(4.0, M, D), Decision({}, "vote 1/2: keep P1 D1 M0"))
    teller.told(snap(5.0, M, D), Decision({}, "keep P0 D1 M1 2.0 seq-s: gains 0"))  # said before, within the gap
    assert said == [
        "reactive: stays on 2 mixed: no other split gains enough over the horizon to pay for the switch",
        "reactive: 1 engine (engine-1) mixed -> decode (move to P0 D1 M1)",
        "reactive: stays on 1 decode, 1 mixed: a new split must win several intervals in a row first",
    ]


def test_lines_carry_no_clock_of_their_own_so_the_consoles_orders_them():
    """Two policy calls in flight at once may end out of their snapshots' order (a step's opening
    beside an interval): the line is said when the decision is, on the console's clock."""
    said: list[str] = []
    teller = DecisionTeller(said.append, make_policy("reactive"))
    M, D, P = Role.MIXED, Role.DECODE, Role.PREFILL
    teller.told(snap(7.1, M, M), Decision({"engine-0": P}, "engine-0 -> prefill; prefill queue 900 tok/engine"))
    teller.told(snap(6.4, M, M), Decision({"engine-1": D}, "engine-1 -> decode; decode KV 95%"))
    assert said == ["reactive: 1 engine (engine-0) mixed -> prefill (thresholds crossed: prefill queue 900 tok/engine)",
                    "reactive: 1 engine (engine-1) mixed -> decode (thresholds crossed: decode KV 95%)"]


def test_a_fixed_split_says_so_once_and_nothing_after():
    said: list[str] = []
    teller = DecisionTeller(said.append, make_policy("static:2:1"))
    teller.opening([Role.PREFILL, Role.PREFILL, Role.DECODE])
    teller.told(snap(1.0, Role.PREFILL, Role.PREFILL, Role.DECODE), Decision({}, "static"))
    assert said == ["policy static:2:1 opens on 2 prefill, 1 decode: a fixed split: it never switches"]
