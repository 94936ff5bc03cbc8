"""benchmarks/leg_overhead.py: the profile it prices a leg with, and its table."""

import yaml

from tests.benchmark_scripts import load_script


def test_profile_is_the_shipped_one_with_the_leg_cost_set(tmp_path):
    script = load_script("leg_overhead.py")
    shipped = yaml.safe_load((script.REPO / "configs/hardware/h200.yaml").read_text())
    written = yaml.safe_load(open(script.profile("h200", 0.22, tmp_path)).read())
    assert written.pop("dispatch_latency_s") == 0.22
    shipped.pop("dispatch_latency_s", None)
    assert written == shipped


def test_table_sets_each_split_live_beside_its_simulated_ratios():
    tables = load_script("tables.py")
    points = [{"cell": "swe/moe/sync", "policy": "static:1:3", "dispatch_s": d, "ratio": r}
              for d, r in ((0.0, 1.08), (0.22, 1.06))]
    live = {"command": "x", "cells": [{"family": "swe", "ep": 4, "mode": "sync",
                                       "result": {"per_policy": {"static:1:3": {"ratio": 0.93}}}}]}
    lines = tables.t_leg_overhead({"leg-overhead.json": {"command": "y", "points": points},
                                   "policies_live-moe-repeats.json": live})
    assert "| swe/moe/sync | 1:3 | 0.930 | 1.080 | 1.060 |" in lines
    assert "Live is 0.150-0.150 below" in lines[-1] and "by 0.020 at most" in lines[-1]
