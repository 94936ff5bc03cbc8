"""The tail: what isolating the longest trajectories on engines of their own could gain (simulated).

A synchronous step ends with its slowest trajectories, which decode in full batches of long
contexts for most of their lives (docs/notes/tail-scheduling.md). Giving them engines of their
own, few to an engine, shortens their steps at the cost of crowding the rest onto fewer engines.
This measures the ceiling of that placement and what a run could know of it, on the paper table's
SWE and math-tir sync cells, colocated (the router's `reserve`: a reserved trajectory runs every
leg on its engine from its next turn, no other trajectory goes there):

    oracle-traj k/r     the k trajectories with the most decode tokens, read off the workload (the
                        simulator's alone), on r reserved engines from their first turn
    oracle-groups k/r   the same by whole GRPO groups (k/8 groups of 8): the level at which a run
                        could know anything early, since a group's members share their task
    oracle-late k/r     the best oracle-traj k/r of the cell, reserved only once 90% of the
                        trajectories have begun their second turn (the earliest a run has seen a
                        decode of each): what a move after the first turn costs
    predicted g/r       the g groups whose members decoded the most tokens a turn so far, ranked
                        at that same moment, on r engines: what the run itself could do
    predicted-traj k/r  the same by single trajectories: the k that decoded the most a turn so far

Reported per cell, over seeds 0-3: makespan over the lower bound (sim/bounds.py), each variant at
the best point of its grid for that seed (chosen in hindsight, which flatters the predicted ones
too), median over the seeds; and for seed 0 against the better of colocated and the best fixed
split of `tail.py` (benchmarks/results/tail.json). Virtual time: deterministic.

    .venv/bin/python benchmarks/tail_reserve.py [--workers 2] [--out benchmarks/results/tail-reserve.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from progress import each_done  # noqa: E402

CELLS = [("paper", f, m, 0, "sync") for f in ("swe", "math-tir") for m in ("dense", "moe")]
TRAJ_GRID = [(k, r) for r in (1, 2, 3, 4) for k in (4, 8, 12, 16, 24, 32, 48) if 4 <= k / r <= 16]
GROUP_GRID = [(8 * g, r) for g in (1, 2, 3, 4, 6) for r in (1, 2, 3, 4) if r <= g]
PREDICTED = [(g, g) for g in (1, 2, 3, 4)]
PREDICTED_TRAJ = [(8 * r, r) for r in (1, 2, 3, 4)]
VARIANTS = ("oracle-traj", "oracle-groups", "oracle-late", "predicted", "predicted-traj")
GROUP = 8  # members of a GRPO group in the paper cells (workload.group_size)
LATE_SHARE = 0.9  # share of trajectories past their first turn when a late reservation is made
SEEDS = (0, 1, 2, 3)


def group_of(traj_id: str) -> str:
    return traj_id.rsplit("-g", 1)[0]  # s{step}-p{prompt}-g{member}


def decode_tokens(spec) -> int:
    return sum(t.decode_tokens for t in spec.turns)


def longest_groups(specs, n: int) -> list[str]:
    """The n GRPO groups whose members decode the most tokens together, longest first."""
    totals: dict[str, int] = {}
    for s in specs:
        totals[group_of(s.traj_id)] = totals.get(group_of(s.traj_id), 0) + decode_tokens(s)
    return sorted(totals, key=lambda g: -totals[g])[:n]


def oracle_homes(specs, k: int, r: int, engines: list[str], by_group: bool) -> dict[str, str]:
    """The k longest trajectories (or k/8 longest groups) dealt over the last r engines."""
    reserved = engines[-r:]
    if not by_group:
        longest = sorted(specs, key=lambda s: -decode_tokens(s))[:k]
        return {s.traj_id: reserved[i % r] for i, s in enumerate(longest)}
    top = longest_groups(specs, k // GROUP)
    return {s.traj_id: reserved[top.index(group_of(s.traj_id)) % r] for s in specs if group_of(s.traj_id) in top}


class LateReserve:
    """Wraps a router's route(): once LATE_SHARE of the trajectories have begun their second turn,
    reserves engines, either for a fixed set of trajectories (oracle-late) or for the groups or
    trajectories that decoded most a turn so far, from what the routes showed (predicted)."""

    def __init__(self, router, engines: list[str], r: int, homes: dict[str, str] | None = None, groups: int = 0,
                 trajectories: int = 0):
        self.router, self.reserved, self.homes, self.groups = router, engines[-r:], homes, groups
        self.trajectories = trajectories
        self.turns: dict[str, int] = {}
        self.appended: dict[str, int] = {}
        self.decoded: dict[str, int] = {}
        self.done = False
        self.picked: list[str] = []
        self._route = router.route
        router.route = self.route

    def route(self, traj_id, colocated=False, appended=None, context=0, remaining=None):
        # the context before this turn's append is every earlier append and decode: the decodes are the rest
        self.decoded[traj_id] = context - self.appended.get(traj_id, 0)
        self.appended[traj_id] = self.appended.get(traj_id, 0) + (appended or 0)
        self.turns[traj_id] = self.turns.get(traj_id, 0) + 1
        if not self.done and sum(n >= 2 for n in self.turns.values()) >= LATE_SHARE * len(self.turns) > 0:
            self.done = True
            self.router.reserve(self.homes if self.homes is not None else self._predicted())
        return self._route(traj_id, colocated, appended, context, remaining)

    def _predicted(self) -> dict[str, str]:
        r = len(self.reserved)
        if self.trajectories:
            seen = [t for t, n in self.turns.items() if n >= 2]
            self.picked = sorted(seen, key=lambda t: -self.decoded[t] / (self.turns[t] - 1))[:self.trajectories]
            return {t: self.reserved[i % r] for i, t in enumerate(self.picked)}
        per_turn: dict[str, list[int]] = {}
        for t, n in self.turns.items():
            if n >= 2:
                seen = per_turn.setdefault(group_of(t), [0, 0])
                seen[0] += self.decoded[t]
                seen[1] += n - 1
        self.picked = sorted(per_turn, key=lambda g: -per_turn[g][0] / per_turn[g][1])[:self.groups]
        return {t: self.reserved[self.picked.index(group_of(t)) % r] for t in self.turns if group_of(t) in self.picked}


@contextlib.contextmanager
def routed(setup):
    """Let `setup(router, engines)` act on the router a simulation builds (simulator-only
    experiments: a reservation read off the workload has no pipeline setting)."""
    import prorsa.sim.run as simrun

    make = simrun.make_router

    def make_and_setup(run, roles, clock):
        router = make(run, roles, clock)
        setup(router, list(roles))
        return router

    simrun.make_router = make_and_setup
    try:
        yield
    finally:
        simrun.make_router = make


def run(job: tuple) -> dict:
    import tail
    from prorsa.agent.workload import Workload
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    cell, variant, k, r, seed = job
    cfg = tail.config(cell, "none", seed=seed)
    specs = Workload.from_config(cfg.workload, cfg.seed).trajectories_for_step(0)
    late: list[LateReserve] = []

    def setup(router, engines):
        if variant in ("oracle-traj", "oracle-groups"):
            router.reserve(oracle_homes(specs, k, r, engines, variant == "oracle-groups"))
        elif variant == "oracle-late":
            late.append(LateReserve(router, engines, r, homes=oracle_homes(specs, k, r, engines, False)))
        elif variant == "predicted":
            late.append(LateReserve(router, engines, r, groups=k))
        elif variant == "predicted-traj":
            late.append(LateReserve(router, engines, r, trajectories=k))

    with routed(setup):
        s = simulate(resolve(cfg), "colocated").summary
    out = {"cell": list(cell), "variant": variant, "k": k, "r": r, "seed": seed, "makespan_s": s["makespan_s"]}
    if variant == "predicted":
        longest = longest_groups(specs, k)
        out |= {"picked": late[0].picked, "longest": longest, "hits": len(set(late[0].picked) & set(longest))}
    elif variant == "predicted-traj":
        longest = [sp.traj_id for sp in sorted(specs, key=lambda sp: -decode_tokens(sp))[:k]]
        out |= {"hits": len(set(late[0].picked) & set(longest))}
    return out


def best(points: list[dict], cell: tuple, variant: str, seed: int = 0) -> dict | None:
    mine = [p for p in points if tuple(p["cell"]) == cell and p["variant"] == variant and p["seed"] == seed]
    return min(mine, key=lambda p: p["makespan_s"]) if mine else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/tail-reserve.json")
    ap.add_argument("--tail", default="benchmarks/results/tail.json", help="tail.py's results: the fixed splits")
    args = ap.parse_args()
    import tail
    from prorsa.sim.bounds import lower_bound
    from prorsa.rollout.context import resolve

    t0 = time.perf_counter()
    first = [(c, "none", 0, 0, s) for s in SEEDS for c in CELLS]
    first += [(c, "oracle-traj", k, r, s) for s in SEEDS for c in CELLS for k, r in TRAJ_GRID]
    first += [(c, "oracle-groups", k, r, s) for s in SEEDS for c in CELLS for k, r in GROUP_GRID]
    first += [(c, "predicted", g, r, s) for s in SEEDS for c in CELLS for g, r in PREDICTED]
    first += [(c, "predicted-traj", k, r, s) for s in SEEDS for c in CELLS for k, r in PREDICTED_TRAJ]
    label = lambda p: f"{tail.label(p['cell'])} {p['variant']} {p['k']}/{p['r']} seed {p['seed']}: {p['makespan_s']:.1f} s"
    with Pool(args.workers) as pool:
        points = list(each_done(pool, run, first, label))
        # the late reservation of each seed's best oracle point: what the first turn's wait costs it
        late = [(c, "oracle-late", b["k"], b["r"], s) for s in SEEDS for c in CELLS
                for b in [best(points, c, "oracle-traj", s)]]
        points += list(each_done(pool, run, late, label))

    fixed = {tuple(r["cell"]): r for r in json.loads(Path(args.tail).read_text())["rows"]}
    rows = []
    for c in CELLS:
        bound = {s: lower_bound(resolve(tail.config(c, "none", seed=s))).makespan_s for s in SEEDS}
        over = lambda v, s: best(points, c, v, s)["makespan_s"] / bound[s]
        f = fixed[c]  # seed 0's fixed splits (tail.py)
        row = {"cell": list(c), "label": tail.label(list(c)), "bound_s": bound[0],
               "colocated": statistics.median(over("none", s) for s in SEEDS),
               "best_fixed_s": min(f["figures"][f"{f['best_static']}/none"], f["figures"]["colocated/none"]),
               "seed0_s": {v: best(points, c, v, 0)["makespan_s"] for v in ("none", *VARIANTS)}}
        for v in VARIANTS:
            b = best(points, c, v, 0)
            row[v] = {"median": statistics.median(over(v, s) for s in SEEDS), "seeds": [over(v, s) for s in SEEDS],
                      "k": b["k"], "r": b["r"]} | ({"hits": b["hits"]} if "hits" in b else {})
        rows.append(row)
    out = {"command": "python benchmarks/tail_reserve.py", "wall_s": round(time.perf_counter() - t0, 1),
           "seeds": list(SEEDS), "rows": rows, "points": points}
    Path(args.out).write_text(json.dumps(out, indent=1))
    for row in rows:
        print(f"{row['label']}: colocated {row['colocated']:.3f} of the bound (median of seeds); "
              + "; ".join(f"{v} {row[v]['median']:.3f}" for v in VARIANTS))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
