"""How much of a fixed split's figure the router's starting decode mean decides: one drivers cell
run under one fixed split with no prior, with an earlier run's prior (another seed, colocated, as
priors.py makes it), and with declared priors that differ from the earlier run's only in the mean
decode (--decodes). The roles never change in these runs: the router's move cost
(runtime.sticky_overload: cost) is the only reader of the prior, and it starts its mean decode
from the prior's and learns it from the decodes that end (MoveCost.learn).

    .venv/bin/python benchmarks/router_prior.py --factor prefix-cache --value ideal --mode sync
                                                [--policy colocated] [--decodes 250,300,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper import save  # noqa: E402
from priors import cell_config, make_prior  # noqa: E402


def figure(cell: tuple, policy: str, prior) -> float:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    s = simulate(resolve(cell_config(cell, 0, 1, prior)), policy).summary
    return s["makespan_s"] if cell[3] == "sync" else s["trajectories_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--factor", default="prefix-cache")
    ap.add_argument("--value", default="ideal", help="the factor's value (a number for numeric factors)")
    ap.add_argument("--mode", default="sync")
    ap.add_argument("--policy", default="colocated", help="a fixed split")
    ap.add_argument("--decodes", default="250,300,350,400,450,500,550,600")
    ap.add_argument("--out", default="benchmarks/results/router-prior.json")
    args = ap.parse_args()
    from drivers import FACTORS
    from prorsa.metrics.prior import read_prior

    value = next((v for v in FACTORS[args.factor] if str(v) == args.value), None)
    if value is None:
        sys.exit(f"error: --value {args.value}: {args.factor} takes {FACTORS[args.factor]}")
    cell = ("drivers", args.factor, value, args.mode)
    t0 = time.perf_counter()
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(Path(tmp) / "earlier")
        make_prior((cell, "swe", 1, folder, tmp))
        earlier = read_prior(folder)
        runs = [("none", None, None), ("earlier", folder, earlier.decode_tokens)]
        runs += [(f"declared {d}", earlier.model_dump() | {"decode_tokens": float(d)}, float(d))
                 for d in args.decodes.split(",")]
        for name, prior, decode in runs:
            points.append({"factor": args.factor, "value": value, "mode": args.mode, "policy": args.policy,
                           "prior": name, "start_decode": decode, "figure": figure(cell, args.policy, prior)})
            print(f"{name:>14} (decode {decode}): {points[-1]['figure']:.3f}", flush=True)
    figs = [p["figure"] for p in points]
    summary = {"factor": args.factor, "value": value, "mode": args.mode, "policy": args.policy,
               "none": figs[0], "earlier": figs[1], "lowest": min(figs), "highest": max(figs)}
    save("router_prior.py", t0, [summary], points, args.out)


if __name__ == "__main__":
    main()
