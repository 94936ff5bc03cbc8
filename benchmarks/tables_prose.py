"""Figures the README's prose reads out of a results file, generated like the tables (benchmarks/tables.py).

PROSE maps a section name to the results files it reads and the function that writes its lines;
tables.py registers each beside its own tables, so `tables.py --check` holds these to their results too.
"""

from __future__ import annotations

import re


def t_groups_families(d: dict) -> list[str]:
    """The best heterogeneous layout's lead over the best equal-sized one, per family over both seeds."""
    leads: dict[str, dict[str, list[float]]] = {}
    for doc in d.values():
        for c in doc["cells"]:
            lead = leads.setdefault(c["family"], {"wide": [], "any": []})
            lead["wide"].append(c["wide_vs_best_equal"])
            lead["any"].append(c["hetero_vs_best_equal"])

    def pct(kind: str) -> str:
        return ", ".join(f"{family} {100 * (min(v[kind]) - 1):.1f}-{100 * (max(v[kind]) - 1):.1f}%"
                         for family, v in leads.items())

    return [f"Over both seeds, the best layout faster than the best equal-sized split, per family: with every "
            f"decode engine EP8 or wider {pct('wide')}; with the leftover GPUs as narrower decode engines "
            f"beside the wide ones {pct('any')}."]


def among(n: int, total: int) -> str:
    """'all 42' or '41 of the 42': the count a sentence gives must read right whichever it is."""
    return f"all {total}" if n == total else f"{n} of the {total}"


def span3(xs: list[float]) -> str:
    """One figure where the values agree to the table's three decimals, their range otherwise."""
    lo, hi = f"{min(xs):.3f}", f"{max(xs):.3f}"
    return lo if lo == hi else f"{lo}-{hi}"


def t_priors_drivers_counts(d: dict) -> list[str]:
    """How many drivers cells each prior keeps near the best fixed split, and the phases cells beside them."""
    drivers, phases = d["priors-drivers.json"]["cells"], d["priors-phases.json"]["cells"]
    total = len(drivers)

    # counted on the figures as the table rounds them, so a reader's count of the table agrees
    def at_least(prior: str, bar: float) -> list[float]:
        vs = [round(c["prorsa_vs_best"][prior] if prior != "oracle" else c["oracle_vs_best"], 3) for c in drivers]
        return [v for v in vs if v >= bar]

    earlier = at_least("earlier", 0.97)
    oracle_above = [v for v in at_least("oracle", 1.0) if v > 1.0]
    earlier_phases = [c["prorsa_vs_best"]["earlier"] for c in phases]
    return [f"With an earlier run's prior prorsa is at {span3(earlier)} of the best fixed split in "
            f"{among(len(earlier), total)} drivers cells and at {span3(earlier_phases)} in "
            f"{'both' if len(phases) == 2 else f'all {len(phases)}'} phases cells; with no prior, on the rehearsed "
            f"opening, it is at 0.97 or better in {among(len(at_least('none', 0.97)), total)}. The oracle, replaying "
            f"the run, is at 1.000 or better in {among(len(at_least('oracle', 1.0)), total)} and above 1.000 in "
            f"{len(oracle_above)}. Five declared means put prorsa at 0.97 or better in "
            f"{among(len(at_least('declared', 0.97)), total)} cells, 0.95 or better in "
            f"{len(at_least('declared', 0.95))}. A wrong family's prior that passes the opening check puts it at "
            f"0.97 or better in {among(len(at_least('wrong', 0.97)), total)}, 0.95 or better in "
            f"{len(at_least('wrong', 0.95))}, its lowest {min(at_least('wrong', 0.0)):.3f}."]


def t_router_prior(d: dict) -> list[str]:
    """Where the router's move cost starts its mean decode, against the colocated makespan it ends at."""
    def started(file: str) -> tuple[list[dict], dict]:
        points = d[file]["points"]
        return [p for p in points if p["start_decode"] is not None], next(p for p in points if p["prior"] == "earlier")

    def monotone(points: list[dict]) -> bool:
        figs = [p["figure"] for p in sorted(points, key=lambda p: p["start_decode"])]
        return figs == sorted(figs) or figs == sorted(figs, reverse=True)

    ideal, _ = started("router-prior.json")
    lru, lru_earlier = started("router-prior-lru.json")
    cell = next(c for c in d["priors-drivers.json"]["cells"]
                if c["factor"] == "prefix-cache" and c["value"] == "lru" and c["mode"] == "sync")
    starts = [p["start_decode"] for p in ideal]
    shape = "monotone" if monotone(ideal) and monotone(lru) else "not monotone"

    def ends(points: list[dict]) -> str:
        return f"{min(p['figure'] for p in points):.1f}-{max(p['figure'] for p in points):.1f} s"

    return [f"Where the move cost starts its mean decode is not a cost: colocated on the prefix-cache ideal sync "
            f"cell, started at "
            f"{min(starts):.0f}-{max(starts):.0f} tokens, ends anywhere in {ends(ideal)}, {shape} in the start "
            f"(`lru` sync: {ends(lru)}, where the earlier run's {lru_earlier['start_decode']:.0f} lands at "
            f"{lru_earlier['figure']:.1f} s and puts that cell at {cell['prorsa_vs_best']['earlier']:.3f} in the "
            f"drivers table's earlier column)."]


def t_tail_reserve_shares(d: dict) -> list[str]:
    """The oracle's distance from the bound, and how much of its gain over colocated each thing a run could know keeps."""
    rows = d["tail-reserve.json"]["rows"]

    # from the medians as the table shows them, so the shares are what a reader works out from it
    def share(row: dict, variant: str) -> float:
        col = round(row["colocated"], 3)
        return (col - round(row[variant]["median"], 3)) / (col - round(row["oracle-traj"]["median"], 3))

    def cell(row: dict) -> str:
        family, model, _ = row["label"].split()
        return f"{'SWE' if family == 'swe' else family} {'MoE' if model == 'moe' else model}"

    kept = [("none" if s <= 0 else f"{100 * s:.0f}%", cell(r))
            for s, r in sorted(((share(r, "oracle-groups"), r) for r in rows), key=lambda sr: -sr[0])]
    groups = (f"{kept[0][0]} of the oracle's gain over colocated on {kept[0][1]}, "
              + ", ".join(f"{k} on {c}" for k, c in kept[1:-1]) + f" and {kept[-1][0]} on {kept[-1][1]}")
    late = {f: [share(r, "oracle-late") for r in rows if r["label"].startswith(f + " ")] for f in ("swe", "math-tir")}
    slower = (" and end slower than colocated on math-tir, as the moves recompute their contexts and the reserved "
              "engines' other trajectories leave" if all(x < 0 for x in late["math-tir"]) else "")
    ranked = sum(min(r["predicted"]["median"], r["predicted-traj"]["median"]) > r["colocated"] for r in rows)
    near = min(min(r["oracle-traj"]["seeds"]) for r in rows)
    closest = next(cell(r) for r in rows if min(r["oracle-traj"]["seeds"]) == near)
    within = "no cell comes" if min(r["oracle-traj"]["median"] for r in rows) > 1.2 else "not every cell comes"
    return [f"Even with every trajectory's length known from the start, {within} within 1.2x of the bound (the "
            f"oracle's medians; one seed of {closest} came closest). Everything a run could do falls away from it "
            f"step by step (medians over the seeds): whole GRPO groups instead of single trajectories (the level at "
            f"which a run could know anything early, since a group's members share their task) keep {groups}; the "
            f"right trajectories reserved only after their first turn (the earliest a run has seen a decode of each) "
            f"keep {100 * min(late['swe']):.0f}-{100 * max(late['swe']):.0f}% on SWE{slower}; and ranking by the "
            f"decodes seen so far, by group or by trajectory, picks few of the k longest on seed 0 (`picked right`) "
            f"and ends slower than colocated in {'every cell' if ranked == len(rows) else f'{ranked} of the {len(rows)} cells'}."]


def t_phases_jitter(d: dict) -> list[str]:
    """What a spread in the decodes does to colocated on the phases trace, and which split it makes best."""
    jitter = re.search(r"--jitter (\S+)", d["priors-phases-jitter.json"]["command"])[1]

    def colocated(file: str, ep: int) -> float:
        return next(p["figure"] for p in d[file]["points"] if p["policy"] == "colocated" and p["value"] == ep)

    before, after = colocated("priors-phases.json", 4), colocated("priors-phases-jitter.json", 4)
    best = next(c["best_fixed"] for c in d["priors-phases-jitter.json"]["cells"] if c["value"] == 16)
    at16 = (f"makes a fixed split best ({best.removeprefix('static:')})" if best != "colocated"
            else "leaves colocated the best fixed split")
    return [f"With each turn's decode drawn within {100 * float(jitter):.0f}% either side of its kind's "
            f"(`--jitter {jitter}`, the same trace otherwise), colocated {'falls' if after < before else 'rises'} "
            f"from {before:.3f} to {after:.3f} traj/s at EP4 (the table below). At EP16 the spread {at16}."]


POOL, POOL_FILLED = "P 2x1 + D 3xEP8", "P 2x1 + D 3xEP8 + EP4 + EP2"  # a 2-GPU prefill pool, alone and filled up


def t_groups_pool(d: dict) -> list[str]:
    """A 2-GPU prefill pool beside EP8 decode engines on both families, and what EP16 costs colocated on SWE."""
    cells = [c for doc in d.values() for c in doc["cells"]]
    seed0 = {c["mode"]: c["vs_colocated"] for c in d["groups.json"]["cells"] if c["family"] == "math-tir"}
    swe = [c["vs_colocated"] for c in cells if c["family"] == "swe"]
    equal_loses = all(c["best_equal"] == "EP8 colocated" for c in cells if c["family"] == "math-tir")
    gpus = d["groups.json"]["cells"][0]["gpus"]
    pool = [v[POOL] for v in swe]
    ep16 = [100 * (1 - v["EP16 colocated"]) for v in swe]
    return [f"On math-tir {'no' if equal_loses else 'not every'} equal-sized split beats colocated EP8, and two "
            f"1-GPU prefill engines beside three EP8 decode engines ({gpus[POOL]} GPUs) are at "
            f"{seed0['sync'][POOL]:.3f} sync and {seed0['async'][POOL]:.3f} async of it (seed 0); with the "
            f"{gpus[POOL_FILLED] - gpus[POOL]} GPUs left as EP4 + EP2 decode engines, {seed0['sync'][POOL_FILLED]:.3f} "
            f"and {seed0['async'][POOL_FILLED]:.3f}. On SWE the same 2-GPU pool is at {min(pool):.2f}-{max(pool):.2f} "
            f"over both seeds, about the best EP8 static split (1:3, 8 GPUs prefilling), and a wider EP16 engine costs "
            f"colocated {min(ep16):.0f}-{max(ep16):.0f}% (the barrier over 16 ranks), which the heterogeneous layouts "
            f"avoid by giving the prefill no DP-attention group at all."]


def t_scale_fit(d: dict) -> list[str]:
    """What the scale table's fit rests on: the CPU a turn, how well it fits, and the peak against the mean."""
    doc = d["scale.json"]
    fits, measured = doc["fits"], doc["measured"]
    sched, drv = doc["rows"][0]["scheduler"], doc["rows"][0]["driver"]
    caps = sorted([sched["capacity_turns_per_s"], drv["capacity_turns_per_s"]])
    first = "driver" if drv["capacity_turns_per_s"] < sched["capacity_turns_per_s"] else "scheduler"
    by = caps[1] / caps[0]
    cpu = sorted(f["a"] for f in fits.values())
    worst = sorted(100 * f["worst_relative_error"] for f in fits.values())
    pairs = {p["engines"]: p["cpu_ms_per_turn"] for p in fits["scheduler"]["pairs"]}
    top = max(pairs)
    rest = {e: v for e, v in pairs.items() if e != top}
    engines, trajs = [m["engines"] for m in measured], [m["trajectories"] for m in measured]
    peaks = [r["turns_per_s_peak"] / r["turns_per_s_mean"] for r in doc["rows"] if r["demand"] == "simulated"]
    return [f"The {first} binds first, by {100 * (by - 1):.0f}%: it and the {'scheduler' if first == 'driver' else 'driver'} "
            f"each cost {cpu[0]:.1f}-{cpu[-1]:.1f} ms of CPU a turn, flat from {min(engines)} to {max(engines)} engines "
            f"and {min(trajs):,} to {max(trajs):,} trajectories in flight within this machine's noise (worst run "
            f"{worst[0]:.0f}-{worst[-1]:.0f}% off the fit). At {top} engines the turns a second trajectory count added "
            f"cost the scheduler {pairs[top]:.2f} ms each against {min(rest.values()):.2f}-{max(rest.values()):.2f} ms "
            f"at {min(rest)}-{max(rest)}, so growth with engines is not "
            f"ruled out; every row past {top} engines assumes none, and its headroom is an upper bound. The sync step's "
            f"peak (its first turns) is {min(peaks):.1f}-{max(peaks):.1f}x its mean."]


def t_overlap_dense(d: dict) -> list[str]:
    """On the dense cell: the best fixed split with and without overlap, the next best behind it, and prorsa."""
    doc = d["overlap-split-dense.json"]
    behind, nexts, best = [], set(), set()
    for c in doc["cells"]:
        fixed = sorted((p for p in doc["points"] if p["mode"] == c["mode"] and p["policy"] != "prorsa"),
                       key=lambda p: -p["trained_per_s"])
        best.add(fixed[0]["policy"])
        nexts.add(fixed[1]["policy"])
        behind.append(f"{100 * (1 - fixed[1]['trained_per_s'] / fixed[0]['trained_per_s']):.1f}%")
    if best != {"colocated"} or len(nexts) != 1:
        raise ValueError("the sentence reads one best fixed split (colocated) and one next best in both modes")
    prefill, _, mixed = nexts.pop().removeprefix("static:").split(":")
    still = all(c["switches"] == 0 and c["prorsa_vs_best"] == 1.0 for c in doc["cells"])
    return [f"On dense engines no split pays: colocated is the best fixed split with and without overlap (the next "
            f"best, {prefill} prefill engines beside {mixed} mixed, {' and '.join(behind)} behind it)"
            + (", and prorsa keeps every engine mixed (no switch) and equals it." if still else ".")]


PROSE = {
    "groups-families": (["groups.json", "groups-seed1.json"], t_groups_families),
    "priors-drivers-counts": (["priors-drivers.json", "priors-phases.json"], t_priors_drivers_counts),
    "router-prior": (["router-prior.json", "router-prior-lru.json", "priors-drivers.json"], t_router_prior),
    "tail-reserve-shares": (["tail-reserve.json"], t_tail_reserve_shares),
    "phases-jitter": (["priors-phases.json", "priors-phases-jitter.json"], t_phases_jitter),
    "groups-pool": (["groups.json", "groups-seed1.json"], t_groups_pool),
    "scale-fit": (["scale.json"], t_scale_fit),
    "overlap-split-dense-reading": (["overlap-split-dense.json"], t_overlap_dense),
}
