"""Allocator: forecast demand -> a target role split, switching only when it pays.

    Capacity(cost, slots, kv_capacity_tokens)   what one engine serves in each role (cost model)
    capacity.for_role(role)                     the same for one role's layout (engines.parallelism)
    Allocator(capacity, ...).plan(forecast, engines, locked) -> Plan   once per control interval
    score(capacity, forecast, P, D, M)          predicted cost of splits (arrays of counts)

The score of a split (P prefill, D decode, M mixed engines) is the sequence-seconds the live
trajectories spend over the horizon, in a fluid model run bin by bin:

    prefill   a queue fed by forecast arrivals and the backlog. PREFILL engines serve first; each
              turn there also re-prefills the previous turn's decode (only its decode engine holds
              it) and ships its KV (kv_transfer_time). MIXED engines take the overflow; their own
              decodes hold the context, so they prefill only the append.
    decode    the forecast's sequences plus any a slower split left behind, spread over the D + M
              engines up to their slots and KV. A decode engine steps in decode_time(batch); a
              mixed engine's step grows with the prefill it co-batches, and under DP attention
              (ep > 1) every rank waits whenever any rank holds a prefill piece.
    cost      every waiting or decoding sequence's seconds, prefill latency per turn, and what is
              left at the horizon (prefill queue, decode work behind pace), drained at the end.

With stage-specific parallelism each role is priced in its own layout (Capacity.for_role):
prefill engines by the prefill layout, decode engines (and the KV pull into them) by the decode
layout, mixed engines by the mixed one.

Switching: a PREFILL or DECODE engine serves its new role only after its drain
(cost_model.switch_time; into another layout the engine empties and reshards first), so its share
of the gain comes that much later:
switch_cost = gain x max over moves of min(1, drain / horizon): the goal's cost holds only once its
slowest move is done (a mean let one long drain hide among free moves). A MIXED engine turning DECODE
already serves decode, so that delays nothing (nor does entering MIXED: nothing drains); a MIXED
engine turning PREFILL first finishes its decodes, taking no new work meanwhile (the body's switch
protocol), like a DECODE engine.
The goal is the reachable split (unlocked engines only) with the least
cost + hysteresis x switch_cost; it is adopted only if
cost_now - (cost_goal + hysteresis x switch_cost) > min_gain x cost_now, else the roles stay.
At most `max_switches_per_interval` moves are made now, to the best-scoring split on the way (the
next plans carry on), taking the cheapest engines first: least queued + active work, then least
KV held, then engine id; each goes to the missing role it drains into fastest.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from prorsa.control.forecast import Forecast, ForecastSummary
from prorsa.loads import EngineLoad
from functools import cache, cached_property

from prorsa.control.split_search import SplitSearch, within
from prorsa.costmodel import CostModel, RoleCosts
from prorsa.roles import Role

ROLES = (Role.PREFILL, Role.DECODE, Role.MIXED)  # the order of a split (P, D, M)
Split = tuple[int, int, int]
MAX_STEP_MOVES = 16  # past search.exact_side, the step is sought among splits this many moves away at most


@dataclass(frozen=True)
class Capacity:
    cost: CostModel
    slots: int  # sequences one engine admits at once
    kv_capacity_tokens: int  # KV tokens one engine holds
    prefill_budget: int = 8192  # tokens a prefill engine batches into one step
    chunk_tokens: int = 8192  # prefill tokens a mixed engine co-batches with its decodes per step (a rank)
    link: str = "net"  # how KV moves from a prefill engine to a decode engine
    layouts: RoleCosts | None = None  # per-role cost models; None: `cost` in every role

    @classmethod
    def from_cost(cls, cost: CostModel, slots: int, kv_capacity_tokens: int | None = None,
                  **kwargs) -> Capacity:
        kv = cost.kv_capacity_tokens() * cost.ep if kv_capacity_tokens is None else kv_capacity_tokens
        return cls(cost=cost, slots=slots, kv_capacity_tokens=kv, **kwargs)

    def for_role(self, role: Role) -> Capacity:
        """This capacity in `role`'s layout: itself where the layout is `cost`'s (every role,
        without per-role parallelism), so the uniform path computes exactly what it always did."""
        return self._by_role[role]

    @cached_property
    def _by_role(self) -> dict[Role, Capacity]:
        out = {}
        for role in ROLES:
            cost = self.cost if self.layouts is None else self.layouts.of(role)
            out[role] = self if cost.layout == self.cost.layout else Capacity.from_cost(
                cost, self.slots, prefill_budget=self.prefill_budget, chunk_tokens=self.chunk_tokens,
                link=self.link)
        return out

    @property
    def ranks(self) -> int:
        """DP-attention ranks per engine: an MoE engine under expert parallelism is a group of
        cost.ep ranks stepping in lockstep; slots and KV are the group's."""
        return self.cost.ep

    def max_decode_seqs(self, context: float) -> float:
        return float(min(self.slots, self.kv_capacity_tokens / max(context, 1.0)))

    def decode_step(self, batch: float, context: float) -> float:
        """One decode step of `batch` sequences (may be fractional: a fluid mean) at `context`,
        spread evenly over the engine's ranks."""
        return float(self.decode_steps(np.array([batch], dtype=float), context)[0])

    def decode_steps(self, batch: np.ndarray, context: float) -> np.ndarray:
        """decode_step over an array of batches."""
        b = batch / self.ranks
        out = self.cost.step_times(b, b, b * (context + 0.5), b * context)
        return np.where(batch > 0, out, 0.0)

    def mixed_step(self, batch: float, context: float, tokens: float, append: float,
                   prefix: float) -> float:
        """A decode step that also carries `tokens` prefill tokens, cut from appends of `append`
        tokens on `prefix` cached tokens, on one rank (the one every other rank waits for)."""
        return float(self.mixed_steps(np.array([batch], dtype=float), context, tokens, append, prefix)[0])

    def mixed_steps(self, batch: np.ndarray, context: float, tokens: float, append: float,
                    prefix: float) -> np.ndarray:
        """mixed_step over an array of batches."""
        batch = batch / self.ranks
        piece = max(1.0, min(append, tokens))
        seqs = tokens / piece
        under = prefix + max(append - piece, 0.0) / 2  # a chunk of a long append sits mid-way
        return self.cost.step_times(batch + tokens, batch + seqs,
                                    batch * (context + 0.5) + tokens * (under + piece / 2),
                                    batch * context + seqs * under)

    def prefill_rate(self, append: float, prefix: float) -> float:
        """Turns per second a PREFILL engine serves, batching appends up to its step budget
        (on each of its ranks)."""
        if append <= self.prefill_budget:
            k = max(1, int(self.prefill_budget // max(append, 1.0)))
            return self.ranks * k / self.cost.step_time(k * append, k, k * append * (prefix + append / 2),
                                                        k * prefix)
        steps = math.ceil(append / self.prefill_budget)
        under = prefix + append / 2
        return self.ranks / (steps * self.cost.step_time(self.prefill_budget, 1,
                                                         self.prefill_budget * under, under))

    def prefill_latency(self, append: float, prefix: float) -> float:
        return self.cost.prefill_time([(max(1, round(append)), round(prefix))])

    def transfer_time(self, tokens: float) -> float:
        return self.cost.kv_transfer_time(round(tokens), self.link)

    def drain_time(self, engine: EngineLoad, to_role: Role, remaining_tokens: float) -> float:
        """Seconds before `engine` serves `to_role`: its decodes (remaining_tokens each) or the
        prefill step in flight must finish first."""
        batch = engine.active if engine.role.serves_decode else 0
        return self.for_role(engine.role).cost.switch_time(
            engine.role, to_role, round(batch * remaining_tokens), batch,
            context_tokens=engine.kv_tokens if batch else 0, to_cost=self.for_role(to_role).cost)


@dataclass(frozen=True)
class Plan:
    targets: dict[str, Role]  # engine_id -> new role: the switches to make now (at most the cap)
    current: Split  # (P, D, M) now
    goal: Split  # the split being moved toward (current when keeping)
    next: Split  # (P, D, M) once this interval's targets are carried out
    best: Split  # the best-scoring split, ignoring switch cost, locks and the cap
    cost_now: float  # predicted sequence-seconds over the horizon, current split
    cost_goal: float  # the same for the goal
    switch_cost: float  # sequence-seconds all the switches to the goal cost (drain)
    reason: str
    forecast: ForecastSummary = ForecastSummary()  # the demand that justified it

    def summary(self) -> PlanSummary:
        return PlanSummary(**asdict(self.forecast), cost_now_seq_s=self.cost_now, cost_goal_seq_s=self.cost_goal,
                           switch_cost_seq_s=self.switch_cost, goal_prefill=float(self.goal[0]),
                           goal_decode=float(self.goal[1]), goal_mixed=float(self.goal[2]))


@dataclass(frozen=True)
class PlanSummary(ForecastSummary):
    """The forecast behind a plan and what the plan made of it: the figures a Decision carries."""

    cost_now_seq_s: float = 0.0  # predicted sequence-seconds over the horizon, current split
    cost_goal_seq_s: float = 0.0  # the same for the goal
    switch_cost_seq_s: float = 0.0  # what the switches to the goal cost (drain)
    goal_prefill: float = 0.0  # the split being moved toward
    goal_decode: float = 0.0
    goal_mixed: float = 0.0


@cache  # every interval asks again, and 64 engines have ~2,000 splits
def splits(n: int) -> np.ndarray:
    """Every (P, D, M) with P + D + M = n that can serve both phases; (k, 3) ints, read-only."""
    out = [(p, d, n - p - d) for p in range(n + 1) for d in range(n + 1 - p)
           if p + (n - p - d) >= 1 and d + (n - p - d) >= 1]
    table = np.array(out, dtype=int).reshape(-1, 3)
    table.flags.writeable = False
    return table


def count_roles(roles: Sequence[Role]) -> Split:
    return (sum(r is Role.PREFILL for r in roles), sum(r is Role.DECODE for r in roles),
            sum(r is Role.MIXED for r in roles))


def cheapest_first(engines: Sequence[EngineLoad]) -> list[EngineLoad]:
    return sorted(engines, key=lambda e: (e.queued + e.active, e.kv_tokens, e.engine_id))


class Allocator:
    def __init__(self, capacity: Capacity, hysteresis: float = 2.0, max_switches_per_interval: int = 1,
                 min_gain: float = 0.05, max_scan: int = 256, search: SplitSearch = SplitSearch()):
        if hysteresis < 0 or min_gain < 0 or max_switches_per_interval < 0:
            raise ValueError("hysteresis, min_gain and max_switches_per_interval must be >= 0")
        self.capacity = capacity
        self.hysteresis = hysteresis  # switch cost counts this many times against the gain
        self.max_switches = max_switches_per_interval
        self.min_gain = min_gain  # and the gain must exceed this share of the current cost
        self.max_scan = max_scan  # candidates priced for switching, best-scoring first
        self.search = search  # which splits are priced: all of them up to search.exact_side engines

    def plan(self, forecast: Forecast, engines: Sequence[EngineLoad],
             locked: Collection[str] = (), anchor: Split | None = None) -> Plan:
        """A goal split and this interval's switches toward it (module docstring).

        `anchor`: the goal a caller is already moving to. The splits on the way to a goal can
        score far worse than either end, so gains are judged against the anchor, not the
        transitional split: a new goal must beat the anchor, or the moves toward it go on.
        """
        cur = count_roles([e.role for e in engines])
        if not engines:
            return Plan({}, cur, cur, cur, cur, 0.0, 0.0, 0.0, "no engines", forecast.summary())
        ref = cur if anchor is None or sum(anchor) != len(engines) else anchor
        movers = _Movers(self.capacity, engines, locked, forecast.decode_remaining_tokens)
        cands, costs = self._priced(forecast, cur, ref, movers.counts())

        def cost_of(split: Split) -> float:
            here = np.flatnonzero((cands == split).all(axis=1))
            return float(costs[here[0]]) if len(here) else math.inf  # inf: a phase unserved

        cost_now, cost_ref = cost_of(cur), cost_of(ref)
        best = _split(cands[int(np.argmin(costs))])
        leave = np.maximum(np.array(cur) - cands, 0)  # engines each candidate takes from a role
        pick = self._goal(cur, cands, costs, leave, cost_ref, movers, forecast.horizon_s, skip=ref)
        head = f"{_fmt(cur)} {cost_now:.1f} seq-s, best {_fmt(best)} {float(costs.min()):.1f}"
        if ref != cur:
            head += f", toward {_fmt(ref)} {cost_ref:.1f}"
        if pick is None or not (math.isinf(cost_ref) or cost_ref - pick.net > self.min_gain * cost_ref):
            reachable = ref != cur and (np.maximum(np.array(cur) - ref, 0) <= np.array(movers.counts())).all()
            if not reachable:
                why = "nothing can move" if pick is None else (
                    f"{_fmt(pick.split)} gains {cost_ref - pick.cost:.1f}, needs {self.hysteresis:g}x "
                    f"switch {pick.switch_cost:.2f} + {self.min_gain:.0%}")
                return Plan({}, cur, ref, cur, best, cost_now, cost_ref, 0.0, f"keep {head}: {why}",
                            forecast.summary())
            moves, _ = movers.moves(cur, ref)
            pick = _Pick(cost_ref, ref, moves, cost_ref, 0.0)
        step = self._step(cur, pick.split, cands, costs, leave, movers.counts())
        now = dict(pick.moves[:self.max_switches] if step is None else movers.moves(cur, step)[0])
        nxt = count_roles([now.get(e.engine_id, e.role) for e in engines])
        return Plan(now, cur, pick.split, nxt, best, cost_now, pick.cost, pick.switch_cost,
                    f"move to {_fmt(pick.split)} via {_fmt(nxt)}: gain {cost_ref - pick.cost:.1f} "
                    f"seq-s over {forecast.horizon_s:g} s beats {self.hysteresis:g}x switch "
                    f"{pick.switch_cost:.2f}; {head}", forecast.summary())

    def _priced(self, fc: Forecast, cur: Split, ref: Split, movable: Split) -> tuple[np.ndarray, np.ndarray]:
        """The splits worth pricing this interval, in (P, D, M) order, and their costs: every split
        of a few engines; past search.exact_side, a search of all splits (for the best) and of the
        reachable ones (the goal: each at least cur - movable), with cur, the anchor and every split
        this interval's cap reaches (the step) priced too."""
        n = sum(cur)

        def price(c: np.ndarray) -> np.ndarray:
            return score(self.capacity, fc, c[:, 0], c[:, 1], c[:, 2])

        if self.search.exhaustive(n):
            cands = splits(n)
            return cands, price(cands)
        reachable = tuple(int(x) for x in np.array(cur) - movable)
        return self.search.priced(price, n, floors=((0, 0, 0), reachable), seeds=(cur, ref),
                                  also=within(cur, min(self.max_switches, MAX_STEP_MOVES), n))

    def _goal(self, cur: Split, cands: np.ndarray, costs: np.ndarray, leave: np.ndarray,
              cost_now: float, movers: _Movers, horizon_s: float, skip: Split | None = None) -> _Pick | None:
        """The reachable split other than `skip` with the least cost + hysteresis x switch cost, or None."""
        k = leave.sum(1)
        ok = (leave <= np.array(movers.counts())).all(1) & (k > 0)
        if skip is not None:
            ok &= ~(cands == skip).all(1)
        ok = np.flatnonzero(ok)
        order = ok[np.lexsort((cands[ok, 2], cands[ok, 1], cands[ok, 0], k[ok], costs[ok]))]
        pick = None
        for i in order[:self.max_scan]:  # by cost, then fewest moves
            if pick is not None and costs[i] >= pick.net:
                break  # no candidate from here on can beat the pick once switches are added
            gain = cost_now - float(costs[i]) if math.isfinite(cost_now) else 0.0
            sw = max(gain, 0.0) * min(movers.slowest(cur, _split(cands[i])) / horizon_s, 1.0)
            net = float(costs[i]) + self.hysteresis * sw
            if pick is None or net < pick.net:
                pick = _Pick(net, _split(cands[i]), [], float(costs[i]), sw)
        return None if pick is None else pick._replace(moves=movers.moves(cur, pick.split)[0])

    def _step(self, cur: Split, goal: Split, cands: np.ndarray, costs: np.ndarray,
              leave: np.ndarray, movable: Split) -> Split | None:
        """The best-scoring split on the way from cur to goal within this interval's cap: when
        the goal is several moves away, the order of the moves matters (adding decode engines
        before the prefill ones, say, can be worse than either end)."""
        lo, hi = np.minimum(cur, goal), np.maximum(cur, goal)
        k = leave.sum(1)
        ok = np.flatnonzero((cands >= lo).all(1) & (cands <= hi).all(1) & (k >= 1)
                            & (k <= self.max_switches) & (leave <= np.array(movable)).all(1))
        if len(ok) == 0:
            return None
        return _split(cands[min(ok, key=lambda i: (costs[i], -k[i], tuple(cands[i])))])


class _Pick(NamedTuple):
    net: float  # cost + hysteresis x switch cost
    split: Split
    moves: list[tuple[str, Role]]  # every move to it, cheapest engines first
    cost: float
    switch_cost: float


class _Movers:
    """The unlocked engines of each role, cheapest first, and what each would take to switch."""

    def __init__(self, cap: Capacity, engines: Sequence[EngineLoad], locked: Collection[str],
                 remaining_tokens: float):
        free = cheapest_first([e for e in engines if e.engine_id not in locked])
        self.rank = {e.engine_id: i for i, e in enumerate(free)}
        self.pools = {r: [e for e in free if e.role is r] for r in ROLES}
        # A mixed engine turning decode already serves decode, so its gain starts at once; any
        # other engine gains nothing until it has drained.
        self.drain = {(e.engine_id, r): 0.0 if e.role is Role.MIXED and r is Role.DECODE
                      else cap.drain_time(e, r, remaining_tokens)
                      for e in free for r in ROLES if r is not e.role}
        # each engine's other roles, the one it drains into fastest first (a goal is priced for
        # thousands of candidate splits an interval: sort once)
        self.prefer = {e.engine_id: sorted((r for r in ROLES if r is not e.role),
                                           key=lambda r, e=e: (self.drain[e.engine_id, r], ROLES.index(r)))
                       for e in free}

        # per role, each other role: the drains of the role's engines in order, and their running maximum
        self.drains = {(r, to): np.array([self.drain[e.engine_id, to] for e in self.pools[r]], dtype=float)
                       for r in ROLES for to in ROLES if to is not r}
        self.peak = {k: np.maximum.accumulate(v) for k, v in self.drains.items()}
        # per role, whether each engine drains into the first other role (ROLES order) faster
        self.first = {r: np.array([self.prefer[e.engine_id][0] is one for e in self.pools[r]], dtype=bool)
                      for r in ROLES for one in _others(r)[:1]}

    def counts(self) -> Split:
        return len(self.pools[Role.PREFILL]), len(self.pools[Role.DECODE]), len(self.pools[Role.MIXED])

    def slowest(self, cur: Split, goal: Split) -> float:
        """max(self.moves(cur, goal)[1]) without listing the moves: a goal is priced for many
        candidate splits an interval, and at a thousand engines a move list is hundreds long."""
        gainers = [r for k, r in enumerate(ROLES) if goal[k] > cur[k]]
        losing = {r: cur[k] - goal[k] for k, r in enumerate(ROLES) if cur[k] > goal[k]}
        if len(gainers) == 1:  # every leaving engine goes to the one role that gains
            return max(float(self.peak[r, gainers[0]][n - 1]) for r, n in losing.items())
        # one role loses, the other two gain: engines take the role they prefer, in order, until
        # one role has all it needs; the rest go to the other
        (r, n), = losing.items()
        one, two = _others(r)
        want_one = goal[ROLES.index(one)] - cur[ROLES.index(one)]
        first = self.first[r][:n]
        took_one = np.cumsum(first)
        took_two = np.arange(1, n + 1) - took_one
        full = np.flatnonzero((took_one == want_one) | (took_two == n - want_one))
        t = int(full[0]) + 1  # engines [0, t) had their pick
        rest = one if took_two[t - 1] == n - want_one else two
        picked = np.where(first[:t], self.drains[r, one][:t], self.drains[r, two][:t])
        return float(max(picked.max(), self.drains[r, rest][t:n].max(initial=0.0)))

    def moves(self, cur: Split, goal: Split) -> tuple[list[tuple[str, Role]], list[float]]:
        """(engine, new role) for cur -> goal, cheapest engines first, each to the missing role it
        drains into fastest; and each move's drain time."""
        need = {r: max(0, goal[k] - cur[k]) for k, r in enumerate(ROLES)}
        leaving = [e.engine_id for k, r in enumerate(ROLES) for e in self.pools[r][:max(0, cur[k] - goal[k])]]
        out: list[tuple[str, Role]] = []
        drains: list[float] = []
        for e in sorted(leaving, key=self.rank.__getitem__):
            to = next(r for r in self.prefer[e] if need[r] > 0)
            need[to] -= 1
            out.append((e, to))
            drains.append(self.drain[e, to])
        return out, drains


def prefill_turn(fc: Forecast) -> tuple[float, float, float]:
    """The horizon's mean prefill turn: tokens appended, tokens a prefill engine computes for it
    (a turn not fresh from the backlog recomputes its last decode too) and the prefix cached."""
    turns = fc.prefill_turns_per_s.sum() * fc.bin_s + fc.backlog_turns
    a = (fc.prefill_tokens_per_s.sum() * fc.bin_s + fc.backlog_tokens) / turns if turns > 0 else 1.0
    a = max(a, 1.0)
    fresh = fc.backlog_fresh_turns / turns if turns > 0 else 0.0
    return a, a + (1.0 - fresh) * fc.decode_tokens_per_turn, fc.prefill_prefix_tokens


def score(cap: Capacity, fc: Forecast, P: np.ndarray, D: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Predicted sequence-seconds over the horizon for each split (the module docstring)."""
    P, D, M = (np.asarray(x, dtype=float) for x in (P, D, M))
    cp, cd, cm = (cap.for_role(r) for r in ROLES)  # each is `cap` itself without per-role parallelism
    ed = (D + M).astype(int)  # engines that decode
    dt, chunk = fc.bin_s, float(cap.chunk_tokens)
    a, a_p, prefix = prefill_turn(fc)
    rate_p = cp.prefill_rate(a_p, prefix) * a  # appended tokens/s one prefill engine clears
    lat_p = cp.prefill_latency(a_p, prefix) + cd.transfer_time(a)  # the decode engine pulls
    piece = min(a, chunk)
    q = np.full(len(P), float(fc.backlog_tokens))
    cost = np.zeros(len(P))
    cap_m = np.zeros(len(P))
    owed = np.zeros(len(P))  # decode tokens behind the forecast's pace, carried over
    tps = np.zeros(len(P))
    u = fc.decode_tps_per_seq * dt  # tokens a forecast sequence decodes in one bin
    for b in range(fc.n_bins):
        s = float(fc.decode_seqs[b])
        ctx = fc.kv_tokens[b] / s if s > 1e-9 else max(prefix, 1.0)
        per, per_m = cd.max_decode_seqs(ctx), cm.max_decode_seqs(ctx)
        # Decode: the forecast's sequences plus those a slower split left behind, spread over
        # the decode engines up to their slots; step times are piecewise linear in the batch.
        present = s + (owed / u if u > 0 else 0.0)
        served = np.minimum(present, ed * per if per == per_m else D * per + M * per_m)
        beta = served / np.maximum(ed, 1)
        grid = np.linspace(0.0, max(per, per_m, 1e-9), 17)
        td, tp, tc = (np.interp(beta, grid, ys) for ys in (
            cd.decode_steps(grid, ctx), cm.mixed_steps(grid, ctx, piece, a, prefix),
            cm.mixed_steps(grid, ctx, chunk, a, prefix)))
        # Prefill: prefill engines first, mixed engines take the overflow.
        arriving = float(fc.prefill_tokens_per_s[b])
        want = q / dt + arriving
        x_p = np.minimum(want, P * rate_p)
        cap_m = M * cm.ranks * chunk / tc
        x_m = np.minimum(want - x_p, cap_m)
        q_next = np.maximum(q + (arriving - x_p - x_m) * dt, 0.0)
        per_rank = np.divide(x_m, M * cm.ranks, out=np.zeros_like(M, dtype=float), where=M > 0)
        tau_m = _mixed_step(td, tp, tc, per_rank, piece, chunk, cm.ranks)
        tau = (D * td + M * tau_m) / np.maximum(ed, 1)
        tps = np.divide(served, tau, out=np.zeros_like(tau), where=tau > 0)
        owed = np.maximum(present * u - tps * dt, 0.0)
        cost += served * np.minimum(dt, u * tau) + (present - served) * dt  # present: all count
        cost += (q + q_next) / 2 * dt / a  # turns waiting for prefill
        cost += (x_p * lat_p + x_m * math.ceil(a / chunk) * tau_m) * dt / a  # turns prefilling
        q = q_next
    # What is left at the horizon, drained at the last bin's pace (a triangle of waiting).
    cost += q * q / (2 * a * np.maximum(P * rate_p + cap_m, 1e-9))
    left = owed / u if u > 0 else np.zeros_like(owed)
    return cost + np.divide(left * owed, 2 * tps, out=np.zeros_like(owed), where=tps > 0)


def _mixed_step(td: np.ndarray, tp: np.ndarray, tc: np.ndarray, load: np.ndarray, piece: float,
                chunk: float, ep: int) -> np.ndarray:
    """Mean step of a mixed engine whose ranks each clear `load` prefill tokens/s beside their decodes.

    The step grows piecewise linearly with the prefill tokens x it carries: td at 0, tp at one
    piece (an append, at most a chunk), tc at a full chunk; x = load x step, solved in closed form.
    Below one piece per step only a share rho of steps carry one, and with DP attention (ep ranks)
    a step waits whenever any rank does: 1 - (1 - rho)^ep of them, solved by iteration from below.
    """
    m1 = (tp - td) / piece
    m2 = (tc - tp) / max(chunk - piece, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        small = np.where(load * m1 < 1, td / (1 - load * m1), np.inf)
        big = np.where(load * m2 < 1, (tp - piece * m2) / (1 - load * m2), np.inf)
    tau = np.where(load * small < piece, small, np.minimum(big, tc))
    if ep > 1:
        # Each split iterates until its own step settles, whatever the others priced beside it do:
        # a split's cost must not depend on which splits are priced with it (control/split_search.py).
        tau = tau.copy()
        go = np.arange(len(tau))
        td, tp, tc, m2, load = (np.broadcast_to(a, tau.shape) for a in (td, tp, tc, m2, load))
        for _ in range(20):
            prev = tau[go]
            x = np.minimum(load[go] * prev, chunk)
            rho = np.minimum(x / piece, 1.0)
            now = np.where(x < piece, td[go] + (1 - (1 - rho) ** ep) * (tp[go] - td[go]),
                           np.minimum(tp[go] + (x - piece) * m2[go], tc[go]))
            tau[go] = now
            # it mostly settles in a few rounds; np.allclose's test, at a tenth of its cost
            go = go[np.abs(now - prev) > 1e-6 * np.abs(prev)]
            if len(go) == 0:
                break
    return tau


def _others(role: Role) -> tuple[Role, Role]:
    """The two roles other than `role`, in ROLES order."""
    a, b = (r for r in ROLES if r is not role)
    return a, b


def _split(row: np.ndarray) -> Split:
    return int(row[0]), int(row[1]), int(row[2])


def _fmt(s: Split) -> str:
    return f"P{s[0]} D{s[1]} M{s[2]}"
