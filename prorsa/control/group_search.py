"""Splits over engine groups: role counts per group, each group's engines priced as themselves.

    Group(count, roles, capacity)                  engines alike (engines.groups), the roles they may
                                                   take (the opening one first), what one serves
    group_counts(groups, roles) -> GroupSplit      the (P, D, M) of each group in a role list
    group_roles(groups, split) -> list[Role]       a split's roles, engine by engine, in group order
    group_splits(groups) -> (k, G, 3) ints         every split within the groups' roles serving both phases
    score_groups(groups, forecast, counts) -> (k,) predicted sequence-seconds of each split
    GroupAllocator(groups, ...).plan(forecast, engines, locked, anchor) -> Plan   once per control interval

A split over G groups is one (P, D, M) per group, each summing to the group's count and zero in a
role the group may not take. score_groups is allocator.score's fluid model with each group priced
by its own cost model and slots: prefill engines of every group serve first (each at its own rate),
mixed engines take the overflow in proportion to what each clears, and the decode sequences fill
every decoding engine to the same share of its slots (a wide engine holds more of them). With one
group it is score() exactly (tests/test_group_search.py).

Which splits are priced: all of them while there are at most GroupAllocator.exact (4,096); past
that, a descent over groups from the current split and the anchor: each round searches each group's
counts with the other groups held (split_search.SplitSearch: every split of a group up to its
exact_side engines, coarse-to-fine past that) and every trade of one engine's role between two
groups, and takes the best of them, until a round finds nothing better.
Splits within this interval's cap of the current one are always priced (the step toward a goal).
The goal and its switches follow allocator.Allocator: least cost + hysteresis x switch cost (the
slowest drain of any group's moves), adopted only past min_gain, at most max_switches moves now.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from prorsa.control.allocator import ROLES, Capacity, Plan, PlanSummary, Split, _mixed_step, _Movers, prefill_turn
from prorsa.control.forecast import Forecast
from prorsa.control.split_search import SplitSearch
from prorsa.loads import EngineLoad
from prorsa.roles import Role

GroupSplit = tuple[Split, ...]  # (P, D, M) of each group, in group order


@dataclass(frozen=True)
class Group:
    count: int  # engines in the group
    roles: tuple[Role, ...]  # the roles they may take, the opening one first
    capacity: Capacity  # what one of them serves (its own cost model, slots and KV)


def group_counts(groups: Sequence[Group], roles: Sequence[Role]) -> GroupSplit:
    out, at = [], 0
    for g in groups:
        mine = roles[at:at + g.count]
        out.append(tuple(sum(r is role for r in mine) for role in ROLES))
        at += g.count
    return tuple(out)


def group_roles(groups: Sequence[Group], split: GroupSplit) -> list[Role]:
    return [role for counts in split for role, n in zip(ROLES, counts) for _ in range(n)]


def openings(groups: Sequence[Group]) -> GroupSplit:
    """Every engine in its group's opening role."""
    return tuple(tuple(g.count if r is g.roles[0] else 0 for r in ROLES) for g in groups)


def most_mixed(groups: Sequence[Group]) -> GroupSplit:
    """Every engine mixed where its group allows it, else in its opening role (colocated's opening)."""
    return tuple(tuple(g.count if r is (Role.MIXED if Role.MIXED in g.roles else g.roles[0]) else 0 for r in ROLES)
                 for g in groups)


def _triangle(g: Group) -> np.ndarray:
    """Every (P, D, M) of one group within its roles; (k, 3) ints."""
    n = g.count
    out = [(p, d, n - p - d) for p in range(n + 1) for d in range(n + 1 - p)]
    ok = [s for s in out if all(c == 0 or r in g.roles for c, r in zip(s, ROLES))]
    return np.array(ok, dtype=int).reshape(-1, 3)


def serves_both(counts: np.ndarray) -> np.ndarray:
    """(k, G, 3) -> (k,) whether some engine prefills and some decodes."""
    tot = counts.sum(axis=1)
    return (tot[:, 0] + tot[:, 2] >= 1) & (tot[:, 1] + tot[:, 2] >= 1)


def n_splits(groups: Sequence[Group]) -> int:
    return math.prod(len(_triangle(g)) for g in groups)


def group_splits(groups: Sequence[Group]) -> np.ndarray:
    """Every split of the groups within their roles that serves both phases, in group-major
    (P, D, M) order; (k, G, 3) ints."""
    parts = [_triangle(g) for g in groups]
    idx = np.array(list(itertools.product(*(range(len(p)) for p in parts))), dtype=int).reshape(-1, len(parts))
    counts = np.stack([parts[j][idx[:, j]] for j in range(len(parts))], axis=1)
    return counts[serves_both(counts)]


@dataclass(frozen=True)
class _Prices:
    """What score_groups prices alike in every bin: each group's capacity in each role, the turn a
    prefill serves, and each group's per-engine prefill rate and latency, KV pull and ranks."""

    roles: list[tuple]  # (prefill, decode, mixed) capacity of each group
    a: float  # a prefill turn's tokens (prefill_turn)
    a_p: float
    prefix: float
    chunk: float
    rate_p: np.ndarray  # (G,)
    lat_p: np.ndarray
    xfer: np.ndarray  # the decode engine pulls
    ranks: np.ndarray

    @classmethod
    def of(cls, groups: Sequence[Group], fc: Forecast) -> _Prices:
        roles = [tuple(g.capacity.for_role(r) for r in ROLES) for g in groups]
        a, a_p, prefix = prefill_turn(fc)
        return cls(roles, a, a_p, prefix, float(groups[0].capacity.chunk_tokens),
                   np.array([cp.prefill_rate(a_p, prefix) * a for cp, _, _ in roles]),
                   np.array([cp.prefill_latency(a_p, prefix) for cp, _, _ in roles]),
                   np.array([cd.transfer_time(a) for _, cd, _ in roles]),
                   np.array([cm.ranks for _, _, cm in roles], dtype=float))

    def steps(self, per: np.ndarray, per_m: np.ndarray, fill: np.ndarray, ctx: float) -> list[tuple]:
        """Each group's decode step and mixed steps (a piece, a whole chunk) at this bin's fill."""
        piece, out = min(self.a, self.chunk), []
        for j, (_, cd, cm) in enumerate(self.roles):
            grid = np.linspace(0.0, max(per[j], per_m[j], 1e-9), 17)
            beta_d, beta_m = fill * per[j], fill * per_m[j]
            td = np.interp(beta_d, grid, cd.decode_steps(grid, ctx))
            a, prefix = self.a, self.prefix
            tp, tc = (np.interp(beta_m, grid, ys) for ys in (cm.mixed_steps(grid, ctx, piece, a, prefix),
                                                             cm.mixed_steps(grid, ctx, self.chunk, a, prefix)))
            out.append((td, tp, tc))
        return out


def score_groups(groups: Sequence[Group], fc: Forecast, counts: np.ndarray) -> np.ndarray:
    """Predicted sequence-seconds over the horizon of each split (k, G, 3) (module docstring)."""
    counts = np.asarray(counts, dtype=float)
    P, D, M = (counts[:, :, k] for k in range(3))  # (k, G)
    pr = _Prices.of(groups, fc)
    dt, chunk, a, prefix, roles, ranks = fc.bin_s, pr.chunk, pr.a, pr.prefix, pr.roles, pr.ranks
    cap_p = P @ pr.rate_p
    # a prefill's latency: each group's, weighted by the turns it clears; its KV's pull into a
    # decode engine, weighted by the decode slots each group holds (where the decode lands)
    lat_own = np.divide((P * pr.rate_p) @ pr.lat_p, cap_p, out=np.zeros(len(P)), where=cap_p > 0)
    piece = min(a, chunk)
    k = len(P)
    q = np.full(k, float(fc.backlog_tokens))
    cost, cap_m, owed, tps = np.zeros(k), np.zeros(k), np.zeros(k), np.zeros(k)
    u = fc.decode_tps_per_seq * dt
    for b in range(fc.n_bins):
        s = float(fc.decode_seqs[b])
        ctx = fc.kv_tokens[b] / s if s > 1e-9 else max(prefix, 1.0)
        per = np.array([cd.max_decode_seqs(ctx) for _, cd, _ in roles])
        per_m = np.array([cm.max_decode_seqs(ctx) for _, _, cm in roles])
        held = D * per + M * per_m  # (k, G) decode slots of each group
        slots = held.sum(axis=1)
        present = s + (owed / u if u > 0 else 0.0)
        served = np.minimum(present, slots)
        fill = np.divide(served, slots, out=np.zeros(k), where=slots > 0)  # every engine to this share
        lat = lat_own + np.divide(held @ pr.xfer, slots, out=np.zeros(k), where=slots > 0)
        arriving = float(fc.prefill_tokens_per_s[b])
        want = q / dt + arriving
        x_p = np.minimum(want, cap_p)
        steps = pr.steps(per, per_m, fill, ctx)
        cap_mg = np.stack([M[:, j] * ranks[j] * chunk / tc for j, (_, _, tc) in enumerate(steps)], axis=1)
        cap_m = cap_mg.sum(axis=1)
        x_m = np.minimum(want - x_p, cap_m)
        q_next = np.maximum(q + (arriving - x_p - x_m) * dt, 0.0)
        share = np.divide(x_m, cap_m, out=np.zeros(k), where=cap_m > 0)  # of what each mixed engine clears
        # the decode step: every decoding engine's, weighted by the sequences it holds (score()'s
        # mean over engines where they hold alike: engines alike priced the same in one group or two)
        weighted, pre_m = np.zeros(k), np.zeros(k)
        for j, (td, tp, tc) in enumerate(steps):
            tau_m = _mixed_step(td, tp, tc, share * chunk / tc, piece, chunk, int(ranks[j]))
            weighted += fill * (D[:, j] * per[j] * td + M[:, j] * per_m[j] * tau_m)
            pre_m += share * cap_mg[:, j] * math.ceil(a / chunk) * tau_m
        tau = np.divide(weighted, served, out=np.zeros(k), where=served > 0)
        tps = np.divide(served, tau, out=np.zeros(k), where=tau > 0)
        owed = np.maximum(present * u - tps * dt, 0.0)
        cost += served * np.minimum(dt, u * tau) + (present - served) * dt
        cost += (q + q_next) / 2 * dt / a
        cost += (x_p * lat + pre_m) * dt / a
        q = q_next
    cost += q * q / (2 * a * np.maximum(cap_p + cap_m, 1e-9))
    left = owed / u if u > 0 else np.zeros_like(owed)
    return cost + np.divide(left * owed, 2 * tps, out=np.zeros_like(owed), where=tps > 0)


@dataclass(frozen=True)
class GroupPlan(Plan):
    """A Plan whose splits are one (P, D, M) per group; its summary gives the goal's totals."""

    def summary(self) -> PlanSummary:
        p, d, m = (float(sum(s[k] for s in self.goal)) for k in range(3))
        return PlanSummary(**_fields(self.forecast), cost_now_seq_s=self.cost_now, cost_goal_seq_s=self.cost_goal,
                           switch_cost_seq_s=self.switch_cost, goal_prefill=p, goal_decode=d, goal_mixed=m)


def _fields(summary) -> dict:
    from dataclasses import asdict  # noqa: PLC0415

    return asdict(summary)


class GroupAllocator:
    """allocator.Allocator over a split per group (module docstring)."""

    def __init__(self, groups: Sequence[Group], hysteresis: float = 2.0, max_switches_per_interval: int = 1,
                 min_gain: float = 0.05, max_scan: int = 256, exact: int = 4096,
                 search: SplitSearch = SplitSearch()):
        if hysteresis < 0 or min_gain < 0 or max_switches_per_interval < 0:
            raise ValueError("hysteresis, min_gain and max_switches_per_interval must be >= 0")
        self.groups = tuple(groups)
        self.hysteresis, self.max_switches, self.min_gain = hysteresis, max_switches_per_interval, min_gain
        self.max_scan, self.exact, self.search = max_scan, exact, search
        self._all = group_splits(self.groups) if n_splits(self.groups) <= exact else None

    def priced(self, price, starts: Sequence[GroupSplit] = (), also: Sequence[GroupSplit] = ()
               ) -> tuple[np.ndarray, np.ndarray]:
        """The splits worth pricing (every one up to `exact`, else a descent over groups from each
        of `starts`, with `also` priced besides) and their costs; `price`: (k, G, 3) -> (k,)."""
        if self._all is not None:
            return self._all, price(self._all)
        seen = _Seen(price, len(self.groups))
        seen.add(np.array([*starts, *also], dtype=int).reshape(-1, len(self.groups), 3))
        for start in dict.fromkeys(starts):
            here = start
            while True:  # the best single group's change each round (the first found can lead astray)
                moves = [self._descend(j, g, here, seen) for j, g in enumerate(self.groups)]
                moves.append(self._trade(here, seen))
                best = min(moves, key=lambda s: (seen.get(s), s))
                if seen.get(best) >= seen.get(here):
                    break
                here = best
        return seen.result()

    def _descend(self, j: int, g: Group, at: GroupSplit, seen: _Seen) -> GroupSplit:
        """The best counts of group j with the others held at `at` (the split search over its triangle)."""
        rest = np.array(at, dtype=int)
        barred = np.array([r not in g.roles for r in ROLES])

        def price_j(c: np.ndarray) -> np.ndarray:
            full = np.repeat(rest[None], len(c), axis=0)
            full[:, j] = c
            out = np.full(len(c), math.inf)
            ok = ~(c[:, barred] > 0).any(axis=1)
            out[ok] = seen.add(full[ok])
            return out

        if g.count <= self.search.exact_side:
            cands = _triangle(g)
            costs = price_j(cands)
        else:  # the split search of one group's triangle, and its corners (one role alone), which it skips
            cands, costs = self.search.priced(price_j, g.count, seeds=(at[j],))
            corners = np.eye(3, dtype=int) * g.count
            cands, costs = np.concatenate([cands, corners]), np.concatenate([costs, price_j(corners)])
        best = tuple(int(x) for x in cands[int(np.argmin(costs))])
        if not math.isfinite(float(costs.min())) or seen.get(at) <= float(costs.min()):
            return at
        return tuple(best if i == j else s for i, s in enumerate(at))

    def _trade(self, at: GroupSplit, seen: _Seen) -> GroupSplit:
        """The best of `at` and every split one move away in each of two groups: a role handed
        from one group to another (a prefill engine moved from the small engines to the wide
        ones, say), which a descent one group at a time cannot take, as either half alone is worse."""
        one = [[s for s in self._steps(at, np.full((len(self.groups), 3), 1 << 30)) if s[j] != at[j]]
               for j in range(len(self.groups))]
        pairs = [tuple(a[i] if i == j else b[i] if i == h else at[i] for i in range(len(at)))
                 for j, h in itertools.combinations(range(len(at)), 2) for a in one[j] for b in one[h]]
        pairs = [p for p in pairs if all(min(c) >= 0 for c in p)]
        if not pairs:
            return at
        seen.add(np.array(pairs, dtype=int))
        best = min(pairs, key=lambda p: (seen.get(p), p))
        return best if seen.get(best) < seen.get(at) else at

    def plan(self, forecast: Forecast, engines: Sequence[EngineLoad], locked: Collection[str] = (),
             anchor: GroupSplit | None = None) -> GroupPlan:
        cur = group_counts(self.groups, [e.role for e in engines])
        ref = cur if anchor is None or len(anchor) != len(cur) else anchor
        at, movers = 0, []
        for g in self.groups:  # each group's engines priced and drained as themselves
            mine = engines[at:at + g.count]
            movers.append(_Movers(g.capacity, mine, locked, forecast.decode_remaining_tokens))
            at += g.count
        movable = np.array([m.counts() for m in movers])  # (G, 3)
        steps = self._steps(cur, movable)
        cands, costs = self.priced(lambda c: score_groups(self.groups, forecast, c), starts=(cur, ref), also=steps)
        index = {_key(c): i for i, c in enumerate(cands)}

        def cost_of(split: GroupSplit) -> float:
            i = index.get(split)
            return math.inf if i is None else float(costs[i])

        cost_now, cost_ref = cost_of(cur), cost_of(ref)
        best = _key(cands[int(np.argmin(costs))])
        leave = np.maximum(np.array(cur)[None] - cands, 0)  # (k, G, 3)
        reach = (leave <= movable[None]).all(axis=(1, 2))
        k = leave.sum(axis=(1, 2))
        head = f"{fmt(cur)} {cost_now:.1f} seq-s, best {fmt(best)} {float(costs.min()):.1f}"
        pick = self._goal(cur, ref, _Candidates(cands, costs, k, reach), cost_ref, movers, forecast.horizon_s)
        if pick is None or not (math.isinf(cost_ref) or cost_ref - pick[0] > self.min_gain * cost_ref):
            if not (ref != cur and ref in index and bool(reach[index[ref]])):
                why = "nothing can move" if pick is None else f"{fmt(pick[1])} gains {cost_ref - pick[2]:.1f}, too little"
                return GroupPlan({}, cur, ref, cur, best, cost_now, cost_ref, 0.0, f"keep {head}: {why}",
                                 forecast.summary())
            pick = (cost_ref, ref, cost_ref, 0.0)
        _, goal, cost_goal, sw = pick
        lo, hi = np.minimum(cur, goal), np.maximum(cur, goal)
        on_way = ((cands >= lo[None]).all(axis=(1, 2)) & (cands <= hi[None]).all(axis=(1, 2)) & (k >= 1)
                  & (k <= self.max_switches) & reach)
        ok = np.flatnonzero(on_way)
        step = goal if len(ok) == 0 else _key(cands[min(ok, key=lambda i: (costs[i], -k[i], _key(cands[i])))])
        now: dict[str, Role] = {}
        for m, c, s in zip(movers, cur, step):
            if c != s:
                now.update(m.moves(c, s)[0])
        now = dict(list(now.items())[:max(self.max_switches, 0)])
        nxt = group_counts(self.groups, [now.get(e.engine_id, e.role) for e in engines])
        return GroupPlan(now, cur, goal, nxt, best, cost_now, cost_goal, sw,
                         f"move to {fmt(goal)} via {fmt(nxt)}: gain {cost_ref - cost_goal:.1f} seq-s over "
                         f"{forecast.horizon_s:g} s beats {self.hysteresis:g}x switch {sw:.2f}; {head}",
                         forecast.summary())

    def _steps(self, cur: GroupSplit, movable: np.ndarray) -> list[GroupSplit]:
        """Splits one move from cur (priced always: a descent may pass them by)."""
        out = []
        for j, g in enumerate(self.groups):
            for a, b in itertools.permutations(range(3), 2):
                if movable[j, a] > 0 and ROLES[b] in g.roles:
                    s = list(cur[j])
                    s[a] -= 1
                    s[b] += 1
                    out.append(tuple(tuple(s) if i == j else c for i, c in enumerate(cur)))
        return out

    def _goal(self, cur, ref, priced: _Candidates, cost_ref, movers, horizon_s):
        """(net, split, cost, switch cost) of the reachable split other than ref with the least
        cost + hysteresis x switch cost, or None."""
        cands, costs, k, reach = priced.splits, priced.costs, priced.moves, priced.reach
        ok = np.flatnonzero(reach & (k > 0) & ~(cands == np.array(ref)[None]).all(axis=(1, 2)))
        order = ok[np.lexsort((k[ok], costs[ok]))]
        pick = None
        for i in order[:self.max_scan]:
            if pick is not None and costs[i] >= pick[0]:
                break
            split = _key(cands[i])
            gain = cost_ref - float(costs[i]) if math.isfinite(cost_ref) else 0.0
            slowest = max(m.slowest(c, s) for m, c, s in zip(movers, cur, split) if c != s)
            sw = max(gain, 0.0) * min(slowest / horizon_s, 1.0)
            net = float(costs[i]) + self.hysteresis * sw
            if pick is None or net < pick[0]:
                pick = (net, split, float(costs[i]), sw)
        return pick


@dataclass(frozen=True)
class _Candidates:
    """The splits priced this interval, and for each its cost, the engines it moves from cur and
    whether the movable engines reach it."""

    splits: np.ndarray  # (k, G, 3)
    costs: np.ndarray  # (k,)
    moves: np.ndarray  # (k,)
    reach: np.ndarray  # (k,) bool


class _Seen:
    """The splits priced so far in a descent and their costs, each priced once (keyed by its bytes:
    thousands are looked up each round)."""

    def __init__(self, price, groups: int) -> None:
        self.price, self.groups = price, groups
        self.costs: dict[bytes, float] = {}

    def add(self, cands: np.ndarray) -> np.ndarray:
        """The costs of `cands` (k, G, 3), pricing the new ones; inf for a split that serves only one phase."""
        cands = np.ascontiguousarray(cands, dtype=np.int64).reshape(-1, self.groups, 3)
        keys = [row.tobytes() for row in cands]
        ok = serves_both(cands)
        new = [i for i, k in enumerate(keys) if ok[i] and k not in self.costs]
        if new:
            for i, v in zip(new, self.price(cands[new])):
                self.costs[keys[i]] = float(v)
        return np.array([self.costs.get(k, math.inf) for k in keys])

    def get(self, split: GroupSplit) -> float:
        return self.costs.get(np.array(split, dtype=np.int64).tobytes(), math.inf)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """Every split priced, in group-major (P, D, M) order, and its cost."""
        flat = np.frombuffer(b"".join(self.costs), dtype=np.int64).reshape(-1, self.groups, 3)
        costs = np.array(list(self.costs.values()))
        order = np.lexsort(flat.reshape(len(flat), -1).T[::-1])
        return flat[order].copy(), costs[order]


def _key(c: np.ndarray) -> GroupSplit:
    return tuple(tuple(int(x) for x in row) for row in c)


def fmt(split: GroupSplit) -> str:
    return " | ".join("P{} D{} M{}".format(*s) for s in split)
