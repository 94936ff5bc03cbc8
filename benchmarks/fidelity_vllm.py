"""The simulator against live vLLM CPU engines: a pipeline (the quickstart by default) run live with
two seeds, and simulated with the same workloads and policy.

1. Each seed live `--repeats` times (`prorsa run`), or `--runs DIR...` to reuse run directories
   (each run's seed is read from its pipeline.json). A shared machine makes one live run of a seed
   differ from the next by up to 20%, so each seed's figure is the median of its runs.
2. Simulated with the profile `prorsa calibrate` fitted to one engine alone (`engines.gpu`).
3. That profile corrected to the first seed's runs, their turns pooled (prorsa/costmodel/live_fit.py:
   the engines' share of their calibrated speed, the time per leg outside the engines, the KV
   pull's fixed cost), simulating again after each correction until it settles.
4. The second seed, which the fit never saw, simulated with the corrected profile: the figure that
   says whether the simulator predicts a live run. Goal: within 20% of its median.

    .venv/bin/python benchmarks/fidelity_vllm.py [--pipeline pipelines/quickstart.yaml]
        [--seeds 0,1] [--repeats 3] [--runs RUN...] [--write-profile configs/hardware/cpu-live.yaml]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def live_run(pipeline: Path, seed: int, out: Path) -> Path:
    # the split its stored results were measured with (the quickstart's own policy is now prorsa)
    raw = yaml.safe_load(pipeline.read_text()) | {"seed": seed, "policy": "static:2:1"}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{pipeline.stem}-seed{seed}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    before = set(out.glob("*/summary.json"))
    print(f"live: prorsa run {pipeline} with seed {seed} ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(path), f"output_dir={out}"], check=True,
                   cwd=ROOT, stdout=subprocess.DEVNULL)
    (summary,) = set(out.glob("*/summary.json")) - before
    return summary.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipeline", type=Path, default=ROOT / "pipelines/quickstart.yaml")
    ap.add_argument("--seeds", default="0,1", help="fit on the first, check on the second")
    ap.add_argument("--repeats", type=int, default=3, help="live runs of each seed")
    ap.add_argument("--runs", nargs="+", type=Path, metavar="RUN",
                    help="existing live run directories of the pipeline, with both seeds")
    ap.add_argument("--write-profile", type=Path, help="keep the corrected hardware profile here")
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/fidelity-vllm.json")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from prorsa.config.load import load_pipeline
    from prorsa.calibration.from_runs import describe, fit_to_run, load_live_run, simulate_with

    base_cfg = load_pipeline(args.pipeline)
    base = base_cfg.engines.gpu
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dirs = args.runs or [live_run(args.pipeline, s, tmp / f"r{r}") for r in range(args.repeats) for s in seeds]
        by_seed: dict[int, list] = {s: [] for s in seeds}
        for d in dirs:
            cfg, summary, rows = load_live_run(Path(d))
            if cfg.seed in by_seed:
                by_seed[cfg.seed].append((summary["makespan_s"], rows))
        if missing := [s for s in seeds if not by_seed[s]]:
            sys.exit(f"error: no run with seed {missing[0]} among --runs")
        live = {s: statistics.median(m for m, _ in by_seed[s]) for s in seeds}
        cfgs = [base_cfg.model_copy(update={"seed": s}) for s in seeds]
        before = [simulate_with(c, base, tmp / f"base-{i}")[0] for i, c in enumerate(cfgs)]
        header = (f"{base} corrected to {len(by_seed[seeds[0]])} {args.pipeline.stem} run(s) with seed {seeds[0]} "
                  f"(median makespan {live[seeds[0]]:.1f} s) by benchmarks/fidelity_vllm.py, {time.strftime('%F')}")
        pooled = [row for _, rows in by_seed[seeds[0]] for row in rows]
        fits = fit_to_run(cfgs[0], pooled, tmp, header)
        profile = tmp / f"{Path(base).stem}-live.yaml"
        after = [simulate_with(c, str(profile), tmp / f"fitted-{i}")[0] for i, c in enumerate(cfgs)]
        if args.write_profile:
            args.write_profile.write_text(profile.read_text())
    history = describe(fits)
    gpu = fits[-1].gpu

    table = Table(title=f"simulator vs live vLLM CPU engines: {args.pipeline.name} (makespan, s)")
    for col in ("seed", "live runs", "live median", f"sim ({base})", "ratio", "sim (fitted)", "ratio"):
        table.add_column(col, justify="right")
    rows = []
    for i, seed in enumerate(seeds):
        role = "fit on" if i == 0 else "checked on"
        runs = sorted(m for m, _ in by_seed[seed])
        table.add_row(f"{seed} ({role})", " ".join(f"{m:.1f}" for m in runs), f"{live[seed]:.2f}",
                      f"{before[i]:.2f}", f"{before[i] / live[seed]:.3f}",
                      f"{after[i]:.2f}", f"{after[i] / live[seed]:.3f}")
        rows.append({"seed": seed, "role": role, "live_runs_s": runs, "live_median_s": live[seed],
                     "sim_calibrated_s": before[i], "sim_fitted_s": after[i]})
    Console().print(table)
    fitted = {k: getattr(gpu, k) for k in ("peak_flops", "hbm_bw", "step_overhead_s", "dispatch_latency_s",
                                           "net_latency_s", "host_load_per_sequence")}
    print("\n".join(history))
    command = "python benchmarks/fidelity_vllm.py " + " ".join(sys.argv[1:])
    print(f"held-out seed: sim / live median {after[1] / live[seeds[1]]:.3f} (goal: within 20%)")
    print("command: " + command)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"command": command, "date": time.strftime("%F"), "runs": rows,
                                       "fitted": fitted, "corrections": history}, indent=1) + "\n")


if __name__ == "__main__":
    main()
