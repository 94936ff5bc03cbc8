"""benchmarks/universal_split.py's bound on a tiny input: the universal split is the one whose worst
time over the workloads, against each workload's best, is least; tables.py renders it."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_script


@pytest.fixture(scope="module")
def us():
    return load_script("universal_split.py")


def _points(us, times: dict[tuple, dict[str, float]]) -> list[dict]:
    """Every split of SPLITS at 200 s unless `times` says otherwise, per workload."""
    return [{"engines": "e", "family": f, "mode": m, "turns": t, "policy": s, "time": given.get(s, 200.0)}
            for (f, m, t), given in times.items() for s in us.SPLITS]


def test_the_universal_split_minimises_the_worst_regret(us):
    # A is best on w1 (100 s) and 150 s on w2; B is 110 s and 105 s; w2's best is C at 100 s
    times = {("swe", "sync", None): {"static:1:7": 100.0, "static:2:6": 110.0, "colocated": 180.0},
             ("math-tir", "sync", 2): {"static:1:7": 150.0, "static:2:6": 105.0, "static:3:5": 100.0,
                                       "colocated": 120.0}}
    c = us.summary("e", _points(us, times))
    assert c["universal"] == "static:2:6" and c["regret"] == pytest.approx(1.10)
    assert c["worst_workload"] == ["swe", "sync", None]
    assert c["colocated_regret"] == pytest.approx(1.80) and c["regrets"]["static:1:7"] == pytest.approx(1.50)
    assert sorted(b[-1] for b in c["best"]) == ["static:1:7", "static:3:5"]


def test_a_split_best_everywhere_bounds_switching_at_one(us):
    times = {("swe", "sync", None): {"static:2:6": 90.0}, ("search", "async", None): {"static:2:6": 0.5}}
    c = us.summary("e", _points(us, times))
    assert c["universal"] == "static:2:6" and c["regret"] == 1.0


def test_the_table_renders_the_bound(us):
    tables = load_script("tables.py")

    times = {("swe", "sync", None): {"static:1:7": 100.0, "static:2:6": 110.0},
             ("math-tir", "sync", 2): {"static:1:7": 150.0, "static:2:6": 105.0, "static:3:5": 100.0}}
    doc = {"command": "python benchmarks/universal_split.py", "cells": [us.summary("e", _points(us, times))]}
    lines = tables.t_universal_split({"universal-split.json": doc})
    assert "| e | 2 | 2:6 | 1.100 | swe sync, own turn cap | 2.000 | 1:7, 3:5 |" in lines
    assert any("at most 1.100x" in line for line in lines)
