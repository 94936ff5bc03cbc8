"""Does the lifecycle forecast beat simply repeating what just happened? prorsa's forecast error
against two baselines scored on the same bins of the same run: persistence (the last interval's
rate, repeated over the horizon) and an exponentially weighted mean of the last intervals.

For each of the paper table's cells (benchmarks/paper.py) prorsa runs once with no prior; the
figure per metric is the MAPE over the horizon bins, averaged over the control intervals that had
one (each interval's MAPE is over its recent 64 scored forecasts). < 1 in the ratio columns: the
forecast is the better. "lifecycle" is the model's forecast before the error book blends it with
the two baselines (prefill; decode sequences are not blended, so there it is the forecast).

    .venv/bin/python benchmarks/forecast_skill.py [--families swe,search,math-tir,terminal] [--workers 2]
                                                  [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper import config, save  # noqa: E402

METRICS = ("prefill_tps", "decode_seqs")
WHO = ("forecast", "persistence", "ewma", "lifecycle")


def run_cell(job: tuple) -> dict:
    import numpy as np

    from prorsa.control.forecast_stats import skill
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    family, model, mode = job
    sim = simulate(resolve(config(family, model, mode, 0)), "prorsa")
    per: dict[tuple[str, str], list[float]] = {}
    for c in sim.recorder.controls:
        for metric, by in skill(c.forecast_error).items():
            for who, value in by.items():
                per.setdefault((metric, who), []).append(value)
    mape = {m: {w: float(np.mean(per[m, w])) if per.get((m, w)) else None for w in WHO} for m in METRICS}
    return {"family": family, "model": model, "mode": mode, "mape": mape,
            "intervals": sum(1 for c in sim.recorder.controls if c.forecast_error)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="swe,search,math-tir,terminal")
    ap.add_argument("--models", default="dense,moe")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/forecast-skill.json")
    args = ap.parse_args()
    cells = [(f, m, md) for f in args.families.split(",") for m in args.models.split(",")
             for md in args.modes.split(",")]
    t0 = time.perf_counter()
    with Pool(args.workers) as pool:
        results = []
        for i, r in enumerate(pool.imap(run_cell, cells), 1):
            results.append(r)
            print(f"[{i}/{len(cells)}] {r['family']} {r['model']} {r['mode']}", file=sys.stderr, flush=True)

    from rich.console import Console
    from rich.table import Table

    table = Table(title="forecast MAPE against its baselines (mean over control intervals; ratio < 1: the forecast wins)")
    for col in ("family", "model", "mode", *(f"{m}: {w}" for m in METRICS for w in WHO)):
        table.add_column(col, justify="left" if col in ("family", "model", "mode") else "right")
    for r in results:
        table.add_row(r["family"], r["model"], r["mode"],
                      *(f"{r['mape'][m][w]:.2f}" if r["mape"][m][w] is not None else "-" for m in METRICS for w in WHO))
    Console(width=200).print(table)
    save("forecast_skill.py", t0, results, [], args.out)


if __name__ == "__main__":
    main()
