"""The benchmark tables of the docs, generated from the results the benchmark scripts stored.

A generated section is the text between two markers in a markdown file:

    <!-- table:NAME -->
    ...written by this script: the command(s) that produced the results, the table, a summary line
    <!-- /table:NAME -->

NAME is a key of TABLES, which names the results files (benchmarks/results/*.json) a table reads and
the formatter that turns them into markdown. Every number in a section comes from those files; a
section may appear in more than one document (the README's headline tables are sections too).

    python3 benchmarks/tables.py            rewrite every section of benchmarks/README.md and README.md
    python3 benchmarks/tables.py --check    exit 1, naming each section that differs from its results

Standard library only: it runs before any set-up. tests/test_benchmark_tables.py runs the check.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import shlex
import statistics
import sys
from pathlib import Path
from typing import Callable, NamedTuple

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
DOCS = (REPO / "benchmarks" / "README.md", REPO / "README.md")
SHOWN_DIR = "benchmarks/results"  # how a results file is named in the docs, wherever it was read from
SECTION = re.compile(r"<!-- table:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /table:(?P=name) -->", re.S)
MODEL = {"dense": "dense", "moe": "MoE"}


# ---------------------------------------------------------------------------------------- helpers

def f2(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def f3(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def fig(x: float | None, mode: str) -> str:
    """A cell's headline figure: makespan (sync) or trajectories/s (async)."""
    return "-" if x is None else f"{x:.2f} s" if mode == "sync" else f"{x:.2f} /s"


def split(policy: str) -> str:
    return policy.removeprefix("static:")


def span(xs: list[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(r) + " |" for r in rows]]


def options(command: str) -> dict[str, str]:
    """--name value pairs of a stored command line."""
    words, opts = shlex.split(command), {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else ""
            opts[w[2:]] = "" if nxt.startswith("--") else nxt
    return opts


def ratio(policy_fig: float, colocated_fig: float, mode: str) -> float:
    """> 1 is better than colocated in either mode."""
    return colocated_fig / policy_fig if mode == "sync" else policy_fig / colocated_fig


def live_model(cell: dict) -> str:
    return "dense" if cell["ep"] == 1 else f"MoE EP{cell['ep']}"


def live_key(cell: dict) -> tuple:
    return cell["family"], cell["model"], cell["mode"]


def figure_key(mode: str) -> str:
    """The headline figure's key in a summary: makespan (sync) or trajectories/s (async)."""
    return "makespan_s" if mode == "sync" else "trajectories_per_s"


def run_figures(cell: dict, policy: str) -> list[float]:
    key = figure_key(cell["mode"])
    return [r["summary"][key] for r in cell["runs"].get(policy, []) if r.get("summary")]


# ------------------------------------------------------------------------------ the simulator tables

def t_paper(d: dict) -> list[str]:
    rows, misses = [], []
    for c in d["paper.json"]["cells"]:
        v, best = c["vs_colocated"], c["best_static"]
        rows.append([c["family"], MODEL.get(c["model"], c["model"]), c["mode"], fig(c["colocated"], c["mode"]),
                     f"{v[best]:.3f} ({split(best)})", f3(v["reactive"]), f3(v["prorsa"]), f3(v["oracle"]),
                     f3(c["prorsa_vs_best"]), str(c["switches"]["prorsa"]), f3(c.get("colocated_vs_bound"))])
    cells = d["paper.json"]["cells"]
    low = min(cells, key=lambda c: c["prorsa_vs_best"])
    to_oracle = min(c["vs_colocated"]["prorsa"] / c["vs_colocated"]["oracle"] for c in cells)
    return table(["family", "model", "mode", "colocated", "best static", "reactive", "prorsa", "oracle",
                  "prorsa / best", "switches", "bound / colocated"], rows) + [
        "", f"Over the {len(cells)} cells: lowest prorsa / best {low['prorsa_vs_best']:.3f} ({low['family']} "
            f"{MODEL.get(low['model'], low['model'])} {low['mode']}), lowest prorsa / oracle {to_oracle:.3f}."]


def t_paper_restart(d: dict) -> list[str]:
    """The paper cells with every switch priced and carried out by restart (paper.py --restart-s)."""
    base, restart = d["paper.json"]["cells"], d["paper-restart.json"]["cells"]
    rows, kept = [], []
    for b, r in zip(base, restart):
        vb, vr = b["vs_colocated"], r["vs_colocated"]
        rows.append([b["family"], MODEL.get(b["model"], b["model"]), b["mode"],
                     f"{f3(vb['prorsa'])} / {f3(vr['prorsa'])}", f"{f3(b['prorsa_vs_best'])} / {f3(r['prorsa_vs_best'])}",
                     f"{b['switches']['prorsa']} / {r['switches']['prorsa']}", f"{f3(vb['oracle'])} / {f3(vr['oracle'])}",
                     f"{f3(vb['reactive'])} / {f3(vr['reactive'])}"])
        if vb["prorsa"] > 1.01:
            kept.append((vr["prorsa"] - 1) / (vb["prorsa"] - 1))
    geo = {k: math.exp(statistics.fmean(math.log(c["vs_colocated"]["prorsa"]) for c in cells))
           for k, cells in (("in place", base), ("restart", restart))}
    restart_s = options(d["paper-restart.json"]["command"]).get("restart-s", "?")
    return table(["family", "model", "mode", "prorsa vs colocated", "prorsa / best", "prorsa switches",
                  "oracle vs colocated", "reactive vs colocated"], rows) + [
        "", f"Each pair: in place (kv_both, `paper.json`) / by restart at {restart_s} s a switch. prorsa over "
            f"colocated, geometric mean of the {len(base)} cells: {geo['in place']:.3f} in place, {geo['restart']:.3f} "
            f"by restart; of its gain in the {len(kept)} cells where it gains more than 1% in place, "
            + (f"{statistics.median(kept):.0%} survives (median; {min(kept):.0%}-{max(kept):.0%})." if kept else "none.")]


def t_role_restart(d: dict) -> list[str]:
    doc = d["role-restart.json"]
    rows = []
    for path, runs in doc["runs"].items():
        for to in ("decode", "prefill"):
            rs = [r for r in runs if r["to"] == to]
            extra = "-" if path == "in_place" else ", ".join(
                f"{r['drain_s']:.1f} + {r['restart_s']:.1f} s (start {r['server_start_s']:.1f}, warm-up {r['warmup_s']:.1f})"
                for r in rs)
            rows.append([path.replace("_", " "), f"to {to}", ", ".join(f"{r['unavailable_s']:.2f}" for r in rs),
                         f"{statistics.median(r['unavailable_s'] for r in rs):.2f} s", extra,
                         f"{statistics.median(r['first_turn_s'] for r in rs):.2f} s",
                         "yes" if all(r["probe_matches"] for r in rs) else "NO"])
    pr, m = doc["prices"], doc["median_unavailable_s"]
    return table(["path", "switch", "unavailable (s, each)", "median", "drain + restart", "first turn after",
                  "output = colocated"], rows) + [
        "", f"Medians over every switch: in place {m['in_place']:.2f} s, by restart {m['restart']:.2f} s "
            f"({m['restart'] / max(m['in_place'], 1e-3):.0f}x), with {doc['old_legs']} old-direction turns in flight. "
            f"The allocator's price (Qwen3-8B on an H200, engines.restart_s {doc['restart_s']:g} s): prefill to decode "
            f"{pr['in_place']['prefill_to_decode_s']:.2f} s in place, {pr['restart']['prefill_to_decode_s']:.2f} s by "
            f"restart; decode (22 x 32k contexts, 1000 tokens left) to prefill {pr['in_place']['decode_to_prefill_s']:.1f} s "
            f"/ {pr['restart']['decode_to_prefill_s']:.1f} s; decode to mixed {pr['restart']['decode_to_mixed_s']:.1f} s "
            "either way (both pull KV)."]


def t_weight_sync(d: dict) -> list[str]:
    doc = d["weight-sync.json"]
    rows = []
    for s in doc["shapes"]:
        gb = s["bytes"] / 1e9
        med = {k: statistics.median(r[k] for r in s["runs"]) for k in ("write_s", "reload_s", "total_s")}
        rows.append([s["name"], f"{s['params'] / 1e9:.3f}B", f"{s['hidden']} x {s['layers']}", f"{gb:.2f}",
                     ", ".join(f"{r['write_s']:.2f} + {r['reload_s']:.2f}" for r in s["runs"]),
                     f"{med['write_s']:.2f}", f"{med['reload_s']:.2f}", f"{med['total_s']:.2f}",
                     f"{gb / med['write_s']:.2f} / {gb / med['reload_s']:.2f} / {gb / med['total_s']:.2f}",
                     f"{s['engine_start_s']:.0f} s", {True: "yes", False: "NO"}.get(s.get("output_changed"), "-")])
    return table(["shape", "params", "hidden x layers", "GB (float32)", "write + reload (s, each)", "write (s)",
                  "reload (s)", "update (s)", "GB/s write / reload / update", "engine start",
                  "output changed"], rows) + [
        "", f"Medians over {len(doc['shapes'][0]['runs'])} updates per shape, one vLLM CPU engine, "
            f"{doc['dtype']} weights."]


def _mb(nbytes: float) -> str:
    mb = nbytes / 1e6
    return f"{mb:.0f}" if mb >= 100 else f"{mb:.3g}"


WEIGHT_SYNC_PATHS = ("weight-sync-paths.json", "weight-sync-8b-width.json")


def t_weight_sync_paths(d: dict) -> list[str]:
    """Each shape's update by each path, medians; the speed-up over the disk path measured beside it."""
    doc = d[WEIGHT_SYNC_PATHS[0]]
    rows = []
    for s in (s for f in WEIGHT_SYNC_PATHS for s in d[f]["shapes"]):
        disk = s["paths"].get("disk")
        disk_s = statistics.median(r["total_s"] for r in disk["runs"]) if disk else None
        for path, p in s["paths"].items():
            med = {k: statistics.median(r[k] for r in p["runs"]) for k in ("write_s", "reload_s", "total_s", "bytes_moved")}
            rows.append([s["name"], f"{s['bytes'] / 1e9:.2f}", path, _mb(med["bytes_moved"]),
                         f"{med['write_s']:.2f}", f"{med['reload_s']:.2f}", f"{med['total_s']:.2f}",
                         f"{med['bytes_moved'] / 1e9 / med['total_s']:.2f}",
                         f"{disk_s / med['total_s']:.1f}x" if disk_s else "-",
                         {True: "yes", False: "NO"}.get(p.get("output_changed"), "-")])
    return table(["shape", "GB (float32)", "path", "MB moved", "write (s)", "reload (s)", "update (s)",
                  "GB/s", "vs disk", "output changed"], rows) + [
        "", f"Medians over {len(doc['shapes'][0]['paths']['disk']['runs'])} updates per shape and path, one vLLM "
            f"CPU engine, {doc['dtype']} weights; MB moved: what the engine loaded, GB/s: that over the update."]


RL_TOY_SYNC = ("rl-toy-sync-disk.json", "rl-toy-sync-memory.json")


def t_rl_toy_sync(d: dict) -> list[str]:
    """The rl-toy run's weight updates by weight_sync: the trainer's part, the engines' and both."""
    rows = []
    for f in RL_TOY_SYNC:
        doc = d[f]
        ups = doc["updates"]
        med = {k: statistics.median(u[k] for u in ups) for k in ("save_s", "push_s")}
        both = statistics.median(u["save_s"] + u["push_s"] for u in ups)
        rows.append([doc["weight_sync"], str(len(ups)), f"{med['save_s']:.3f}", f"{med['push_s']:.3f}",
                     f"{both:.3f}", f"{sum(u['save_s'] + u['push_s'] for u in ups):.1f}", f"{doc['makespan_s']:.0f}",
                     f"{doc['first']['call_share']:.2f} -> {doc['last']['call_share']:.2f}"])
    return table(["weight_sync", "updates", "save (s)", "push (s)", "update (s)", "all updates (s)",
                  "makespan (s)", "call share first -> last"], rows) + [
        "", "Medians over the run's updates (train.jsonl: save is the trainer's part, a model directory written "
            "or the shared region filled; push is every engine loading it, the 3 engines at once)."]


def t_paper_rules(d: dict) -> list[str]:
    """The paper cells under the router's three rules (runtime.sticky_overload)."""
    files = {"cost": "paper.json", "2": "paper-ratio.json", "none": "paper-sticky.json"}
    figs = {rule: {(p["family"], p["model"], p["mode"], p["policy"]): p["figure"] for p in d[f]["points"]}
            for rule, f in files.items()}
    cells = {rule: d[f]["cells"] for rule, f in files.items()}
    rows, logs = [], {}
    for i, c in enumerate(cells["cost"]):
        key, mode = (c["family"], c["model"], c["mode"]), c["mode"]
        rows.append([c["family"], MODEL.get(c["model"], c["model"]), mode,
                     *[f3(cells[rule][i]["prorsa_vs_best"]) for rule in files],
                     *[f3(ratio(figs["cost"][key + ("colocated",)], figs[rule][key + ("colocated",)], mode))
                       for rule in ("2", "none")]])
        for rule in ("2", "none"):
            for name, pol_cost, pol_other in (("colocated", "colocated", "colocated"),
                                              ("the best static split", c["best_static"], cells[rule][i]["best_static"]),
                                              ("prorsa", "prorsa", "prorsa")):
                r = ratio(figs["cost"][key + (pol_cost,)], figs[rule][key + (pol_other,)], mode)
                logs.setdefault(rule, {}).setdefault(name, []).append(math.log(r))
    means = "; ".join(f"cost over {rule}: " + ", ".join(
        f"{name} {math.exp(statistics.fmean(ls)):.3f} ({math.exp(min(ls)):.2f}-{math.exp(max(ls)):.2f})"
        for name, ls in by.items()) for rule, by in logs.items())
    return table(["family", "model", "mode", "prorsa / best: cost", "prorsa / best: 2", "prorsa / best: none",
                  "colocated, cost vs 2", "colocated, cost vs none"], rows) + [
        "", f"Speed under the cost rule over the others (> 1: faster with cost), geometric mean over the cells "
            f"(single cells in brackets): {means}."]


PRIOR_NAMES = ("none", "earlier", "wrong", "declared")  # priors.py's PRIORS
PRIOR_COLUMNS = ("prorsa: none", "prorsa: earlier run", "prorsa: wrong family", "prorsa: declared means")


def t_priors(d: dict) -> list[str]:
    """prorsa / the best fixed split under four priors, single steps and multi-step runs."""
    rows, lows, spans = [], {}, {}
    for file in ("priors.json", "priors-steps3.json"):
        for c in d[file]["cells"]:
            v = c["prorsa_vs_best"]
            for p, x in [*v.items(), ("oracle", c["oracle_vs_best"])]:
                spans.setdefault(p, ([], []))[c["steps"] > 1].append(x)
            rows.append([c["family"], MODEL.get(c["model"], c["model"]), c["mode"], str(c["steps"]),
                         split(c["best_fixed"]), *(f3(v.get(p)) for p in PRIOR_NAMES),
                         f3(c["oracle_vs_best"]), "/".join(str(c["prorsa_switches"].get(p, "-")) for p in PRIOR_NAMES)])
            for p in PRIOR_NAMES:
                key = (p, c["steps"] > 1)
                if p in v and (key not in lows or v[p] < lows[key][0]):
                    lows[key] = (v[p], f"{c['family']} {MODEL.get(c['model'], c['model'])} {c['mode']}")
    low = "; ".join(f"{p}{' (multi-step)' if multi else ''} {x:.3f} ({where})"
                    for (p, multi), (x, where) in sorted(lows.items(), key=lambda kv: (kv[0][1], kv[0][0])))
    return table(["family", "model", "mode", "steps", "best fixed", *PRIOR_COLUMNS, "oracle", "switches n/e/w/d"],
                 rows) + ["", f"Lowest prorsa / best fixed per prior: {low}.",
                          "Range over the cells, single steps / multi-step: " + "; ".join(
                              f"{p} {min(one):.3f}-{max(one):.3f} / {min(multi):.3f}-{max(multi):.3f}"
                              for p in [*PRIOR_NAMES, "oracle"] for one, multi in [spans[p]]) + "."]


SEED_FILES = {  # the cells short of the bar at seed 0, again at seeds 1 and 2: (file, seed)
    "prefix-cache": [("priors-drivers.json", 0), ("priors-drivers-prefix-cache-seed1.json", 1),
                     ("priors-drivers-prefix-cache-seed2.json", 2)],
    "tokens": [("priors-drivers-steps3.json", 0), ("priors-drivers-steps3-tokens-seed1.json", 1),
               ("priors-drivers-steps3-tokens-seed2.json", 2)],
}
SEED_CELLS = {"prefix-cache": "ideal", "tokens": 4.0}


def t_priors_seeds(d: dict) -> list[str]:
    """The cells short of the bar at seed 0, at seeds 1 and 2: how much of the shortfall is the seed's."""
    rows = []
    for factor, files in SEED_FILES.items():
        for file, seed in files:
            for c in d[file]["cells"]:
                if c["factor"] != factor or c["value"] != SEED_CELLS[factor] or c["mode"] != "sync":
                    continue
                v = c["prorsa_vs_best"]
                rows.append([f"{factor}={c['value']} sync", str(c["steps"]), str(seed), split(c["best_fixed"]),
                             f"{c['best_fixed_figure']:.1f} s", f3(c["colocated_vs_best"]),
                             *(f3(v.get(p)) for p in PRIOR_NAMES), f3(c["oracle_vs_best"]),
                             "/".join(str(c["prorsa_switches"].get(p, "-")) for p in PRIOR_NAMES)])
    return table(["cell", "steps", "seed", "best fixed", "its makespan", "colocated", *PRIOR_COLUMNS, "oracle",
                  "switches n/e/w/d"], rows)


def t_tuned_once(d: dict) -> list[str]:
    """A split tuned on another family or model, run here, against prorsa: what a user who tunes once gets."""
    fig = {(p["family"], p["model"], p["mode"], p["policy"]): p["figure"] for p in d["paper.json"]["points"]}
    earlier = {(c["family"], c["model"], c["mode"]): c["prorsa_vs_best"]["earlier"] for c in d["priors.json"]["cells"]}
    cells = d["paper.json"]["cells"]
    best = {(c["family"], c["model"], c["mode"]): c["best_static"] for c in cells}
    other = {"dense": "moe", "moe": "dense"}
    rows, worst = [], {"swe": 1.0, "model": 1.0, "prorsa": 1.0}
    for c in cells:
        key, mode = (c["family"], c["model"], c["mode"]), c["mode"]
        pick = min if mode == "sync" else max
        ref = pick(fig[key + ("colocated",)], fig[key + (c["best_static"],)])

        def vs_best(policy: str) -> float:
            return ratio(fig[key + (policy,)], ref, mode)

        on_swe = best["swe", c["model"], mode]
        on_model = best[c["family"], other[c["model"]], mode]
        r_swe, r_model, r_prorsa = vs_best(on_swe), vs_best(on_model), vs_best("prorsa")
        worst = {"swe": min(worst["swe"], r_swe), "model": min(worst["model"], r_model),
                 "prorsa": min(worst["prorsa"], r_prorsa)}
        rows.append([c["family"], MODEL.get(c["model"], c["model"]), mode, split(c["best_static"]),
                     f"{r_swe:.3f} ({split(on_swe)})", f"{r_model:.3f} ({split(on_model)})", f3(r_prorsa),
                     f3(earlier.get(key))])
    return table(["family", "model", "mode", "best static here", "split tuned on SWE", "split tuned on the other model",
                  "prorsa, no prior", "prorsa, earlier run"], rows) + [
        "", f"Lowest over the cells: the SWE-tuned split {worst['swe']:.3f}, the other model's {worst['model']:.3f}, "
            f"prorsa with no prior {worst['prorsa']:.3f} of the best fixed split."]


def priors_cells_table(file: str) -> Callable[[dict], list[str]]:
    """priors.py --table drivers|phases: a row per cell (factor=value, mode), the four priors."""

    def render(d: dict) -> list[str]:
        rows, lows = [], {}
        for c in d[file]["cells"]:
            v = c["prorsa_vs_best"]
            where = f"{c['factor']}={c['value']} {c['mode']}"
            rows.append([where, split(c["best_fixed"]), f3(c["colocated_vs_best"]),
                         *(f3(v.get(p)) for p in PRIOR_NAMES), f3(c["oracle_vs_best"]),
                         "/".join(str(c["prorsa_switches"].get(p, "-")) for p in PRIOR_NAMES)])
            for p in PRIOR_NAMES:
                if p in v and (p not in lows or v[p] < lows[p][0]):
                    lows[p] = (v[p], where)
            if "oracle" not in lows or c["oracle_vs_best"] < lows["oracle"][0]:
                lows["oracle"] = (c["oracle_vs_best"], where)
        low = "; ".join(f"{p} {x:.3f} ({where})" for p, (x, where) in lows.items())
        return table(["cell", "best fixed", "colocated", *PRIOR_COLUMNS, "oracle", "switches n/e/w/d"],
                     rows) + ["", f"Lowest / best fixed: {low}."]

    return render


def drift_priors(c: dict) -> list[str]:
    """A drift.py cell's prorsa / best fixed under each prior (none alone before --priors), and its switches."""
    v = c.get("prorsa_vs_best_by_prior") or {"none": c["prorsa_vs_best"]}
    n = c.get("prorsa_switches_by_prior") or {"none": c["prorsa_switches"]}
    return [*(f3(v.get(p)) for p in PRIOR_NAMES), "/".join(str(n.get(p, "-")) for p in PRIOR_NAMES)]


def t_drift(d: dict) -> list[str]:
    """Decode lengths drifting across steps: prorsa and the per-step hindsight against the best single split."""
    rows = []
    for c in d["drift.json"]["cells"]:
        rows.append([c["engines"], f"{c['growth']:g}", str(c["steps"]), split(c["best_fixed"]),
                     f"{c['best_fixed_s']:.1f} s", " ".join(split(h) for h in c["hindsight_splits"]),
                     f3(c["hindsight_vs_best"]), *drift_priors(c), f3(c["oracle_vs_best"])])
    cells = d["drift.json"]["cells"]
    most = max(c["hindsight_vs_best"] for c in cells)
    return table(["engines", "decode growth", "steps", "best fixed", "its makespan", "best per step (hindsight)",
                  "hindsight / best", *PRIOR_COLUMNS, "switches n/e/w/d", "oracle / best"], rows) + [
        "", f"The most a split chosen afresh for every step could gain over the best single split here: "
            f"{most:.3f}x; prorsa {min(c['prorsa_vs_best'] for c in cells):.3f}-"
            f"{max(c['prorsa_vs_best'] for c in cells):.3f} of the best single split."]


def t_drift_mix(d: dict) -> list[str]:
    """Task mixes shifting across steps and staggered async releases: prorsa and the per-step
    hindsight against the best single split."""
    cells = d["drift-mix.json"]["cells"]
    rows = []
    for c in cells:
        what = (f"{c['value'].replace(':', ' -> ')}, {c['steps']} sync steps" if c["kind"] == "shift"
                else f"async, a wave every {c['value']:g} s")
        hind = c["hindsight_splits"]
        rows.append([c["engines"], what, split(c["best_fixed"]), f"{c['best_fixed_s']:.1f} s",
                     "-" if hind is None else " ".join(split(h) for h in hind), f3(c["hindsight_vs_best"]),
                     *drift_priors(c), f3(c["oracle_vs_best"])])
    shifts = [c for c in cells if c["kind"] == "shift"]
    waves = [c for c in cells if c["kind"] == "release"]

    def span(xs: list[float]) -> str:
        lo, hi = f"{min(xs):.3f}", f"{max(xs):.3f}"
        return f"{lo}-{hi}" if lo != hi else f"{lo} in every cell"

    return table(["engines", "workload", "best fixed", "its makespan", "best per step (hindsight)",
                  "hindsight / best", *PRIOR_COLUMNS, "switches n/e/w/d", "oracle / best"], rows) + [
        "", f"Shifting mixes: a split chosen afresh for every step gains at most "
            f"{max(c['hindsight_vs_best'] for c in shifts):.3f}x over the best single split; prorsa "
            f"{span([c['prorsa_vs_best'] for c in shifts])}, the oracle {span([c['oracle_vs_best'] for c in shifts])}. "
            f"Staggered releases: prorsa {span([c['prorsa_vs_best'] for c in waves])}, the oracle "
            f"{span([c['oracle_vs_best'] for c in waves])} of the best single split."]


def t_universal_split(d: dict) -> list[str]:
    """The bound on what switching could gain: each engine set's universal split and its worst regret."""
    def workload(w: list) -> str:
        family, mode, turns = w
        return f"{family} {mode}, " + ("own turn cap" if turns is None else f"{turns} turns")

    cells = d["universal-split.json"]["cells"]
    rows = [[c["engines"], str(c["workloads"]), split(c["universal"]), f3(c["regret"]), workload(c["worst_workload"]),
             f3(c["colocated_regret"]), ", ".join(sorted({split(b[-1]) for b in c["best"]}))] for c in cells]
    most = max(cells, key=lambda c: c["regret"])
    return table(["engines", "workloads", "universal split", "its worst regret", "worst workload", "colocated's",
                  "each workload's best"], rows) + [
        "", f"On any sequence of these workloads, in any proportions, switching roles gains at most "
            f"{most['regret']:.3f}x over the best fixed split ({most['engines']})."]


def t_tail(d: dict) -> list[str]:
    """Each scheduling mechanism alone and together: makespan over the bound, colocated and prorsa."""
    mechs = ["none", "priority", "spread", "both", "priority-oracle"]
    rows, asyncs, tails = [], [], []
    for r in d["tail.json"]["rows"]:
        if "over_bound" in r:
            o = r["over_bound"]
            rows.append([r["label"], f"{r['bound_s']:.1f} s", *(f3(o[f"colocated/{m}"]) for m in mechs),
                         f3(o["colocated/priority-prior"]),
                         *(f3(o[f"prorsa/{m}"]) for m in ("none", "priority", "both")), split(r["best_static"]),
                         f3(r["prorsa_both_vs_fixed"]), f3(r["prorsa_both_vs_fixed_both"])])
            if "prorsa_tail_vs_fixed" in r:
                tails.append([r["label"], f"{r['bound_tail_s']:.1f} s",
                              *(f3(o[f"{p}/{m}"]) for p in ("colocated", "prorsa") for m in ("tail-layout", "all")),
                              split(r["best_static_tail"]), f3(r["prorsa_tail_vs_fixed"]),
                              f3(r["prorsa_tail_vs_fixed_tail"])])
        else:
            f = r["figures"]
            asyncs.append(f"{r['label']} {' / '.join(f2(f[f'colocated/{m}']) for m in mechs)}")
    sync = [r["over_bound"] for r in d["tail.json"]["rows"] if "over_bound" in r]
    gains = [o["colocated/none"] / o["colocated/priority"] for o in sync]
    true = [o["colocated/none"] / o["colocated/priority-oracle"] for o in sync]
    out = table(["cell", "bound", *(f"colocated {m}" for m in mechs), "colocated priority-prior",
                 *(f"prorsa {m}" for m in ("none", "priority", "both")),
                 "best fixed", "prorsa both / best fixed", "... / best fixed with both"], rows) + [
        "", f"Priority alone against none, colocated: {min(gains):.3f}-{max(gains):.3f}x; keyed by the true "
            f"remainder instead: {min(true):.3f}-{max(true):.3f}x. Async, colocated trajectories/s under "
            f"{' / '.join(mechs)}: " + "; ".join(asyncs) + "."]
    if tails:
        merged = [o["colocated/none"] * r["bound_s"] / (o["colocated/tail-layout"] * r["bound_tail_s"])
                  for r in d["tail.json"]["rows"] if "prorsa_tail_vs_fixed" in r for o in [r["over_bound"]]]
        out += ["", "The tail's layout (`tail-layout`; `all`: with priority and spread), over the bound that "
                "lets the slowest trajectory run on the widest layout a merge may form:", ""]
        out += table(["cell", "bound (widest layout)", "colocated tail-layout", "colocated all",
                      "prorsa tail-layout", "prorsa all", "best fixed with it", "prorsa tail-layout / best fixed",
                      "... / best fixed with it"], tails)
        out += ["", f"Makespan colocated, none over tail-layout: {min(merged):.3f}-{max(merged):.3f}x. Not run on "
                "the EP16 cells: an EP16 group already spans two nodes, so no merge stays in one NVLink domain."]
    return out


def t_tail_live(d: dict, name: str = "tail-live.json") -> list[str]:
    """A mechanism off and on, live on vLLM CPU engines and simulated: makespan and who waited."""
    doc = d[name]
    mech = doc.get("mechanism", "priority")
    med, sim = doc["live_median"], doc["sim"]["calibrated"]

    def waits(x: dict) -> str:
        return " / ".join(f"{x[f'waited_{g}_s']:.2f}" for g in ("all", "long", "rest")) + " s"

    rows = [[f"{mech} {w}", ", ".join(f"{r['makespan_s']:.1f}" for r in doc["live"] if r.get("on", r.get("priority")) is p) + " s",
             f"{med[w]['makespan_s']:.2f} s", f"{sim[w]['makespan_s']:.2f} s", waits(med[w]), waits(sim[w]),
             f"{med[w]['waited_last_s']:.1f} s", f"{sim[w]['waited_last_s']:.1f} s"]
            for w, p in (("off", False), ("on", True))]
    rows.append(["off / on", "", f3(doc["live_ratio"]), f3(sim["off"]["makespan_s"] / sim["on"]["makespan_s"]),
                 "", "", "", ""])
    seeds = [r["ratio"] for r in doc["sim_seeds"]["calibrated"]]
    fit = doc["sim"]["fitted"]
    return table([f"scheduling.{mech}", "live runs", "live median", f"sim ({doc['profile']})",
                  "live wait a turn: all / longest quarter / rest", "sim wait a turn: all / longest quarter / rest",
                  "live: last to end waited", "sim: last to end waited"], rows) + [
        "", f"Seed {doc['seed']}; simulated off / on over seeds 0-{len(seeds) - 1}: {min(seeds):.3f}-{max(seeds):.3f} "
            f"(median {statistics.median(seeds):.3f}). With the profile corrected to the off runs "
            f"({len(doc['corrections'])} corrections, the last {doc['corrections'][-1].split(': ', 1)[1]}): "
            f"{fit['off']['makespan_s']:.2f} s / {fit['on']['makespan_s']:.2f} s = "
            f"{fit['off']['makespan_s'] / fit['on']['makespan_s']:.3f}. "
            f"vLLM's own queue held a live turn {1000 * med['off']['engine_queue_s']:.2f} ms (off) and "
            f"{1000 * med['on']['engine_queue_s']:.2f} ms (on) on average."]


def t_migrate(d: dict) -> list[str]:
    """Migration during a tool call, simulated over seeds: makespan off / on, and how often it moved."""
    doc = d["migrate.json"]
    rows = [[r["label"], r["policy"], f3(r["median_ratio"]), f"{min(r['ratios']):.3f}-{max(r['ratios']):.3f}",
             f"{100 * r['migrated_share']:.1f}%"] for r in doc["rows"]]
    medians = [r["median_ratio"] for r in doc["rows"]]
    seeds = doc["rows"][0]["seeds"]
    return table(["cell", "policy", "makespan off / on (median)", "per seed", "turns migrated"], rows) + [
        "", f"Seeds {seeds[0]}-{seeds[-1]}; > 1: migration shortened the step. Medians over the cells "
            f"{min(medians):.3f}-{max(medians):.3f}."]


def t_partial_rollout(d: dict) -> list[str]:
    """Plain sync, partial rollouts and async side by side: trained trajectories per second."""
    doc = d["partial-rollout.json"]
    cells = {c["model"]: c for c in doc["cells"]}
    rows = []
    for p in doc["points"]:
        c = cells[p["model"]]
        bounds = " / ".join(f"{b:.0f}" for b in c["step_bound_s"]) if p["mode"] == "sync" else ""
        rows.append([MODEL[p["model"]], p["mode"], f"{p['makespan_s']:.0f} s", f"{p['trained_per_s']:.3f}",
                     f"{c['vs_sync'][p['mode']]:.2f}", str(p["dropped"]), f"{100 * p['older_token_share']:.1f}%",
                     str(p["largest_lag"]), " / ".join(f"{t:.0f}" for t in p["step_end_s"]), bounds])
    first = doc["points"][0]
    return table(["model", "mode", "makespan", "trained/s", "vs sync", "dropped", "trained tokens older",
                  "largest lag", "step ends (s)", "step bounds (s)"], rows) + [
        "", f"{first['steps']} steps of {first['prompts']} prompts x 8; virtual time, seed {first['seed']}."]


def t_partial_rollout_traces(d: dict) -> list[str]:
    """The same side by side on recorded agent traces, each recorded trajectory a prompt of G samples."""
    doc = d["partial-rollout-traces.json"]
    cells = {(c["trace"], c["model"]): c for c in doc["cells"]}
    rows = []
    for p in doc["points"]:
        c = cells[p["trace"], p["model"]]
        bounds = " / ".join(f"{b:.0f}" for b in c["step_bound_s"]) if p["mode"] == "sync" else ""
        rows.append([p["trace"], MODEL[p["model"]], p["mode"], f"{p['makespan_s']:.0f} s", f"{p['trained_per_s']:.3f}",
                     f"{c['vs_sync'][p['mode']]:.2f}", f"{c['tokens_vs_sync'][p['mode']]:.2f}", str(p["dropped"]),
                     f"{100 * p['older_token_share']:.1f}%", str(p["largest_lag"]),
                     " / ".join(f"{t:.0f}" for t in p["step_end_s"]), bounds])
    first = doc["points"][0]
    notes = []
    for c in doc["cells"]:
        if c["model"] != doc["cells"][0]["model"]:
            continue  # a trace's import is the same on every cell
        gaps = (f"the recorded model's time taken out of start-to-start gaps at {c['decode_tps']:.0f} tokens/s"
                if c["decode_tps"] else "gaps as recorded")
        notes.append(f"{c['trace']}: {c['recorded']} recorded trajectories, {c['turns']} turns (`{c['source']}`); "
                     f"{gaps}, a tool gap {c['tool_s_mean']:.2f} s on average.")
    return table(["trace", "model", "mode", "makespan", "trained/s", "vs sync", "tokens/s vs sync", "dropped",
                  "trained tokens older", "largest lag", "step ends (s)", "step bounds (s)"], rows) + [
        "", f"{first['steps']} steps of {first['prompts']} prompts x 8, each prompt a recorded trajectory replayed by "
            f"8 samples; virtual time, seed {first['seed']}.", "", *[f"- {n}" for n in notes]]


def t_async_updates(d: dict) -> list[str]:
    """prorsa against every fixed split on asynchronous runs with weight updates on a clock."""
    doc = d["async-updates.json"]
    rows = [[c["cell"], str(c["seed"]), "tuning" if (c["cell"], c["seed"]) == ("mix", 0) else "held out",
             f"{split(c['best_fixed'])} {c['best_figure']:.4f}", f"{c['colocated']:.4f}", f"{c['prorsa']:.4f}",
             f"{c['prorsa_vs_best']:.3f}", f"{c['prorsa_vs_colocated']:.3f}", str(c["switches"]),
             f"{c['sim_cost_vs_colocated']:.0f}x"] for c in doc["cells"]]
    return table(["cell", "seed", "set", "best fixed (traj/s)", "colocated", "prorsa", "prorsa / best",
                  "prorsa / colocated", "switches", "simulating prorsa / colocated"], rows) + [
        "", f"Lowest prorsa / best fixed split: {min(c['prorsa_vs_best'] for c in doc['cells']):.3f}."]


def overlap_split_table(name: str) -> Callable[[dict], list[str]]:
    """Partial rollouts (overlapped or not) under every fixed split and prorsa: trained trajectories per second."""
    def render(d: dict) -> list[str]:
        cells = d[name]["cells"]
        rows = [[c["model"], c["mode"], f"{split(c['best_fixed'])} {c['best_trained_per_s']:.4f}",
                 f"{c['colocated_trained_per_s']:.4f}", f"{c['prorsa_trained_per_s']:.4f}",
                 f"{c['prorsa_vs_best']:.3f}", f"{c['prorsa_vs_colocated']:.3f}", str(c["switches"])] for c in cells]
        return table(["model", "mode", "best fixed (trained/s)", "colocated", "prorsa", "prorsa / best",
                      "prorsa / colocated", "switches"], rows)
    return render


def t_rl_toy_partial(d: dict) -> list[str]:
    """rl-toy with partial rollouts: the first and last four trained steps' reward and call share."""
    doc = d["rl-toy-partial.json"]
    rows = [[f"first {len(doc['per_step'][:4])} steps", f"{doc['first']['reward_mean']:.3f}",
             f"{doc['first']['call_share']:.2f}"],
            [f"last {len(doc['per_step'][-4:])} steps", f"{doc['last']['reward_mean']:.3f}",
             f"{doc['last']['call_share']:.2f}"]]
    return table(["trained steps", "mean reward", "first turns calling the calculator"], rows) + [
        "", f"partial_rollout over_sample {doc['over_sample']}, carry: {len(doc['per_step'])} trained steps, "
            f"{doc['dropped']} trajectories dropped (cancelled as the last step ended), makespan "
            f"{doc['makespan_s']:.0f} s; one run."]


def t_sim_cost(d: dict) -> list[str]:
    """Simulating prorsa beside colocated, CPU time: no rehearsal kept, and the cache another seed left."""
    cells = d["sim-cost.json"]["cells"]
    rows = [[c["family"], c["model"], c["mode"], f"{c['colocated_cpu_s']:.2f}", f"{c['cold_vs_colocated']:.1f}x",
             f"{c['warm_vs_colocated']:.1f}x"] for c in cells]
    worst = {k: max(cells, key=lambda c: c[f"{k}_vs_colocated"]) for k in ("cold", "warm")}
    return table(["family", "model", "mode", "colocated (CPU s)", "prorsa cold / colocated",
                  "prorsa warm / colocated"], rows) + [
        "", f"Median of {cells[0]['repeat']} runs each, every run in a fresh process. Largest: cold "
            f"{worst['cold']['cold_vs_colocated']:.1f}x ({worst['cold']['family']} {worst['cold']['model']} "
            f"{worst['cold']['mode']}), warm {worst['warm']['warm_vs_colocated']:.1f}x ({worst['warm']['family']} "
            f"{worst['warm']['model']} {worst['warm']['mode']}); cells at 3x or under warm: "
            f"{sum(c['warm_vs_colocated'] <= 3 for c in cells)} of {len(cells)}. prorsa reached the same figure "
            "cold and warm in every cell (the script fails otherwise)."]


def t_tail_live_migrate(d: dict) -> list[str]:
    doc = d["tail-live-migrate.json"]
    moved = ", ".join(str(r["turns_migrated"]) for r in doc["live"] if r["on"])
    return t_tail_live(d, "tail-live-migrate.json") + ["", f"Turns migrated in the live runs with migrate on: {moved}."]


def t_forecast_skill(d: dict) -> list[str]:
    rows, ratios = [], {"prefill_tps": [], "decode_seqs": []}
    for c in d["forecast-skill.json"]["cells"]:
        row = [c["family"], MODEL.get(c["model"], c["model"]), c["mode"]]
        for m in ("prefill_tps", "decode_seqs"):
            by = c["mape"][m]
            row += [f2(by["forecast"]), f2(by["persistence"]), f2(by["ewma"])]
            if m == "prefill_tps":  # the lifecycle model before the blend (results files since it)
                row.append(f2(by.get("lifecycle")))
            if by["forecast"] is not None and by["persistence"] and by["ewma"]:
                ratios[m].append(by["forecast"] / min(by["persistence"], by["ewma"]))
        rows.append(row)
    spans = "; ".join(f"{m} {span(r)}" for m, r in ratios.items() if r)
    losing = {m: sum(x >= 1 for x in r) for m, r in ratios.items()}
    return table(["family", "model", "mode", "prefill tok/s: forecast", "persistence", "EWMA", "model alone",
                  "decoding seqs: forecast", "persistence", "EWMA"], rows) + [
        "", f"Forecast MAPE over the better baseline's, per cell (< 1: the forecast wins): {spans}. "
            f"Cells where it does not win: prefill_tps {losing['prefill_tps']} of {len(ratios['prefill_tps'])}, "
            f"decode_seqs {losing['decode_seqs']} of {len(ratios['decode_seqs'])}."]


def drivers_table(file: str, header: str, hits: bool = False) -> Callable[[dict], list[str]]:
    def render(d: dict) -> list[str]:
        doc = d[file]
        points = {(p[1], p[2], p[3]): p for p in doc["points"]}
        rows = []
        for r in doc["rows"]:
            v, mode, best = r["value"], r["mode"], r["best_static"]
            row = [f"{v:g}" if isinstance(v, (int, float)) else str(v), mode,
                   fig(points[(v, mode, "colocated")][4], mode), f"{r['best_vs_colocated']:.3f} ({split(best)})",
                   f3(r["prorsa_vs_colocated"]), f3(r["oracle_vs_colocated"]),
                   f3(r["prorsa_vs_colocated"] / max(1.0, r["best_vs_colocated"]))]
            if hits:
                row.append(" / ".join(f"{points[(v, mode, p)][5]:.0%}" for p in ("colocated", best, "prorsa")))
            rows.append(row)
        cols = [header, "mode", "colocated", "best static", "prorsa", "oracle", "prorsa / best"]
        return table(cols + (["prefix hit: colocated / best / prorsa"] if hits else []), rows)
    return render


def t_ep_headline(d: dict) -> list[str]:
    """Disaggregation's gain against the width of the DP-attention group, sync and async side by side."""
    by: dict = {}
    for f in ("drivers-ep.json", "drivers-ep-wide.json"):
        for r in d[f]["rows"]:
            by.setdefault(r["value"], {}).setdefault(r["mode"], r)
    rows = [[f"{v}", *[x for m in ("sync", "async") for x in (
        f"{by[v][m]['best_vs_colocated']:.3f} ({split(by[v][m]['best_static'])})",
        f3(by[v][m]["prorsa_vs_colocated"]))]] for v in sorted(by)]
    return table(["EP ranks an engine", "sync: best static", "sync: prorsa", "async: best static",
                  "async: prorsa"], rows)


PHASES = ["phases.json", "phases-ratio.json", "phases-sticky.json", "phases-ep16.json", "phases-ep16-ratio.json",
          "phases-ep16-sticky.json", "phases-ep16-first-block.json"]


def t_phases(d: dict) -> list[str]:
    rows = []
    for f in PHASES:
        doc = d[f]
        opts = options(doc["command"])
        setting = " ".join(f"--{k} {opts[k]}" for k in ("ep", "long", "decode", "blocks") if k in opts)
        by = {r["policy"]: r for r in doc["rows"]}
        best = by[doc["best_fixed"]]
        best_s = f"{split(best['policy'])}, {best['trajectories_per_s']:.3f} traj/s"
        if best["policy"] != "colocated":
            best_s += f" ({best['vs_colocated']:.3f}x colocated)"
        rows.append([setting or "defaults", opts.get("sticky-overload", "cost"), best_s,
                     *[f"{by[p]['vs_best_fixed']:.3f} ({by[p]['switches']})" for p in ("prorsa", "oracle")]])
    return table(["setting", "routing", "best fixed split", "prorsa / best fixed (switches)",
                  "oracle / best fixed (switches)"], rows)


# ------------------------------------------------------------------------------------ the live tables

def grid_table(file: str) -> Callable[[dict], list[str]]:
    """The live grid; where the file has them, the simulator's figures for the same cells beside."""
    def render(d: dict) -> list[str]:
        doc = d[file]
        statics = sorted({p for c in doc["cells"] for p in c["result"]["per_policy"] if p.startswith("static:")})
        reactive = any("reactive" in c["result"]["per_policy"] for c in doc["cells"])
        sims = all(c.get("sim") for c in doc["cells"])
        rows, met, kept, sim_met = [], 0, 0, 0
        for c in doc["cells"]:
            res, per = c["result"], c["result"]["per_policy"]
            pr = per["prorsa"]
            mape = pr["forecast_mape"] or {}
            row = [c["family"], live_model(c), c["mode"], fig(per["colocated"]["figure"], c["mode"]),
                   *[f2(per[s]["ratio"]) + ("*" if s == res["best_static"] else "") for s in statics],
                   *([f2(per["reactive"]["ratio"])] if reactive else []), f3(pr["ratio"]),
                   f3(res["prorsa_vs_best"]), f"{pr['role_switches']:.0f}"]
            if sims:
                sim = c["sim"]
                row += [f"{f3(sim['prorsa_vs_best'])} ({split(sim['best_static'])})",
                        f"{sim['per_policy']['prorsa']['role_switches']:.0f}"]
                sim_met += sim["prorsa_vs_best"] >= doc["goal"]
            rows.append(row + [f"{f2(mape.get('prefill_tps'))} / {f2(mape.get('decode_seqs'))}",
                               f2(pr["prefix_hit"])])
            met += bool(res["goal_met"])
            kept += pr["role_switches"] == 0
        n = len(doc["cells"])
        head = ["family", "model", "mode", "colocated", *map(split, statics), *(["reactive"] if reactive else []),
                "prorsa", "prorsa / best", "switches",
                *(["simulated prorsa / best (best static)", "simulated switches"] if sims else []),
                "MAPE P / D", "hit"]
        return table(head, rows) + [
            "", f"prorsa at {doc['goal']} or more of the better of colocated and the best static split in {met} of "
                f"{n} cells" + (f" live, {sim_met} of {n} simulated" if sims else "")
                + f"; prorsa switched no role in {kept} of {n}."]
    return render


def repeats_table(files: list[str], grid: str, ranges: bool) -> Callable[[dict], list[str]]:
    """Cells re-run several times, beside the single run of the grid they came from."""
    def render(d: dict) -> list[str]:
        once = {live_key(c): c["result"]["prorsa_vs_best"] for c in d[grid]["cells"]}
        rows = []
        for c in [c for f in files for c in d[f]["cells"]]:
            res, per, mode = c["result"], c["result"]["per_policy"], c["mode"]
            best = res["best_static"]
            colo, prorsa = fig(per["colocated"]["figure"], mode), f3(per["prorsa"]["ratio"])
            if ranges:
                colo += f" ({span(run_figures(c, 'colocated'))})"
                prorsa += f" ({span(run_figures(c, 'prorsa'))}{' s' if mode == 'sync' else ' /s'})"
            rows.append([c["family"], live_model(c), mode, f3(once.get(live_key(c))), colo,
                         f"{per[best]['ratio']:.3f} ({split(best)})", prorsa, f3(res["prorsa_vs_best"]),
                         f"{per['prorsa']['role_switches']:.0f}", str(per["prorsa"]["runs"])])
        return table(["family", "model", "mode", "prorsa / best, one run", "colocated", "best static", "prorsa",
                      "prorsa / best, median", "switches", "runs"], rows)
    return render


PAIRS = ["policies_live-search-moe-async.json", "policies_live-math-tir-moe-async-prorsa.json",
         "policies_live-math-tir-moe-async-cpu-cap.json"]


def t_pairs(d: dict) -> list[str]:
    rows = []
    for f in PAIRS:
        c = d[f]["cells"][0]
        col, pr = run_figures(c, "colocated"), run_figures(c, "prorsa")
        ctl = [r["summary"]["control"] for r in c["runs"]["prorsa"]]
        walls = [x["step_s_median"] * 1000 for x in ctl]
        cpus = [x["step_cpu_s_median"] * 1000 for x in ctl if x.get("step_cpu_s_median") is not None]
        rows.append([f"{c['family']} {live_model(c)} {c['mode']}", f"`{f}`", str(len(pr)),
                     f"{statistics.median(col):.2f} ({span(col)})", f"{statistics.median(pr):.2f} ({span(pr)})",
                     f3(c["result"]["per_policy"]["prorsa"]["ratio"]),
                     f"{min(walls):.0f}-{max(walls):.0f}", f"{min(cpus):.0f}-{max(cpus):.0f}" if cpus else "-"])
    return table(["cell", "results", "repeats", "colocated traj/s", "prorsa traj/s", "prorsa / colocated",
                  "prorsa's control step, wall ms", "its CPU ms"], rows)


REAL_TIME = ["policies_live-swe-moe-real-time.json", "policies_live-swe-moe-async-real-time.json",
             "policies_live-math-tir-moe-async-real-time.json"]


def t_real_time(d: dict) -> list[str]:
    rows = []
    for f in REAL_TIME:
        c = d[f]["cells"][0]
        res, per, mode = c["result"], c["result"]["per_policy"], c["mode"]
        pols = ["colocated", *sorted(p for p in per if p.startswith("static:")), "prorsa"]
        loads = [max(x for r in c["runs"][p] for x in r["load1"]) for p in pols]
        rows.append([c["family"], live_model(c), mode,
                     *[fig(per[p]["figure"], mode) + ("" if p == "colocated" else f" ({per[p]['ratio']:.3f})")
                       for p in pols],
                     f3(res["prorsa_vs_best"]), f"{per['prorsa']['role_switches']:.0f}",
                     " / ".join(f"{x:.1f}" for x in loads)])
    return table(["family", "model", "mode", "colocated", "static 1:3", "prorsa", "prorsa / best", "switches",
                  "1-min load: colocated / 1:3 / prorsa"], rows)


def t_vllm_cell(d: dict) -> list[str]:
    """One pipeline live on vLLM engines, every policy, beside the simulator's figure for each."""
    doc = d["policies_live-vllm-quickstart.json"]
    c = doc["cells"][0]
    per, sim, mode = c["result"]["per_policy"], c["sim"]["per_policy"], c["mode"]
    rows = [[p, ", ".join(f"{x:.2f}" for x in run_figures(c, p)), fig(v["figure"], mode), f3(v["ratio"]),
             f"{v['role_switches']:.0f}", fig(sim[p].get(figure_key(mode)), mode), f3(sim[p]["ratio"]),
             f"{sim[p]['role_switches']:.0f}"] for p, v in per.items()]
    load = max(x for rs in c["runs"].values() for r in rs for x in r["load1"])
    return table(["policy", "live runs", f"live (median of {doc['args']['repeats']})", "vs colocated", "switches",
                  "simulated", "vs colocated", "switches"], rows) + [
        "", f"prorsa over the best fixed split: live {f3(c['result']['prorsa_vs_best'])} ({best_fixed(per)}), "
            f"simulated {f3(c['sim']['prorsa_vs_best'])} ({best_fixed(sim)}). Highest 1-min load around the "
            f"runs {load:.1f}."]


def t_leg_overhead(d: dict) -> list[str]:
    """The simulator with a per-leg dispatch cost, beside the same splits live (medians)."""
    doc, live = d["leg-overhead.json"], d["policies_live-moe-repeats.json"]
    dispatch = sorted({p["dispatch_s"] for p in doc["points"]})
    measured = {(f"{c['family']}/{'moe' if c['ep'] > 1 else 'dense'}/{c['mode']}", pol): v["ratio"]
                for c in live["cells"] for pol, v in c["result"]["per_policy"].items()}
    keys = list(dict.fromkeys((p["cell"], p["policy"]) for p in doc["points"]))
    sim = {(p["cell"], p["policy"], p["dispatch_s"]): p["ratio"] for p in doc["points"]}
    rows = [[cell, split(pol), f3(measured.get((cell, pol)))] + [f3(sim[cell, pol, x]) for x in dispatch]
            for cell, pol in keys]
    moved = max(abs(sim[(*k, 0.22)] - sim[(*k, 0.0)]) for k in keys)
    gaps = [sim[(*k, 0.0)] - measured[k] for k in keys if measured.get(k) is not None]
    return table(["cell", "split", "live (vs colocated)"] + [f"simulated, {x:g} s a leg" for x in dispatch], rows) + [
        "", f"Ratios to colocated (> 1: the split ahead). Live is {min(gaps):.3f}-{max(gaps):.3f} below the "
            f"simulator with no leg cost; pricing 0.22 s a leg (22 ms at a tenth of real time) moves a simulated "
            f"ratio by {moved:.3f} at most."]


def t_live_time_scale(d: dict) -> list[str]:
    """One live cell at two time scales, side by side: what of a split's live gap is the clock's."""
    rows = []
    for name in TIME_SCALE_FILES:
        c = d[name]["cells"][0]
        ts, per = c["time_scale"], c["result"]["per_policy"]
        for pol in per:
            runs = ", ".join(f"{x / ts:.1f}" for x in run_figures(c, pol))
            load = max(x for r in c["runs"][pol] for x in r["load1"])
            rows.append([f"{ts:g}", split(pol), runs, f3(per[pol]["ratio"]), f"{load:.1f}"])
    ratios = {d[n]["cells"][0]["time_scale"]: d[n]["cells"][0]["result"]["per_policy"]["static:1:3"]["ratio"]
              for n in TIME_SCALE_FILES}
    lo, hi = min(ratios), max(ratios)
    sim = next(q["ratio"] for q in d["leg-overhead.json"]["points"]
               if (q["cell"], q["policy"], q["dispatch_s"]) == ("swe/moe/sync", "static:1:3", 0.0))
    return table(["time scale", "policy", "makespans (cost-model s)", "vs colocated", "highest load"], rows) + [
        "", f"1:3 against colocated: {f3(ratios[lo])} at {lo:g} of real time, {f3(ratios[hi])} at {hi:g} "
            f"(simulated, the same cell: {f3(sim)})."]


ENGINES_32 = ("held-out-engines-32.json", "held-out-engines-32-coarse.json", "held-out-engines-32-swe-async.json")
TIME_SCALE_FILES = ("policies_live-time-scale-0.1.json", "policies_live-time-scale-0.3.json")


def best_fixed(per: dict) -> str:
    """The fastest of colocated and the static splits, by their ratio to colocated."""
    return split(max((p for p in per if p == "colocated" or p.startswith("static:")), key=lambda p: per[p]["ratio"]))


def t_moe_step(d: dict) -> list[str]:
    doc = d["policies_live-moe-step.json"]
    c = doc["cells"][0]
    res, per = c["result"], c["result"]["per_policy"]
    rows = [[p + (" (best static)" if p == res["best_static"] else ""), fig(v["figure"], "sync"), f3(v["ratio"]),
             f"{v['role_switches']:.0f}"] for p, v in per.items()]
    runs = [r["summary"] for rs in c["runs"].values() for r in rs]
    done = sorted({(s["trajectories_completed"], s["trajectories_expected"], s["turns"]) for s in runs})
    mape = per["prorsa"]["forecast_mape"] or {}
    load = max(x for rs in c["runs"].values() for r in rs for x in r["load1"])
    return table(["policy", f"makespan (median of {doc['args']['repeats']})", "vs colocated", "switches"], rows) + [
        "", f"prorsa / best static: {res['prorsa_vs_best']:.3f}. Runs: {len(runs)}, each "
            + "; ".join(f"{a} of {b} trajectories, {t} turns" for a, b, t in done)
            + f"; highest 1-min load around them {load:.2f}. prorsa's forecast error (MAPE): prefill tokens/s "
              f"{f2(mape.get('prefill_tps'))}, decoding sequences {f2(mape.get('decode_seqs'))}."]


def t_fidelity(d: dict) -> list[str]:
    doc = d["fidelity.json"]
    rows = [[c["case"] + (" (fitted on)" if c["fitted_on"] else ""), f"{c['live_median_s']:.2f} s",
             f"{c['sim_s']:.2f} s", f3(c["ratio"]), f"{c['sim_host_fitted_s']:.2f} s", f3(c["ratio_host_fitted"])]
            for c in doc["cases"]]
    return table(["case", "live", "sim", "sim / live", "sim, host fitted", "fitted / live"], rows) + [
        "", f"Host fit: {doc['host_fit']}."]


def t_fidelity_vllm(d: dict) -> list[str]:
    doc = d["fidelity-vllm.json"]
    rows = [[f"{r['seed']} ({r['role']})", ", ".join(f"{x:.1f} s" for x in r["live_runs_s"]),
             f"{r['live_median_s']:.2f} s", f"{r['sim_calibrated_s']:.2f} s",
             f3(r["sim_calibrated_s"] / r["live_median_s"]), f"{r['sim_fitted_s']:.2f} s",
             f3(r["sim_fitted_s"] / r["live_median_s"])] for r in doc["runs"]]
    fit = doc["fitted"]
    return table(["seed", "live runs", "live median", "sim, one-engine profile", "ratio", "sim, fitted", "ratio"],
                 rows) + ["", f"Fitted: {fit['dispatch_latency_s'] * 1000:.0f} ms a leg outside the engines, "
                              f"{fit['net_latency_s'] * 1000:.0f} ms a KV pull, in {len(doc['corrections'])} "
                              f"corrections."]


def t_chaos(d: dict) -> list[str]:
    """chaos.py's runs (plain, or --partial: trained trajectories, drops beside) and chaos_serve.py's
    (answered turns; its failed: requests a client gave up on; no clean run to compare)."""
    rows, notes = [], []
    for f, doc in d.items():
        kinds = doc["faults_by_kind"]
        faults = f"{doc['faults_injected']} ({', '.join(f'{n} {k}' for k, n in kinds.items())})"
        if "turns_lost" in doc:
            run = doc["run"]
            rows.append([f"`{f}`", f"{run['turns_answered']} turns answered ({run['rows']} conversations)", "-",
                         faults, str(doc["faults_survived"]),
                         f"{doc['turns_lost']} / {doc['turns_duplicated']} / {run['gave_up']}", "-",
                         str(run["legs_rescued"]), str(run["turns_retried"]), "-", "-"])
            outcomes = ", ".join(f"{n} {k}" for k, n in sorted(run["outcomes"].items(), key=lambda kv: -kv[1]))
            notes.append(f"`{f}`: exit {run['exit_code']}, {run['tracebacks']} tracebacks on its console; client "
                         f"outcomes {outcomes}; {run['retries']} retries.")
            continue
        bad, clean = doc["faulty_run"], doc["clean_run"]
        which = "makespan_s" if doc["makespan_overhead"] is not None else "wall_s"
        over = doc["makespan_overhead"] if which == "makespan_s" else doc["wall_overhead"]
        count = str(bad["trajectories_expected"])
        if "trajectories_trained" in doc:
            count = f"{doc['trajectories_trained']} of {count} trained, {doc['trajectories_dropped']} dropped"
        rows.append([f"`{f}`", count, str(doc["driver_kills"]), faults, str(doc["faults_survived"]),
                     f"{doc['trajectories_lost']} / {doc['trajectories_duplicated']} / {doc['trajectories_failed']}",
                     str(bad["trajectories_resumed"]), str(bad["legs_rescued"]), str(bad["turns_retried"]),
                     f"{which.removesuffix('_s')} {bad[which]:.1f} s vs {clean[which]:.1f} s", f"{over:+.1%}"])
    lines = table(["results", "trajectories", "driver kills", "faults", "survived", "lost / duplicated / failed",
                   "resumed", "legs re-bound", "turns retried", "faulty vs clean", "overhead"], rows)
    return lines + ["", *notes] if notes else lines


# ------------------------------------------------------------------------------------ control plane

def t_allocator_scale(d: dict) -> list[str]:
    """The allocator's step against engines: the split search beside pricing every split."""
    doc = d["allocator-scale.json"]
    interval, rows = doc["control_interval_s"], []
    for r in doc["rows"]:
        search = statistics.median(r["search_ms"])
        if r["exhaustive_ms"]:
            every = f"{statistics.median(r['exhaustive_ms']):.1f} ms"
            same = f"{sum(r['same_plan'])} / {sum(r['same_moves'])} / {len(r['same_plan'])}"
            net = f2(min(r["net_search_vs_every"]))
        else:
            every, same, net = f"~{r['exhaustive_ms_extrapolated']:.0f} ms (extrapolated)", "-", "-"
        rows.append([str(r["engines"]), MODEL[r["model"]], f"{r['splits']:,}",
                     f"{statistics.median(r['search_priced']):,.0f}", f"{search:.1f} ms",
                     f"{search / 1e3 / interval:.1%}", every, same, net])
    return [*table(["engines", "model", "splits", "splits priced", "step (search)", "share of the interval",
                    "step (every split)", "same plan / same moves / states", "goal objective, least ratio"],
                   rows),
            "", f"CPU time of `Allocator.plan`, median over {doc['rows'][0]['states']} seeded states; the "
                f"interval is runtime.control_interval_s ({interval:g} s), the goal under "
                f"{doc['goal_share']:.0%} of it. Up to 128 engines the search prices every split. \"same "
                "moves\": the same switches toward the same goal (a plan may differ only in the runner-up "
                "its reason names); \"goal objective\": the search's goal's cost + hysteresis x switch "
                "cost over the full table's, the least of the states (< 1: the search's goal is the "
                "better by the allocator's own measure)."]


def t_control_plane_processes(d: dict) -> list[str]:
    """Prorsa's runtime with the scheduler and every worker in processes of their own."""
    doc, rows = d["control-plane-processes.json"], []
    for r in doc["rows"]:
        med = {k: statistics.median(run[k] for run in r["runs"])
               for k in ("turns", "turns_per_s", "scheduler_cpu_ms_per_turn", "driver_cpu_ms_per_turn")}
        rows.append([str(r["engines"]), str(r["trajectories"]), f"{med['turns']:.0f}", f"{med['turns_per_s']:.1f}",
                     f"{med['scheduler_cpu_ms_per_turn']:.2f} ms", f"{med['driver_cpu_ms_per_turn']:.2f} ms",
                     f"{1e3 / med['scheduler_cpu_ms_per_turn']:.0f}"])
    return [*table(["engines", "trajectories", "turns", "turns/s", "scheduler CPU a turn", "driver CPU a turn",
                    "turns/s a scheduler core carries"], rows),
            "", f"Median of {len(doc['rows'][0]['runs'])} run(s) a row, up to {doc['turn_cap']} turns a "
                "trajectory. CPU is counted over the whole run, the workers joining and the engines "
                "starting included; the last column is 1 s over the scheduler's CPU a turn, the turns/s "
                "at which one scheduler core would be saturated."]


def t_scale(d: dict) -> list[str]:
    """Demand on the control plane per cluster size (simulated or extrapolated) beside the capacity
    one scheduler and one driver give (control-plane measurements, fitted): benchmarks/scale.py."""
    doc = d["scale.json"]
    goal, rows = doc["headroom_goal"], []
    for r in doc["rows"]:
        s, v = r["scheduler"], r["driver"]
        rows.append([f"{r['gpus']:,}", MODEL[r["model"]], f"{r['engines']:,}", f"{r['trajectories']:,}", r["demand"],
                     f"{r['turns_per_s_mean']:,.0f} / {r['turns_per_s_peak']:,.0f}", f"{r['tasks_per_s_peak']:,.0f}",
                     f"{s['cpu_ms_per_turn']:.2f} ms", f"{s['utilisation']:.0%}",
                     f"{s['headroom_mean']:.2f}x / {s['headroom']:.2f}x", f"{v['cpu_ms_per_turn']:.2f} ms",
                     f"{v['utilisation']:.0%}", f"{v['headroom_mean']:.2f}x / {v['headroom']:.2f}x",
                     "-" if r["cells"] is None else str(r["cells"])])
    fits = doc["fits"]

    def fit_text(k: str) -> str:
        f = fits[k]
        held = f" ({', '.join(f['held_at_zero'])} held at 0: below 0 in the free fit)" if f["held_at_zero"] else ""
        pair = ", ".join(f"{x['cpu_ms_per_turn']:.2f} ms at {x['engines']}" for x in f["pairs"])
        pair = f"; the turns a second trajectory count added, at the same engines: {pair}" if pair else ""
        return (f"{k} {f['r']:.1%} of a core + {f['a']:.3f} + {f['b']:.4f} x engines + {f['c']:.3f} x "
                f"trajectories/1,000 ms a turn{held}, worst run off by {f['worst_relative_error']:.0%}{pair}")

    points = ", ".join(f"{p['engines']} x {p['trajectories']:,}: {p['turns']:,} turns in {p['run_wall_s']:.0f} s, "
                       f"{p['scheduler_cpu_s']:.1f} / {p['driver_cpu_s']:.1f} s" for p in doc["measured"])
    commands = "; ".join(f"`{m['command']}`" for m in doc["measured_from"])
    head = []
    for model, h in doc["headline"].items():
        row = "none of the sizes" if h["largest_row"] is None else f"{h['largest_row']:,} GPUs of the rows"
        head.append(f"{MODEL[model]}: {row}; up to {h['largest_gpus']:,} GPUs at the peak, "
                    f"{h['largest_gpus_mean']:,} at the mean demand")
    first = [("scheduler" if r["scheduler"]["headroom"] <= r["driver"]["headroom"] else "driver") for r in doc["rows"]]
    binds = ", ".join(f"the {k} in {first.count(k)} of the {len(first)} rows" for k in ("scheduler", "driver"))
    sims = sorted({x["gpus"] for x in doc["demand"]})
    return [*table(["GPUs", "model", "engines", "trajectories in flight", "demand", "turns/s mean / peak",
                    "scheduler tasks/s (peak)", "scheduler CPU a turn (fitted)", "scheduler core use (peak)",
                    "scheduler headroom mean / peak", "driver CPU a turn (fitted)",
                    "driver core use (peak)", "driver headroom mean / peak", f"cells for {goal:g}x (peak)"], rows),
            "", f"Demand: the paper's SWE cell ({doc['per_gpu_trajectories']} trajectories a GPU, one synchronous "
                f"step, up to {doc['max_turns']} turns, policy {doc['policy']}) simulated at "
                f"{', '.join(f'{g:,}' for g in sims)} GPUs; larger sizes extrapolated per GPU from the largest "
                f"simulated. Peak: the busiest {doc['demand'][0]['window_s']:g} s of the step. Scheduler tasks: "
                f"{doc['tasks_per_turn']} a turn (prefill, decode, tool). Core use = background + peak turns/s x CPU a "
                f"turn; headroom = the turns/s the rest of one core carries over the demand; cells: the fewest "
                f"equal groups of engines, a scheduler and a driver each, in which all have {goal:g}x at the peak.",
            "", f"Measured runs (engines x trajectories in flight: turns, wall, scheduler / driver CPU after every "
                f"worker joined): {points}. Least-squares fits of CPU s = background x wall + turns x CPU a turn: "
                f"{fit_text('scheduler')}; {fit_text('driver')}. Measured by: {commands}.",
            "", f"Largest cluster one scheduler and one driver serve with >= {goal:g}x headroom: {'; '.join(head)}. "
                f"Lower headroom at the peak (binds first): {binds}."]


def t_cells_sim(d: dict) -> list[str]:
    """Simulated cells beside one cell: makespan, moves, and the busiest cell's scheduler load
    against the capacity one scheduler and one driver have (benchmarks/cells.py --sim)."""
    doc, big = d["cells-sim.json"], d["cells-sim-4096.json"]  # the 4,096-GPU point, run on its own
    ms = doc["cpu_ms_per_turn"]
    rows = []
    for r in sorted(doc["rows"] + big["rows"], key=lambda r: (r["gpus"], r["cells"])):
        busy = max(r["per_cell"], key=lambda c: c["turns_per_s_peak"])
        rows.append([f"{r['gpus']:,}", str(r["cells"]), f"{r['engines_per_cell']:,}",
                     f"{r['distinct']:,} / {r['trajectories']:,}", f"{r['makespan_s']:.1f}",
                     f"{r['trajectories_per_s']:.1f}", str(len(r["moves"])), str(r["role_switches"]),
                     f"{busy['turns_per_s_mean']:,.0f} / {busy['turns_per_s_peak']:,.0f}",
                     f"{1e3 / ms['scheduler'] / busy['turns_per_s_peak']:.2f}x",
                     f"{1e3 / ms['driver'] / busy['turns_per_s_peak']:.2f}x", f"{r['sim_wall_s']:.0f} s"])
    rerun = {(r["gpus"], r["cells"]) for r in big["rows"]}
    skipped = "; ".join(f"{x['gpus']:,} GPUs as {x['cells']} cell(s): {x['why']}"
                        + (f" there, then run alone: `{big['command']}` (commit {big['commit']})"
                           if (x["gpus"], x["cells"]) in rerun else "")
                        for x in doc.get("skipped", []))
    return [*table(["GPUs", "cells", "engines a cell", "trajectories distinct / run", "makespan s", "trajectories/s",
                    "moves", "role switches", "busiest cell turns/s mean / peak", "scheduler headroom (peak)",
                    "driver headroom (peak)", "simulated in"], rows),
            "", f"The paper's SWE step as scale.py simulates it ({doc['per_gpu_trajectories']} trajectories a GPU, "
                f"up to {doc['max_turns']} turns, policy {doc['policy']} in every cell). Headroom: the turns/s one "
                f"core carries at scale.py's fitted CPU a turn ({ms['scheduler']:.2f} ms scheduler, "
                f"{ms['driver']:.2f} ms driver) over the busiest cell's peak ({doc['rows'][0]['window_s']:g} s "
                f"window)." + (f" Over its time in the command above: {skipped}." if skipped else "")
                + " 4,096 GPUs as one cell was not run (the one-cell 1,024 row took 8x the 4-cell one here)."]


def t_cells_live(d: dict) -> list[str]:
    """Two live cells on this machine: trajectories, role switches and moves (benchmarks/cells.py --live)."""
    doc = d["cells-live.json"]
    r = doc["live"]
    rows = [[str(i), str(n), f"{m:.1f}", str(k), ", ".join(e)]
            for i, (n, m, k, e) in enumerate(zip(r["cell_trajectories"], r["cell_makespans_s"], r["role_switches"],
                                                 r["engines_at_end"]))]
    moves = "; ".join(f"{m['engine']} from cell {m['source']} to cell {m['target']} at {m['time_s']:.1f} s "
                      f"(drain {m['drain_s']:.2f} s, restart {m['restart_s']:.2f} s: {m['reason']})" for m in r["moves"])
    return [*table(["cell", "trajectories", "makespan s (wall)", "role switches", "engines at the end"], rows),
            "", f"{r['distinct']} distinct trajectory ids of {r['trajectories']} finished ({r['expected']} expected), "
                f"policy {doc['policy']} in each cell, {r['engines']} engines. Moves: {moves or 'none'}."]


def t_cells_processes(d: dict) -> list[str]:
    """The two live cells with runtime.processes off and on (benchmarks/cells.py --live --processes)."""
    runs = d["cells-processes.json"]["runs"]
    rows = [["on" if r["processes"] else "off", f"{r['makespan_s']:.1f}", f"{r['driver_cpu_s']:.1f}",
             f"{r['children_cpu_s']:.1f}", f"{r['distinct']} / {r['expected']}", str(len(r["moves"])),
             str(sum(r["role_switches"]))] for r in runs]
    return table(["runtime.processes", "makespan s (wall)", "driver process CPU s", "child processes CPU s",
                  "trajectories distinct / expected", "moves", "role switches"], rows)


def t_api_overhead(d: dict) -> list[str]:
    doc = d["api-overhead.json"]
    run = doc["doors"]["run"]["median_s"]
    names = {"run": "`prorsa run`", "api": "Python API (`prorsa.Rollout`)"}
    rows = [[names[k], ", ".join(f"{x:.2f}" for x in v["makespans_s"]), f"{v['median_s']:.2f} s",
             f"{v['median_s'] / run - 1:+.1%}", f"{min(v['completed'])}/{v['trajectories']}"]
            for k, v in doc["doors"].items()]
    return table(["door", "makespans (s)", "median", "vs prorsa run", "completed (fewest)"], rows) + [
        "", f"Python API overhead on the median makespan: {doc['api_overhead']:+.1%} (goal: within 5%)."]


# ------------------------------------------------------------------------------ the tests' own test

def mutation_table(before_file: str, after_file: str) -> Callable[[dict], list[str]]:
    """Per module, the same seeded mutants against the tests before and after the known answers."""
    return lambda d: _mutation(d[before_file], d[after_file])


def _mutation(before: dict, after: dict) -> list[str]:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    rows = []
    for m, a in after["modules"].items():
        b = before["modules"][m]
        rows.append([m if m == "total" else f"`{m}`", str(a["mutants"]), pct(b["score"]),
                     pct(b["score_without_equivalent"]), str(a["killed"]), str(a["timeout"]), str(a["survived"]),
                     str(a["equivalent"]), pct(a["score"]), pct(a["score_without_equivalent"])])
    left = [r for r in after["survivors"] if not r.get("equivalent")]
    lines = table(["module", "mutants", "before", "before, w/o equivalent", "now killed", "timed out", "survived",
                   "of them equivalent", "after", "after, w/o equivalent"], rows)
    lines += ["", f"The same {after['drawn']} of {after['population']} mutants (seed {after['seed']}) both times. "
                  f"Surviving now: {len(after['survivors'])}, of which {len(left)} not judged equivalent."]
    if after["survivors"]:
        lines += ["", *table(["where", "operator", "change", "equivalent because"],
                             [[f"`{r['file']}:{r['line']}`", r["operator"], r["description"].replace("|", "\\|"),
                               r.get("equivalent", "**not judged equivalent**")] for r in after["survivors"]])]
    return lines


def groups_table(file: str) -> Callable[[dict], list[str]]:
    """Engine groups: the best heterogeneous layout against the best equal-sized one, per cell."""
    return lambda d: _groups(d[file])


def _groups(doc: dict) -> list[str]:
    rows, wins, wides = [], [], []
    for c in doc["cells"]:
        v, gpus = c["vs_colocated"], c["gpus"]
        equal, het, wide = c["best_equal"], c["best_hetero"], c["best_wide"]
        rows.append([c["family"], c["mode"], fig(c["colocated"], c["mode"]), f"{v[equal]:.3f} ({equal})",
                     f"{v[het]:.3f} ({het}, {gpus[het]} GPUs)", f3(c["hetero_vs_best_equal"]),
                     f"{v[wide]:.3f} ({wide}, {gpus[wide]} GPUs)", f3(c["wide_vs_best_equal"])])
        wins.append(c["hetero_vs_best_equal"])
        wides.append(c["wide_vs_best_equal"])
    return table(["family", "mode", "colocated EP8", "best equal-sized", "best heterogeneous",
                  "heterogeneous / best equal", "best with wide decode engines only", "wide only / best equal"],
                 rows) + [
        "", f"Over the {len(wins)} cells, the best heterogeneous layout against the best equal-sized one: "
            f"{min(wins):.3f}-{max(wins):.3f}; with every decode engine EP8 or wider: {min(wides):.3f}-{max(wides):.3f}."]


def t_groups_layouts(d: dict) -> list[str]:
    """Every layout of the engine-groups benchmark as a ratio to colocated EP8, one column per cell."""
    cells = d["groups.json"]["cells"]
    names: list[str] = []
    for c in cells:
        names += [n for n in c["vs_colocated"] if n not in names]
    wide = set(cells[0]["wide_decode"])
    rows = [[n + (" (wide)" if n in wide else ""), str(cells[0]["gpus"][n]), *[f3(c["vs_colocated"].get(n)) for c in cells]]
            for n in names]
    return table(["layout", "GPUs", *[f"{c['family']} {c['mode']}" for c in cells]], rows)


def t_groups_prorsa(d: dict) -> list[str]:
    """prorsa on flexible heterogeneous groups against every fixed split of them and the best equal-sized layout."""
    doc = d["groups-prorsa.json"]
    rows, fixed, same, equal = [], [], [], []
    for c in doc["cells"]:
        rows.append([c["family"], c["mode"], c["layout"], fig(c["colocated"], c["mode"]), f"{c['equal']:.3f} ({c['best_equal']})",
                     f3(c["opening_static"]), f"{c['fixed']:.3f} ({c['best_fixed'].removeprefix('fixed ')})",
                     f3(c["fixed_with_prior"]), f3(c["none"]["ratio"]), f3(c["earlier"]["ratio"]),
                     f3(c["none"]["vs_fixed"]), f3(c["earlier"]["vs_fixed"]),
                     f3(c["earlier"]["ratio"] / c["fixed_with_prior"]), f3(c["earlier"]["vs_equal"])])
        fixed += [c["none"]["vs_fixed"], c["earlier"]["vs_fixed"]]
        same += [c["earlier"]["ratio"] / c["fixed_with_prior"]]
        equal += [c["none"]["vs_equal"], c["earlier"]["vs_equal"]]
    return table(["family", "mode", "groups", "colocated EP8", "best equal-sized", "groups static",
                  "best fixed split of the groups", "the same with the earlier run's prior", "prorsa, no prior",
                  "prorsa, earlier run", "no prior / best fixed", "earlier / best fixed",
                  "earlier / best fixed with the prior", "earlier / best equal"], rows) + [
        "", f"Over the {len(doc['cells'])} rows, prorsa (either prior) against the best fixed split of the same groups: "
            f"{min(fixed):.3f}-{max(fixed):.3f} (with the earlier run's prior, against that split under the same prior: "
            f"{min(same):.3f}-{max(same):.3f}); against the best equal-sized layout: {min(equal):.3f}-{max(equal):.3f}."]


def model_error_table(*files: str) -> Callable[[dict], list[str]]:
    """benchmarks/model_error.py: prorsa over the best fixed split, one column per model error (the
    cells of several results files one after another)."""
    def short(error: str) -> str:
        return "exact" if error == "exact" else " ".join(f"{k[0].upper()}x{v}" for k, v in
                                                          (part.split("=") for part in error.split(",")))

    def render(d: dict) -> list[str]:
        cells = [c for f in files for c in d[f]["cells"]]
        errors = list(cells[0]["prorsa_vs_best"])
        rows = [[c["family"], c["mode"], str(c["seed"]), str(c.get("engines", 8)),
                 split(c["best_fixed"]) if c["best_fixed"] != "colocated" else "colocated",
                 *(f3(c["prorsa_vs_best"][e]) for e in errors)] for c in cells]
        low = {e: min(cells, key=lambda c: c["prorsa_vs_best"][e]) for e in errors}
        return table(["family", "mode", "seed", "engines", "best fixed", *map(short, errors)], rows) + [
            "", f"Over the {len(cells)} cells, lowest prorsa / best fixed and cells at 0.97 or better, per model "
                "error (P: prefill, D: decode throughput of the policy's model over the engines'): " + "; ".join(
                    f"{short(e)} {low[e]['prorsa_vs_best'][e]:.3f}, "
                    f"{sum(c['prorsa_vs_best'][e] >= 0.97 for c in cells)} of {len(cells)}" for e in errors) + "."]
    return render


def held_out_ep_table(*files: str) -> Callable[[dict], list[str]]:
    """benchmarks/model_error.py --ep: prorsa (exact model) over the best fixed split at other EP widths,
    with the lowest figure and the cells at 0.97 or better per width."""
    def render(d: dict) -> list[str]:
        cells = [c for f in files for c in d[f]["cells"]]
        widths = list(dict.fromkeys(c["ep"] for c in cells))
        rows = [[c["family"], c["mode"], str(c["seed"]), str(c["engines"]), f"EP{c['ep']}",
                 split(c["best_fixed"]), f3(c["prorsa_vs_best"]["exact"]), str(c["switches"]["exact"])]
                for c in cells]

        def low(cs: list[dict]) -> str:
            figures = [c["prorsa_vs_best"]["exact"] for c in cs]
            return f"{min(figures):.3f}, {sum(x >= 0.97 for x in figures)} of {len(figures)}"
        return table(["family", "mode", "seed", "engines", "EP", "best fixed", "exact",
                      "prorsa switches"], rows) + [
            "", "Lowest prorsa / best fixed and cells at 0.97 or better, per EP width: " + "; ".join(
                f"EP{w} {low([c for c in cells if c['ep'] == w])}" for w in widths)
                + f"; over the {len(cells)} cells {low(cells)}."]
    return render


def held_out_dense_table(*files: str) -> Callable[[dict], list[str]]:
    """benchmarks/paper.py --models dense at held-out seeds: prorsa over the best fixed split."""
    def render(d: dict) -> list[str]:
        cells = [(options(d[f]["command"]).get("seed", "0"), c) for f in files for c in d[f]["cells"]]
        def best(c: dict) -> str:  # colocated, or the static split ahead of it
            return split(c["best_static"]) if c["vs_colocated"][c["best_static"]] > 1 else "colocated"
        rows = [[c["family"], c["mode"], seed, best(c), f3(c["prorsa_vs_best"]), str(c["switches"]["prorsa"])]
                for seed, c in cells]
        figures = [c["prorsa_vs_best"] for _, c in cells]
        return table(["family", "mode", "seed", "best fixed", "prorsa / best fixed", "prorsa switches"], rows) + [
            "", f"Over the {len(cells)} cells: lowest prorsa / best fixed {min(figures):.3f}, "
                f"{sum(x >= 0.97 for x in figures)} at 0.97 or better."]
    return render


def held_out_table(*files: str) -> Callable[[dict], list[str]]:
    """benchmarks/model_error.py on the held-out workloads (shifting mixes, traces) and engine counts:
    prorsa (exact model, no prior) over the best fixed split and over colocated, with its switches."""
    def workload(c: dict) -> str:
        return c["family"].replace(":", " -> ") + (" (trace)" if c.get("trace") else "")

    def render(d: dict) -> list[str]:
        cells = [c for f in files for c in d[f]["cells"]]
        sync = {id(c): c["mode"] == "sync" for c in cells}

        def vs_colocated(c: dict) -> float:  # prorsa over colocated, from its ratio to the best
            return c["prorsa_vs_best"]["exact"] * (c["colocated"] / c["best_figure"] if sync[id(c)]
                                                   else c["best_figure"] / c["colocated"])
        rows = [[workload(c), c["mode"], str(c["seed"]), str(c["engines"]), str(c["steps"]),
                 split(c["best_fixed"]), f3(c["prorsa_vs_best"]["exact"]), f3(vs_colocated(c)),
                 str(c["switches"]["exact"])] for c in cells]
        low = min(cells, key=lambda c: c["prorsa_vs_best"]["exact"])
        return table(["workload", "mode", "seed", "engines", "steps", "best fixed", "prorsa / best",
                      "prorsa / colocated", "prorsa switches"], rows) + [
            "", f"Over the {len(cells)} cells, lowest prorsa / best fixed {low['prorsa_vs_best']['exact']:.3f} "
                f"({workload(low)} {low['mode']} seed {low['seed']}), "
                f"{sum(c['prorsa_vs_best']['exact'] >= 0.97 for c in cells)} of {len(cells)} at 0.97 or better; "
                f"lowest prorsa / colocated {min(map(vs_colocated, cells)):.3f}."]
    return render


DENSE_SEEDS = [f"paper-dense-seed{s}.json" for s in (7, 11, 13, 17, 19)]  # paper.py --models dense --seed S


class Table(NamedTuple):
    files: list[str]  # results files it reads, in benchmarks/results
    render: Callable[[dict], list[str]]  # {file name: parsed JSON} -> markdown lines


def serve_overhead_table(file: str) -> Callable[[dict], list[str]]:
    def render(d: dict) -> list[str]:
        doc = d[file]
        rows = [[door, ", ".join(f"{x:.2f} s" for x in doc["runs"][door]), f"{doc['median_s'][door]:.2f} s"]
                for door in ("run", "serve")]
        return table(["door", "makespans", "median"], rows) + [
            "", f"`{doc['pipeline']}` on {doc['engine']} engines, {doc['trajectories']} trajectories, "
                f"{doc['turns']} turns: the endpoint at {f3(doc['ratio'])} of `prorsa run`'s makespan."]
    return render


def t_serve_load(d: dict) -> list[str]:
    """prorsa serve under many concurrent sessions, and the oversized bodies sent among them."""
    doc = d["serve-load.json"]

    def q(key: str) -> str:
        return f"{doc[key]['p50']:.2f} / {doc[key]['p99']:.2f} / {doc[key]['max']:.2f} s"

    failures = ", ".join(f"{n} {kind}" for kind, n in doc["transport_errors"].items()) or "0"
    load = table(["sessions", "for", "requests", "requests/s", "5xx", "no answer (transport)", "p50 / p99 / max",
                  "first turns", "later turns"],
                 [[str(doc["sessions"]), f"{doc['seconds']:g} s", str(doc["requests"]), f"{doc['requests_per_s']:.1f}",
                   str(doc["server_errors"]), failures, q("latency_s"), q("latency_first_turn_s"),
                   q("latency_later_turns_s")]])
    bigs = table(["body", "sent with", "answer", "to the answer", "server RSS growth",
                  "other answers in the 2 s after"],
                 [[f"{b['mb']:g} MB", "its length" if b["length"] == "declared" else "no length (chunked)",
                   f"{b['status']} {b['code']}", f"{b['to_413_s']:.3f} s", f"{b['rss_growth_mb']:.1f} MB",
                   str(b["answered_meanwhile"])] for b in doc["big_bodies"]])
    return load + [""] + bigs + [
        "", f"`{doc['pipeline']}` on {doc['engine']} engines, {doc['turns']} turns of {doc['max_tokens']} tokens per "
            f"session, then the session ended with a reward; stopped by SIGINT: exit {doc['exit_code']}, "
            f"{doc['trajectories_saved']} conversations saved ({doc['turns_saved']} turns)."]


def t_tail_reserve(d: dict) -> list[str]:
    """Isolating the longest trajectories on reserved engines: the oracle's ceiling, and what a run could know."""
    doc = d["tail-reserve.json"]
    names = {"oracle-traj": "oracle, trajectories", "oracle-groups": "oracle, whole groups",
             "oracle-late": "oracle, after turn 1", "predicted": "predicted groups, after turn 1",
             "predicted-traj": "predicted trajectories, after turn 1"}
    rows = []
    for r in doc["rows"]:
        cells = [f"{r[v]['median']:.3f} ({min(r[v]['seeds']):.3f}-{max(r[v]['seeds']):.3f})" for v in names]
        seed0 = r["seed0_s"]
        hits = [f"{r[v]['hits']} of {r[v]['k']}" for v in ("predicted", "predicted-traj")]
        rows.append([r["label"], f"{r['bound_s']:.1f} s", f3(r["colocated"]), *cells,
                     f3(r["best_fixed_s"] / seed0["oracle-traj"]), f3(r["best_fixed_s"] / seed0["predicted-traj"]),
                     " / ".join(hits)])
    seeds = doc["seeds"]
    return table(["cell", "bound (seed 0)", "colocated", *names.values(),
                  "seed 0: oracle / best fixed", "seed 0: predicted trajectories / best fixed", "seed 0: picked right (groups / trajectories)"],
                 rows) + [
        "", f"Makespan over the lower bound, median over seeds {seeds[0]}-{seeds[-1]} (range in brackets), each "
            "variant at the best point of its grid for each seed, chosen in hindsight. `/ best fixed`: the better of "
            "colocated and every P:D of `tail.py` on seed 0 over the variant's makespan (> 1: faster than every fixed "
            "split). `picked right`: of the k groups or trajectories the run picked on seed 0, how many are among the "
            "k longest."]


TABLES: dict[str, Table] = {
    "paper": Table(["paper.json"], t_paper),
    "model-error": Table(["model-error.json"], model_error_table("model-error.json")),
    "model-error-steps3": Table(["model-error-steps3.json"], model_error_table("model-error-steps3.json")),
    "held-out-seeds": Table(["held-out-seeds.json", "held-out-seeds-2.json"],
                            model_error_table("held-out-seeds.json", "held-out-seeds-2.json")),
    "held-out-engines": Table(["held-out-engines-4.json"], model_error_table("held-out-engines-4.json")),
    "held-out-engines-16": Table(["held-out-engines-16.json"], model_error_table("held-out-engines-16.json")),
    "held-out-ep": Table(["held-out-ep.json", "held-out-ep64.json"], held_out_ep_table("held-out-ep.json", "held-out-ep64.json")),
    "held-out-dense": Table(DENSE_SEEDS, held_out_dense_table(*DENSE_SEEDS)),
    "model-error-ep1": Table(["model-error-ep1.json"], model_error_table("model-error-ep1.json")),
    "held-out-shift": Table(["held-out-shift.json"], held_out_table("held-out-shift.json")),
    "held-out-traces": Table(["held-out-traces.json"], held_out_table("held-out-traces.json")),
    "held-out-engines-32": Table(list(ENGINES_32), held_out_table(*ENGINES_32)),
    "groups": Table(["groups.json"], groups_table("groups.json")),
    "groups-seed1": Table(["groups-seed1.json"], groups_table("groups-seed1.json")),
    "groups-layouts": Table(["groups.json"], t_groups_layouts),
    "groups-prorsa": Table(["groups-prorsa.json"], t_groups_prorsa),
    "paper-rules": Table(["paper.json", "paper-ratio.json", "paper-sticky.json"], t_paper_rules),
    "paper-restart": Table(["paper.json", "paper-restart.json"], t_paper_restart),
    "role-restart": Table(["role-restart.json"], t_role_restart),
    "weight-sync": Table(["weight-sync.json"], t_weight_sync),
    "weight-sync-paths": Table(list(WEIGHT_SYNC_PATHS), t_weight_sync_paths),
    "rl-toy-sync": Table(list(RL_TOY_SYNC), t_rl_toy_sync),
    "priors": Table(["priors.json", "priors-steps3.json"], t_priors),
    "priors-drivers": Table(["priors-drivers.json"], priors_cells_table("priors-drivers.json")),
    "priors-drivers-steps3": Table(["priors-drivers-steps3.json"], priors_cells_table("priors-drivers-steps3.json")),
    "priors-phases": Table(["priors-phases.json"], priors_cells_table("priors-phases.json")),
    "priors-phases-jitter": Table(["priors-phases-jitter.json"], priors_cells_table("priors-phases-jitter.json")),
    "priors-seeds": Table(sorted({f for files in SEED_FILES.values() for f, _ in files}), t_priors_seeds),
    "drift": Table(["drift.json"], t_drift),
    "drift-mix": Table(["drift-mix.json"], t_drift_mix),
    "universal-split": Table(["universal-split.json"], t_universal_split),
    "tuned-once": Table(["paper.json", "priors.json"], t_tuned_once),
    "forecast-skill": Table(["forecast-skill.json"], t_forecast_skill),
    "tail": Table(["tail.json"], t_tail),
    "tail-live": Table(["tail-live.json"], t_tail_live),
    "tail-reserve": Table(["tail-reserve.json"], t_tail_reserve),
    "migrate": Table(["migrate.json"], t_migrate),
    "partial-rollout": Table(["partial-rollout.json"], t_partial_rollout),
    "partial-rollout-traces": Table(["partial-rollout-traces.json"], t_partial_rollout_traces),
    "async-updates": Table(["async-updates.json"], t_async_updates),
    "sim-cost": Table(["sim-cost.json"], t_sim_cost),
    "rl-toy-partial": Table(["rl-toy-partial.json"], t_rl_toy_partial),
    "overlap-split": Table(["overlap-split.json"], overlap_split_table("overlap-split.json")),
    "overlap-split-dense": Table(["overlap-split-dense.json"], overlap_split_table("overlap-split-dense.json")),
    "tail-live-migrate": Table(["tail-live-migrate.json"], t_tail_live_migrate),
    "ep-headline": Table(["drivers-ep.json", "drivers-ep-wide.json"], t_ep_headline),
    "drivers-ep": Table(["drivers-ep.json"], drivers_table("drivers-ep.json", "EP ranks")),
    "drivers-ep-wide": Table(["drivers-ep-wide.json"], drivers_table("drivers-ep-wide.json", "EP ranks")),
    "drivers-parallelism": Table(["drivers-parallelism.json"],
                                 drivers_table("drivers-parallelism.json", "layout")),
    "drivers-turns": Table(["drivers-turns.json"], drivers_table("drivers-turns.json", "max turns")),
    "drivers-tokens": Table(["drivers-tokens.json"], drivers_table("drivers-tokens.json", "token scale")),
    "drivers-prefix-cache": Table(["drivers-prefix-cache.json"],
                                  drivers_table("drivers-prefix-cache.json", "prefix cache", hits=True)),
    "drivers-weight-update": Table(["drivers-weight-update.json"],
                                   drivers_table("drivers-weight-update.json", "weight update (s)")),
    "drivers-weight-update-clock": Table(["drivers-weight-update-clock.json"],
                                         drivers_table("drivers-weight-update-clock.json", "update every (s)")),
    "phases": Table(PHASES, t_phases),
    "moe-step": Table(["policies_live-moe-step.json"], t_moe_step),
    "live-grid": Table(["policies_live.json"], grid_table("policies_live.json")),
    "live-vllm-cell": Table(["policies_live-vllm-quickstart.json"], t_vllm_cell),
    "live-time-scale": Table([*TIME_SCALE_FILES, "leg-overhead.json"], t_live_time_scale),
    "leg-overhead": Table(["leg-overhead.json", "policies_live-moe-repeats.json"], t_leg_overhead),
    "live-grid-ratio": Table(["policies_live-ratio.json"], grid_table("policies_live-ratio.json")),
    "live-repeats": Table(["policies_live-moe-repeats.json"], grid_table("policies_live-moe-repeats.json")),
    "live-repeats-ratio": Table(
        ["policies_live_repeats.json", "policies_live-math-tir-moe-async.json", "policies_live-ratio.json"],
        repeats_table(["policies_live_repeats.json", "policies_live-math-tir-moe-async.json"],
                      "policies_live-ratio.json", ranges=True)),
    "live-pairs": Table(PAIRS, t_pairs),
    "live-real-time": Table(REAL_TIME, t_real_time),
    "fidelity": Table(["fidelity.json"], t_fidelity),
    "fidelity-vllm": Table(["fidelity-vllm.json"], t_fidelity_vllm),
    "chaos": Table(["chaos.json", "chaos-driver-kill.json", "chaos-soak.json", "chaos-vllm.json", "chaos-vllm-soak.json",
                    "chaos-partial-vllm.json", "chaos-serve-vllm.json"], t_chaos),
    "api-overhead": Table(["api-overhead.json"], t_api_overhead),
    "mutation": Table(["mutation-before.json", "mutation.json"],
                      mutation_table("mutation-before.json", "mutation.json")),
    "mutation-rehearsal": Table(["mutation-rehearsal-before.json", "mutation-rehearsal.json"],
                                mutation_table("mutation-rehearsal-before.json", "mutation-rehearsal.json")),
    "allocator-scale": Table(["allocator-scale.json"], t_allocator_scale),
    "control-plane-processes": Table(["control-plane-processes.json"], t_control_plane_processes),
    "scale": Table(["scale.json"], t_scale),
    "cells-sim": Table(["cells-sim.json", "cells-sim-4096.json"], t_cells_sim),
    "cells-live": Table(["cells-live.json"], t_cells_live),
    "cells-processes": Table(["cells-processes.json"], t_cells_processes),
    "serve-overhead": Table(["serve-overhead.json"], serve_overhead_table("serve-overhead.json")),
    "serve-overhead-vllm": Table(["serve-overhead-vllm.json"], serve_overhead_table("serve-overhead-vllm.json")),
    "serve-load": Table(["serve-load.json"], t_serve_load),
}

# tables_prose.py is loaded by path: the tests load this file by path too, with benchmarks/ off sys.path
_spec = importlib.util.spec_from_file_location("tables_prose", Path(__file__).with_name("tables_prose.py"))
_prose = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_prose)
TABLES |= {name: Table(files, render) for name, (files, render) in _prose.PROSE.items()}


# ----------------------------------------------------------------------------- sections of the docs

def provenance(file: str, doc: dict) -> str:
    """The command that wrote a results file, and what else it stored about the run."""
    extra = [f"`{SHOWN_DIR}/{file}`"]
    extra += [f"{k} {doc[k]}" for k in ("date", "commit", "machine") if doc.get(k)]
    if "elapsed_s" in doc and "cells" in doc:
        runs = sum(len(rs) for c in doc["cells"] for rs in c.get("runs", {}).values())
        extra.append(f"{runs} runs, {doc['elapsed_s'] / 60:.0f} min")
    return f"`{doc.get('command', '(no command stored)').strip()}` ({'; '.join(extra)})"


def render(name: str, results: Path) -> str:
    """The text of section NAME, from the results files in RESULTS. Raises ValueError if one is unusable."""
    spec = TABLES[name]
    docs = {}
    for f in spec.files:
        try:
            docs[f] = json.loads((results / f).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{SHOWN_DIR}/{f}: {e}") from None
    try:
        lines = spec.render(docs)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:
        raise ValueError(f"{', '.join(spec.files)}: not what the table reads ({type(e).__name__}: {e})") from None
    sources = [provenance(f, docs[f]) for f in spec.files]
    head = [f"Command: {sources[0]}."] if len(sources) == 1 else ["Commands:", *[f"- {s}" for s in sources]]
    return "\n".join([*head, "", *lines]) + "\n"


def rewrite(text: str, results: Path) -> tuple[str, list[str], list[str]]:
    """TEXT with every section regenerated; the sections that differed; the ones that could not be made."""
    stale: list[str] = []
    errors: list[str] = []

    def one(m: re.Match) -> str:
        name = m["name"]
        if name not in TABLES:
            errors.append(f"{name}: no such table (known: {', '.join(TABLES)})")
            return m[0]
        try:
            body = render(name, results)
        except ValueError as e:
            errors.append(f"{name}: {e}")
            return m[0]
        if body != m["body"]:
            stale.append(f"{name}: differs from {', '.join(f'{SHOWN_DIR}/{f}' for f in TABLES[name].files)}")
        return f"<!-- table:{name} -->\n{body}<!-- /table:{name} -->"

    return SECTION.sub(one, text), stale, errors


def shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def check(results: Path = RESULTS, docs: tuple[Path, ...] = DOCS, write: bool = False) -> list[str]:
    """Problems, one line each, naming the document and the table: a section that differs from its
    results, a section whose results cannot be read, an unknown table name, a table placed in none of
    DOCS. With WRITE the sections that differ are rewritten, and only the other problems are returned."""
    problems, placed = [], set()
    for path in docs:
        text = path.read_text()
        placed |= {m["name"] for m in SECTION.finditer(text)}
        new, stale, errors = rewrite(text, results)
        if write and new != text:
            path.write_text(new)
        problems += [f"{shown(path)}: {p}" for p in ([] if write else stale) + errors]
    problems += [f"{name}: placed in none of {', '.join(map(shown, docs))}" for name in TABLES if name not in placed]
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a section differs")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results directory")
    ap.add_argument("docs", nargs="*", type=Path, help=f"markdown files (default: {', '.join(map(shown, DOCS))})")
    args = ap.parse_args(argv)
    docs = tuple(args.docs) or DOCS
    if not args.check:
        stale = [p.split(": differs from ")[0] for p in check(args.results, docs) if ": differs from " in p]
        print("\n".join(f"rewrote {s}" for s in stale) or "every table already matches its results")
    problems = check(args.results, docs, write=not args.check)
    for p in problems:
        print(p, file=sys.stderr)
    if args.check and not problems:
        print("every table matches its results")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
