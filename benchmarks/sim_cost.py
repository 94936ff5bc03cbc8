"""What simulating prorsa costs beside simulating colocated, on the paper table's cells.

prorsa rehearses: with no prior on engines of several DP-attention ranks it opens on the split of
least worst-case regret over the plausible families, each replayed under every split
(control/opening.py), and it decides every control interval. Rehearsals are kept across runs
(sim/rehearsal_cache.py), so three figures per cell, each prorsa's CPU time over colocated's:

    cold   no rehearsal kept: the first run on these engines
    warm   the cache as a run of the same cell at another seed left it (seed + 1): a sweep over
           seeds, or a user's second run; what the run itself rehearses (its own steps) is not in it

Every point runs in a process of its own (a fresh interpreter) and reports its own CPU time (every
thread's: rehearsals run in threads), the figure to compare on a shared machine; the table shows
the median over --repeat. The figure each run reached is kept too: cold and warm must agree to the
last digit (a kept rehearsal is the replay's own makespan), and the script fails where they do not.

    .venv/bin/python benchmarks/sim_cost.py [--families swe,search,math-tir,terminal]
        [--models dense,moe] [--modes sync,async] [--seed 0] [--repeat 3] [--out FILE] [--reuse FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paper import save


def point(family: str, model: str, mode: str, seed: int, policy: str) -> dict:
    """One run in this process: its CPU time and figure."""
    from paper import config

    from prorsa.sim.run import simulate

    from prorsa.rollout.context import resolve

    t0 = time.process_time()
    s = simulate(resolve(config(family, model, mode, seed)), policy).summary
    return {"cpu_s": time.process_time() - t0, "figure": s["makespan_s"] if mode == "sync" else s["trajectories_per_s"]}


def in_process(args: list[str], cache: Path | None) -> dict:
    env = dict(os.environ)
    if cache is None:
        env["PRORSA_DISABLE_REHEARSAL_CACHE"] = "1"
    else:
        env.pop("PRORSA_DISABLE_REHEARSAL_CACHE", None)
        env["PRORSA_CACHE_ROOT"] = str(cache)
    out = subprocess.run([sys.executable, __file__, "--point", *args], env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"error: the point {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def cell(family: str, model: str, mode: str, seed: int, repeat: int, scratch: Path) -> dict:
    name = [family, model, mode]
    colocated = [in_process([*name, str(seed), "colocated"], None) for _ in range(repeat)]
    cold = []
    for r in range(repeat):
        shutil.rmtree(scratch / "cold", ignore_errors=True)
        cold.append(in_process([*name, str(seed), "prorsa"], scratch / "cold"))
    shutil.rmtree(scratch / "filled", ignore_errors=True)
    (scratch / "filled").mkdir()  # a cell that rehearses nothing leaves it empty
    in_process([*name, str(seed + 1), "prorsa"], scratch / "filled")
    warm = []
    for r in range(repeat):  # each from the cache seed + 1 left, not from the previous repeat's
        shutil.rmtree(scratch / "warm", ignore_errors=True)
        shutil.copytree(scratch / "filled", scratch / "warm")
        warm.append(in_process([*name, str(seed), "prorsa"], scratch / "warm"))
    figures = {p["figure"] for p in cold + warm}
    if len(figures) != 1:
        sys.exit(f"error: {' '.join(name)}: prorsa reached {sorted(figures)} cold and warm; a kept rehearsal "
                 "must give the replay's own figure")
    med = {k: statistics.median(p["cpu_s"] for p in v) for k, v in
           (("colocated", colocated), ("cold", cold), ("warm", warm))}
    return {"family": family, "model": model, "mode": mode, "seed": seed, "repeat": repeat,
            "colocated_cpu_s": round(med["colocated"], 3), "cold_cpu_s": round(med["cold"], 3),
            "warm_cpu_s": round(med["warm"], 3), "cold_vs_colocated": round(med["cold"] / med["colocated"], 2),
            "warm_vs_colocated": round(med["warm"] / med["colocated"], 2), "prorsa_figure": figures.pop(),
            "colocated_figure": colocated[0]["figure"]}


def main() -> None:
    if sys.argv[1:2] == ["--point"]:
        family, model, mode, seed, policy = sys.argv[2:7]
        print(json.dumps(point(family, model, mode, int(seed), policy)))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="swe,search,math-tir,terminal")
    ap.add_argument("--models", default="dense,moe")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/sim-cost.json")
    ap.add_argument("--reuse", metavar="FILE", help="an earlier results file: its cells this run does not measure are kept")
    args = ap.parse_args()
    if args.repeat < 1:
        sys.exit(f"error: --repeat: at least 1, not {args.repeat}")
    t0 = time.perf_counter()
    cells = []
    with tempfile.TemporaryDirectory(prefix="prorsa-sim-cost-") as scratch:
        for f in args.families.split(","):
            for m in args.models.split(","):
                for mode in args.modes.split(","):
                    c = cell(f, m, mode, args.seed, args.repeat, Path(scratch))
                    print(f"{f} {m} {mode}: colocated {c['colocated_cpu_s']:.2f} s CPU, prorsa cold "
                          f"{c['cold_vs_colocated']:.1f}x, warm {c['warm_vs_colocated']:.1f}x", flush=True)
                    cells.append(c)
    save("sim_cost.py", t0, merged(args.reuse, cells), [], args.out)


def merged(path: str | None, measured: list[dict]) -> list[dict]:
    """An earlier results file's cells in their order, those measured again replaced, then any new."""
    if path is None:
        return measured
    try:
        earlier = json.loads(Path(path).read_text())["cells"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"error: --reuse {path}: not a sim_cost.py results file ({e})")
    new = {(c["family"], c["model"], c["mode"]): c for c in measured}
    out = [new.pop((c["family"], c["model"], c["mode"]), c) for c in earlier]
    return out + list(new.values())


if __name__ == "__main__":
    main()
