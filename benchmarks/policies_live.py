"""Role policies head to head, live: every policy on one workload, ratios against colocated.

Emulated engines on a real LocalCluster (run_live, the path `prorsa run` takes), in this process.

For each cell, task family (swe, search, math-tir, terminal) x model (dense qwen3-8b, ep 1; MoE
qwen3-30b-a3b, ep 4: an engine is a DP-attention group of 4 ranks, given 4x the slots and 4x the
trajectories, the same load per rank) x mode, it runs every policy on the same seeded workload:
  prorsa, colocated, static:P:D for every P + D = engines (P, D >= 1), reactive
  sync    one step of B x G trajectories; the figure is the makespan
          (ratio = colocated makespan / policy makespan, so > 1 is better)
  async   a fixed number of trajectories with N kept in flight; the figure is trajectories/s
          (ratio = policy throughput / colocated throughput)
It marks the hindsight-best static split (*), and gives prorsa's ratio to the better of colocated
and that split (goal >= 0.97), prorsa's role switches, its forecast MAPE (summary.json
forecast_mape, per metric) and a prefix-hit proxy, cached / (cached + prefill) tokens.

Engines run the cost model's time scaled by --time-scale, and tool latencies by the same factor,
so tools and engines share one clock (--family-scale overrides it per family: terminal's
minutes-long tools run at 0.01 by default). The control interval is given in body (cost-model)
seconds and scaled the same way, with a floor in wall seconds (--min-control-wall). One discarded
warm-up run goes first (imports, first cluster), and each run records the machine's load: on a
small shared machine other work slows time-scaled engines and skews a ratio.

Every run must complete all its trajectories: a run that loses or fails one, raises, or exceeds
--run-timeout is flagged in red in the table and listed at the end, as is a cell whose runs took
different numbers of turns (the workload is seeded), and the script exits 1. Figures are medians over --repeats (the policy order rotates per repeat).
Each run writes to a temporary directory and its summary.json is read back; all results go to
--out as JSON.

`--pipeline FILE` runs that one pipeline as it stands instead of the grid (its engines, workload
and time scale), every policy in turn: the controller's acceptance workload is
pipelines/moe-step.yaml, a synchronous step whose demand moves from prefill to decode to a tail.

    .venv/bin/python benchmarks/policies_live.py --pipeline pipelines/moe-step.yaml --repeats 3 --warmup 0
    .venv/bin/python benchmarks/policies_live.py [--quick] [--families swe,search,math-tir,terminal]
        [--models qwen3-8b,qwen3-30b-a3b] [--modes sync,async] [--engines 4] [--time-scale 0.05]
        [--family-scale terminal=0.01] [--control-interval 1.0] [--repeats 1]
        [--cells swe/moe/sync,search/dense/async] [--out benchmarks/results/policies_live.json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAMILIES = ("swe", "search", "math-tir", "terminal")
MODELS = {"qwen3-8b": {"ep": 1, "kind": "dense"}, "qwen3-30b-a3b": {"ep": 4, "kind": "MoE"}}
ALIASES = {"dense": "qwen3-8b", "moe": "qwen3-30b-a3b"}
MODES = ("sync", "async")
GOAL = 0.97

# Per family, the workload of one cell, sized for 4 engines x 32 slots: turn caps as in
# pipelines/<family>.yaml, so a run stays a few (wall) seconds at time scale 0.05.
SYNC = {  # one step of prompts x group_size
    "swe": {"prompts": 8, "group_size": 4, "max_turns": 16},
    "search": {"prompts": 32, "group_size": 4},
    "math-tir": {"prompts": 8, "group_size": 8, "max_turns": 8},
    "terminal": {"prompts": 8, "group_size": 4, "max_turns": 12},
}
ASYNC = {  # concurrency kept in flight, trajectories in all
    "swe": {"concurrency": 32, "trajectories": 64, "max_turns": 16},
    "search": {"concurrency": 64, "trajectories": 128},
    "math-tir": {"concurrency": 64, "trajectories": 128, "max_turns": 8},
    "terminal": {"concurrency": 32, "trajectories": 64, "max_turns": 12},
}


def policies(engines: int) -> list[str]:
    statics = [f"static:{p}:{engines - p}" for p in range(1, engines)]
    return ["colocated", *statics, "reactive", "prorsa"]


def family_scales(spec: str) -> dict[str, float]:
    """"terminal=0.01,swe=0.05" -> {family: time scale}."""
    out = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        fam, _, val = item.partition("=")
        if fam not in FAMILIES or not val:
            raise ValueError(f"bad --family-scale item {item!r}; expected FAMILY=SCALE, FAMILY one of {FAMILIES}")
        out[fam] = float(val)
    return out


def time_scale(args, family: str) -> float:
    return family_scales(args.family_scale).get(family, args.time_scale)


def control_interval_wall(args, family: str) -> float:
    """The policy interval in wall seconds: --control-interval body seconds, at least the floor."""
    scale = time_scale(args, family)
    return max(args.control_interval * (scale if scale > 0 else 1.0), args.min_control_wall)


def given_pipeline(path: str, routing: dict, overrides: dict | None = None):
    """--pipeline FILE: that pipeline as the one cell, each policy put in its place."""
    from prorsa.config.load import load_pipeline

    cfg = load_pipeline(path, {"runtime.dashboard_address": None} | {f"runtime.{k}": v for k, v in routing.items()}
                        | (overrides or {}))
    cell = (cfg.workload.family or "trace", cfg.engines.model, cfg.workload.mode)
    return cfg, cell, lambda policy: cfg.model_copy(update={"policy": policy})


def pipeline(args, family: str, model: str, mode: str, policy: str, routing: dict):
    from prorsa.config.pipeline import PipelineConfig

    scale = time_scale(args, family)
    ranks = MODELS[model]["ep"]
    sizes = dict((SYNC if mode == "sync" else ASYNC)[family])
    for key in ("prompts", "concurrency", "trajectories"):  # the same load per rank
        if key in sizes:
            sizes[key] *= ranks
    workload = {"family": family, "mode": mode, "tool_time_scale": scale,  # one clock for tools and engines
                **sizes}
    if mode == "sync":
        workload["steps"] = 1
    return PipelineConfig.model_validate({
        "name": f"policies-{family}-{model}-{mode}", "seed": args.seed, "policy": policy,
        "engines": {"backend": "emulated", "count": args.engines, "slots": args.slots * ranks, "gpu": args.gpu,
                    "model": model, "tp": 1, "ep": ranks, "time_scale": scale},
        "workload": workload,
        "runtime": {"control_interval_s": control_interval_wall(args, family),
                    "metrics_interval_s": args.metrics_interval, "dashboard_address": None, **routing},
    })


class _Warnings(logging.Handler):
    """Counts WARNING+ records during a run (prorsa's own loggers): a failed switch, a retry."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()}"[:300])


async def _run(cfg, run_dir: Path, timeout_s: float) -> dict:
    from rich.console import Console

    from prorsa.live.run import run_live
    from prorsa.rollout.context import resolve

    from prorsa.sim.run import lend

    return await asyncio.wait_for(run_live(resolve(cfg), run_dir, Console(file=io.StringIO()), lend=lend), timeout_s)


def one_run(cfg, timeout_s: float) -> dict:
    """One run_live in a temporary run directory; summary.json read back, problems recorded."""
    load_before = os.getloadavg()[0]  # the machine's load: other work skews time-scaled engines
    handler = _Warnings()
    logging.getLogger("prorsa").addHandler(handler)
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="prorsa-policies-") as d:
            asyncio.run(_run(cfg, Path(d), timeout_s))
            summary = json.loads((Path(d) / "summary.json").read_text())
        error = None
    except (asyncio.TimeoutError, TimeoutError):
        summary, error = {}, f"timed out after {timeout_s:.0f}s wall (stalled?)"
    except Exception as e:  # noqa: BLE001 - a policy that crashes the run is a result
        summary, error = {}, f"{type(e).__name__}: {e}"[:500]
    finally:
        logging.getLogger("prorsa").removeHandler(handler)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()[0]
    problems = [error] if error else []
    if summary:
        exp, done, failed = (summary.get(k) for k in
                             ("trajectories_expected", "trajectories_completed", "trajectories_failed"))
        if exp is None or done != exp or failed:
            problems.append(f"completed {done}/{exp} trajectories, {failed} failed")
    return {"summary": summary, "wall_s": wall, "problems": problems, "warnings": handler.records,
            "load1": [round(load_before, 2), round(load_after, 2)]}


def simulated(cfg) -> dict:
    """The simulator's figure for the same cell and policy: the run in virtual time, on the cost
    model's own clock. Emulated engines run live at `time_scale` wall seconds a cost-model second,
    and tools and the control interval with them, so all three are put back on that clock (vLLM
    engines run in real time: nothing to put back)."""
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    e = cfg.engines
    scale = e.time_scale if e.backend == "emulated" and e.time_scale > 0 else 1.0
    sim_cfg = cfg.model_copy(update={
        "engines": e.model_copy(update={"time_scale": 1.0}),
        "workload": cfg.workload.model_copy(update={"tool_time_scale": cfg.workload.tool_time_scale / scale}),
        "runtime": cfg.runtime.model_copy(update={"control_interval_s": cfg.runtime.control_interval_s / scale}),
    })
    s = simulate(resolve(sim_cfg)).summary
    return {k: s.get(k) for k in ("makespan_s", "trajectories_per_s", "role_switches", "sim_wall_s")}


def sim_result(sims: dict[str, dict], mode: str) -> dict:
    """The simulator's ratios vs colocated per policy and prorsa's to the better of colocated and
    the best static split, as cell_result gives them for the live runs."""
    colo = figure(sims["colocated"], mode)
    ratios = {p: ratio(figure(s, mode), colo, mode) for p, s in sims.items()}
    best, _, vs_best = versus_best(ratios)
    return {"per_policy": {p: {**sims[p], "ratio": ratios[p]} for p in sims}, "best_static": best,
            "prorsa_vs_best": vs_best}


def versus_best(ratios: dict[str, float | None]) -> tuple[str | None, float, float | None]:
    """From each policy's ratio to colocated: the best static split, the better of it and colocated
    (as a ratio), and prorsa's ratio to that."""
    statics = [p for p in ratios if p.startswith("static:") and ratios[p] is not None]
    best = max(statics, key=lambda p: ratios[p], default=None)
    baseline = max([1.0] + ([ratios[best]] if best else []))
    pr = ratios.get("prorsa")
    return best, baseline, (pr / baseline if pr is not None else None)


def figure(summary: dict, mode: str) -> float | None:
    """The cell's headline figure for one run: makespan (sync) or trajectories/s (async)."""
    key = "makespan_s" if mode == "sync" else "trajectories_per_s"
    return summary.get(key)


def ratio(policy_fig: float | None, colocated_fig: float | None, mode: str) -> float | None:
    """> 1 is better than colocated, either mode."""
    if not policy_fig or not colocated_fig:
        return None
    return colocated_fig / policy_fig if mode == "sync" else policy_fig / colocated_fig


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _mape(runs: list[dict]) -> dict[str, float] | None:
    per = {}
    for r in runs:
        for k, v in (r["summary"].get("forecast_mape") or {}).items():
            per.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in per.items()} or None


def _prefix_hit(summary: dict) -> float | None:
    c, p = summary.get("cached_tokens"), summary.get("prefill_tokens")
    return c / (c + p) if c is not None and p is not None and c + p > 0 else None


def cell_result(runs: dict[str, list[dict]], mode: str) -> dict:
    """Medians per policy, ratios vs colocated, the best static and prorsa's ratio to the best."""
    per = {}
    for pol, rs in runs.items():
        ok = [r for r in rs if r["summary"] and not r["problems"]]
        per[pol] = {
            "figure": _median([figure(r["summary"], mode) for r in rs if r["summary"]]),
            "makespan_s": _median([r["summary"].get("makespan_s") for r in rs if r["summary"]]),
            "trajectories_per_s": _median([r["summary"].get("trajectories_per_s") for r in rs if r["summary"]]),
            "role_switches": _median([r["summary"].get("role_switches") for r in rs if r["summary"]]),
            "prefix_hit": _median([_prefix_hit(r["summary"]) for r in rs if r["summary"]]),
            "forecast_mape": _mape(rs),
            "runs_ok": len(ok), "runs": len(rs),
            "problems": [p for r in rs for p in r["problems"]],
            "warnings": sum(len(r["warnings"]) for r in rs),
        }
    colo = per["colocated"]["figure"]
    for p in per.values():
        p["ratio"] = ratio(p["figure"], colo, mode)
    best, baseline, vs_best = versus_best({p: v["ratio"] for p, v in per.items()})
    return {
        "per_policy": per,
        "best_static": best,
        "baseline": "colocated" if baseline == 1.0 else best,
        "prorsa_vs_best": vs_best,
        "goal_met": vs_best is not None and vs_best >= GOAL,
    }


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _mape_str(m: dict[str, float] | None) -> str:
    if not m:
        return "-"
    short = {"prefill_tps": "P", "decode_seqs": "D", "decode_tps": "Dtps"}
    return " ".join(f"{short.get(k, k)} {v:.2f}" for k, v in sorted(m.items()))


def _load_str(cell: dict) -> str:
    """The highest 1-minute load average seen around the cell's runs; yellow above the core count."""
    load = max((x for rs in cell["runs"].values() for r in rs for x in r["load1"]), default=None)
    if load is None:
        return "-"
    return f"[yellow]{load:.1f}[/]" if load > (os.cpu_count() or 1) else f"{load:.1f}"


def table(cells: list[dict], engines: int, args):
    from rich.table import Table

    statics = [p for p in policies(engines) if p.startswith("static:")]
    t = Table(title=f"policies live: ratio vs colocated (> 1 better), {engines} emulated {args.gpu} engines x "
                    f"{args.slots} slots, time scale {args.time_scale}"
                    + (f" ({args.family_scale})" if args.family_scale else "") + f", median of {args.repeats}",
              caption="sync: colocated makespan / policy makespan; async: policy traj/s / colocated traj/s. "
                      "* hindsight-best static. prorsa/best: prorsa vs max(colocated, best static), goal >= "
                      f"{GOAL}. MAPE: forecast error per metric (P prefill tokens/s, D decoding sequences). hit: cached/(cached+prefill). "
                      "load: highest 1-min load average around the cell's runs (yellow: above the core count, "
                      "so other work may have skewed the ratios). "
                      "Red: a run lost trajectories, failed or stalled.")
    for col in ("family", "model", "mode", "colocated", *[s.removeprefix("static:") for s in statics],
                "reactive", "prorsa", "prorsa/best", "switches", "MAPE", "hit", "load"):
        t.add_column(col, justify="left" if col in ("family", "model", "mode", "MAPE") else "right")
    for c in cells:
        per = c["result"]["per_policy"]

        def cellv(pol: str) -> str:
            p = per.get(pol)
            if p is None:  # not run (--policies)
                return "-"
            s = _fmt(p["ratio"]) + ("*" if pol == c["result"]["best_static"] else "")
            return f"[bold red]{s} !{len(p['problems'])}[/]" if p["problems"] else s

        colo = per["colocated"]
        colo_fig = colo["makespan_s"] if c["mode"] == "sync" else colo["trajectories_per_s"]
        colo_s = "-" if colo_fig is None else f"{colo_fig:.2f}" + ("s" if c["mode"] == "sync" else "/s")
        if colo["problems"]:
            colo_s = f"[bold red]{colo_s} !{len(colo['problems'])}[/]"
        pvb = c["result"]["prorsa_vs_best"]
        pvb_s = _fmt(pvb)
        if pvb is not None:
            pvb_s = f"[green]{pvb_s}[/]" if pvb >= GOAL else f"[yellow]{pvb_s}[/]"
        pr = per.get("prorsa") or {"role_switches": None, "forecast_mape": None, "prefix_hit": None}
        t.add_row(c["family"], c["model"], c["mode"], colo_s, *[cellv(s) for s in statics], cellv("reactive"),
                  cellv("prorsa"), pvb_s, _fmt(pr["role_switches"], ".0f"), _mape_str(pr["forecast_mape"]),
                  _fmt(pr["prefix_hit"]), _load_str(c))
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--models", default=",".join(MODELS), help=", ".join(
        f"{m} ({v['kind']}, ep {v['ep']})" for m, v in MODELS.items()) + "; aliases dense, moe")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--time-scale", type=float, default=0.05, help="wall s per cost-model s (tools too)")
    ap.add_argument("--family-scale", default="terminal=0.01",
                    help="per-family time scale overrides, FAMILY=SCALE,... (terminal's minutes-long tools "
                         "would make one run over a minute at 0.05)")
    ap.add_argument("--control-interval", type=float, default=2.0,
                    help="policy interval in cost-model seconds (wall: x time scale)")
    ap.add_argument("--min-control-wall", type=float, default=0.025,
                    help="floor on the policy interval in wall seconds (the controller's own CPU)")
    ap.add_argument("--metrics-interval", type=float, default=0.5, help="engine sampling, wall seconds")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-timeout", type=float, default=180.0, help="wall seconds before a run counts as stalled")
    ap.add_argument("--policies", default=None, help="comma list to run a subset (colocated is always run)")
    ap.add_argument("--warmup", type=int, default=1, help="discarded runs first (imports, first cluster)")
    ap.add_argument("--quick", action="store_true", help="one family, one model, sync only")
    ap.add_argument("--cells", help="FAMILY/MODEL/MODE,... these cells instead of the grid of --families, "
                                    "--models and --modes (to re-run a few with more repeats)")
    ap.add_argument("--pipeline", help="one cell: this pipeline file as it is (engines, workload, time scale), "
                                       "every policy in turn; the sizing options above do not apply")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="with --pipeline: override a field of it, as `prorsa run FILE KEY=VALUE` does (repeatable)")
    ap.add_argument("--sticky-overload", metavar="X|cost|none",
                    help="runtime.sticky_overload of every run (default: the pipeline's, cost)")
    ap.add_argument("--sim", action="store_true",
                    help="also simulate every cell and policy (virtual time, the same seeded workload) and "
                         "record the simulator's ratios beside the live ones")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/policies_live.json"))
    args = ap.parse_args()
    routing = {}
    if args.sticky_overload is not None:
        from prorsa.config.pipeline import sticky_overload_from

        try:
            routing = {"sticky_overload": sticky_overload_from(args.sticky_overload)}
        except ValueError as e:
            ap.error(f"--sticky-overload: {e}")

    import dask

    # distributed configures its loggers on import: quiet them first (as `prorsa run` does)
    dask.config.set({"logging": {"distributed": "error", "tornado": "error", "bokeh": "error"}})
    logging.basicConfig(level=logging.ERROR, format="%(name)s %(levelname)s %(message)s")
    logging.getLogger("prorsa").setLevel(logging.WARNING)

    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 200)  # a log file keeps whole rows
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    models = [ALIASES.get(m.strip(), m.strip()) for m in args.models.split(",") if m.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.quick:
        families, models, modes = families[:1], models[:1], ["sync"]
    cells_spec = [(f, m, mo) for f in families for m in models for mo in modes]
    if args.cells:
        try:
            cells_spec = [(f, ALIASES.get(m, m), mo) for f, m, mo in
                          (c.strip().split("/") for c in args.cells.split(",") if c.strip())]
        except ValueError:
            ap.error(f"--cells: each cell is FAMILY/MODEL/MODE, got {args.cells!r}")
        families, models, modes = ([c[k] for c in cells_spec] for k in range(3))
    for name, got, known in (("family", families, FAMILIES), ("model", models, MODELS), ("mode", modes, MODES)):
        bad = [g for g in got if g not in known]
        if bad:
            ap.error(f"unknown {name} {bad}; known: {', '.join(known)}")
    try:
        family_scales(args.family_scale)
    except ValueError as e:
        ap.error(str(e))
    make = lambda family, model, mode, policy: pipeline(args, family, model, mode, policy, routing)  # noqa: E731
    if args.pipeline:
        from prorsa.config.load import ConfigError, parse_overrides

        try:
            given, cell, with_policy = given_pipeline(args.pipeline, routing, parse_overrides(args.set))
        except ConfigError as e:
            ap.error(str(e))
        make = lambda family, model, mode, policy: with_policy(policy)  # noqa: E731
        cells_spec, args.engines, args.time_scale = [cell], given.engines.count, given.engines.time_scale
        args.slots, args.gpu, args.family_scale = given.engines.slots, given.engines.gpu, ""
    if args.engines < 2:
        ap.error("--engines must be >= 2 (a static split needs a prefill and a decode engine)")
    pols = policies(args.engines)
    if args.policies:
        want = set(args.policies.split(",")) | {"colocated"}
        pols = [p for p in pols if p in want]
    command = " ".join([".venv/bin/python", "benchmarks/policies_live.py", *sys.argv[1:]])

    total = len(cells_spec) * len(pols) * args.repeats
    console.print(f"{len(cells_spec)} cells x {len(pols)} policies x {args.repeats} repeat(s) = {total} runs")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cells: list[dict] = []
    violations: list[str] = []
    for w in range(args.warmup):
        r = one_run(make("search", models[0], "sync", "colocated"), args.run_timeout)
        console.print(f"warm-up {w}: {r['wall_s']:.1f}s wall" + (f" ({'; '.join(r['problems'])})" if r["problems"]
                                                                else ""), highlight=False)
    n, t_start = 0, time.perf_counter()
    cores = os.cpu_count() or 1
    for family, model, mode in cells_spec:
        runs: dict[str, list[dict]] = {p: [] for p in pols}
        for rep in range(args.repeats):
            shift = rep % len(pols)  # rotate the order so no policy always runs first
            for pol in pols[shift:] + pols[:shift]:
                n += 1
                r = one_run(make(family, model, mode, pol), args.run_timeout)
                r["repeat"] = rep
                runs[pol].append(r)
                s = r["summary"]
                fig = (f"makespan {s['makespan_s']:.2f}s" if mode == "sync"
                       else f"{s['trajectories_per_s']:.2f} traj/s") if s else "no summary"
                line = (f"[{n}/{total}] {family} {model} {mode} {pol:<12} rep {rep}: {fig}, "
                        f"{s.get('trajectories_completed', '?')}/{s.get('trajectories_expected', '?')} traj, "
                        f"{s.get('role_switches', '?')} switches, {s.get('turns', '?')} turns "
                        f"({r['wall_s']:.1f}s wall)")
                if r["warnings"]:
                    line += f", {len(r['warnings'])} warning(s)"
                if max(r["load1"]) > cores:
                    line += f", load {max(r['load1']):.1f} on {cores} cores"
                if r["problems"]:
                    msg = f"{family} {model} {mode} {pol} rep {rep}: " + "; ".join(r["problems"])
                    violations.append(msg)
                    console.print(f"[bold red]{line}\n  VIOLATION: {'; '.join(r['problems'])}[/]", highlight=False)
                else:
                    console.print(line, highlight=False, markup=False)
        # the workload is seeded, so every complete run of a cell takes the same number of turns
        turns = {f"{p} rep {r['repeat']}": r["summary"]["turns"] for p, rs in runs.items() for r in rs
                 if r["summary"] and not r["problems"]}
        if len(set(turns.values())) > 1:
            msg = f"{family} {model} {mode}: turn counts differ between runs of one workload: {turns}"
            violations.append(msg)
            console.print(f"[bold red]VIOLATION: {msg}[/]", highlight=False)
        retried = {f"{p} rep {r['repeat']}": r["summary"].get("turns_retried") for p, rs in runs.items()
                   for r in rs if r["summary"].get("turns_retried")}
        if retried:
            console.print(f"[yellow]{family} {model} {mode}: turns retried (engine or worker failures): "
                          f"{retried}[/]", highlight=False)
        cfg = make(family, model, mode, "colocated")
        sim = None
        if args.sim:
            sim = sim_result({p: simulated(make(family, model, mode, p)) for p in pols}, mode)
            console.print(f"{family} {model} {mode}: simulated prorsa / best {_fmt(sim['prorsa_vs_best'], '.3f')}"
                          f" (best static {sim['best_static']})", highlight=False, markup=False)
        cells.append({"family": family, "model": model, "ep": cfg.engines.ep, "mode": mode,
                      "time_scale": cfg.engines.time_scale,
                      "control_interval_wall_s": cfg.runtime.control_interval_s,
                      "workload": cfg.workload.model_dump(mode="json"),
                      "result": cell_result(runs, mode), "sim": sim, "runs": runs})
        _write(out, args, command, cells, violations, time.perf_counter() - t_start)

    console.print(table(cells, args.engines, args))
    elapsed = time.perf_counter() - t_start
    walls = [r["wall_s"] for c in cells for rs in c["runs"].values() for r in rs]
    console.print(f"{n} runs in {elapsed:.0f}s (median {statistics.median(walls):.1f}s per run, including "
                  f"cluster start); results: {out}")
    if violations:
        console.print(f"[bold red]VIOLATIONS ({len(violations)}): every run must complete all its "
                      "trajectories[/]")
        for v in violations:
            console.print(f"[red]  {v}[/]", highlight=False)
    console.print("command: " + command, highlight=False)
    if violations:
        sys.exit(1)


def _write(out: Path, args, command: str, cells: list[dict], violations: list[str], elapsed: float) -> None:
    # the output path relative to the repository: results are committed and quoted
    shown = {**vars(args), "out": os.path.relpath(args.out, REPO)}
    doc = {"command": command, "args": shown, "elapsed_s": round(elapsed, 1), "goal": GOAL,
           "violations": violations, "cells": cells}
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
