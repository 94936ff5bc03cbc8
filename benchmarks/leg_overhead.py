"""How much of the live grid's split gap a per-leg dispatch cost explains, in the simulator.

Live at a tenth of real time, every MoE split with a prefill engine ran 7-35% behind colocated
(policies_live-moe-repeats.json) where the simulator puts 1:3 ahead. One suspect is the cost of a
leg outside the engines (Dask's scheduler and the driver: 22 ms a leg at real time in the fidelity
fit, 0.22 s of the cost model's clock at a time scale of 0.1), which a disaggregated turn pays
twice. This prices it: the same seeded cells (policies_live.py's sizes, 4 emulated engines),
simulated with the GPU profile's dispatch_latency_s set to each --dispatch value, every split
given; the ratio is colocated's figure over the split's (sync makespans) or the split's over
colocated's (async throughputs), > 1 when the split is ahead.

    .venv/bin/python benchmarks/leg_overhead.py [--cells swe/moe/sync,swe/moe/async]
        [--dispatch 0,0.1,0.22,0.4] [--policies static:1:3,static:2:2] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import types
from pathlib import Path

import yaml

import policies_live as live
from paper import save

REPO = Path(__file__).resolve().parents[1]


def profile(gpu: str, dispatch_s: float, folder: Path) -> str:
    """A copy of the shipped profile `gpu` with its per-leg dispatch cost set; its path."""
    fields = yaml.safe_load((REPO / "configs" / "hardware" / f"{gpu}.yaml").read_text())
    path = folder / f"{gpu}-dispatch-{dispatch_s:g}.yaml"
    path.write_text(yaml.safe_dump(fields | {"dispatch_latency_s": dispatch_s}))
    return str(path)


def cell_points(cell: str, dispatch: list[float], policies: list[str], folder: Path) -> list[dict]:
    family, model, mode = cell.split("/")
    points = []
    for d in dispatch:
        args = types.SimpleNamespace(time_scale=0.1, family_scale="terminal=0.02", engines=4, slots=32, seed=0,
                                     gpu=profile("h200", d, folder), control_interval=2.0, min_control_wall=0.025,
                                     metrics_interval=0.5)
        figures = {}
        for policy in ["colocated", *policies]:
            cfg = live.pipeline(args, family, live.ALIASES.get(model, model), mode, policy, {})
            sim = live.simulated(cfg)
            figures[policy] = sim["makespan_s"] if mode == "sync" else sim["trajectories_per_s"]
            print(f"{cell} dispatch {d:g} s {policy}: {figures[policy]:.4g}", flush=True)
        for policy in policies:
            points.append({"cell": cell, "dispatch_s": d, "policy": policy,
                           "ratio": live.ratio(figures[policy], figures["colocated"], mode),
                           "figure": figures[policy], "colocated": figures["colocated"]})
    return points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default="swe/moe/sync,swe/moe/async")
    ap.add_argument("--dispatch", default="0,0.1,0.22,0.4", help="body seconds a leg, comma list")
    ap.add_argument("--policies", default="static:1:3,static:2:2")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/leg-overhead.json"))
    a = ap.parse_args()
    try:
        dispatch = [float(x) for x in a.dispatch.split(",")]
    except ValueError:
        sys.exit(f"error: --dispatch {a.dispatch!r}: expected a comma list of seconds")
    t0 = time.perf_counter()
    points = []
    with tempfile.TemporaryDirectory(prefix="prorsa-leg-") as d:
        for cell in a.cells.split(","):
            points += cell_points(cell, dispatch, a.policies.split(","), Path(d))
    save("leg_overhead.py", t0, [], points, a.out)


if __name__ == "__main__":
    main()
