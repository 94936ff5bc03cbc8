"""benchmarks/scale.py's table on a tiny input: the fit, demand scaled per GPU, utilisation,
headroom, cells and the headline are the arithmetic they say; tables.py renders them."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_script


@pytest.fixture(scope="module")
def scale():
    return load_script("scale.py")


SCHED = {"r": 0.02, "a": 1.0, "b": 0.1, "c": 2.0}  # 2% of a core + 1 + 0.1 E + 2 N/1000 ms a turn
DRIVER = {"r": 0.0, "a": 0.5, "b": 0.01, "c": 1.0}


def _cpu_s(f: dict, engines: int, trajectories: int, turns: int, wall: float) -> float:
    return f["r"] * wall + turns * (f["a"] + f["b"] * engines + f["c"] * trajectories / 1e3) / 1e3


def _point(engines: int, trajectories: int, turns: int, wall: float) -> dict:
    return {"source": "cp.json", "engines": engines, "trajectories": trajectories, "turns": turns,
            "turns_per_s": turns / wall, "run_wall_s": wall, "scheduler_idle_cpu_share": 0.03,
            "scheduler_cpu_s": _cpu_s(SCHED, engines, trajectories, turns, wall),
            "driver_cpu_s": _cpu_s(DRIVER, engines, trajectories, turns, wall)}


def _doc() -> dict:
    demand = [{"gpus": 8, "model": "dense", "engines": 8, "trajectories": 64, "turns": 1000, "makespan_s": 100.0,
               "peak_turns_per_s": 20.0, "window_s": 10.0},
              {"gpus": 16, "model": "dense", "engines": 16, "trajectories": 128, "turns": 2000,
               "makespan_s": 100.0, "peak_turns_per_s": 40.0, "window_s": 10.0}]
    return {"models": ["dense"], "gpus": [8, 16, 64], "tasks_per_turn": 3, "headroom_goal": 2.0, "demand": demand,
            "measured": [_point(4, 256, 556, 60.0), _point(8, 256, 556, 120.0), _point(16, 256, 556, 130.0),
                         _point(32, 256, 556, 330.0), _point(8, 1024, 2200, 300.0)],
            "per_gpu_trajectories": 8, "max_turns": 12, "policy": "prorsa",
            "measured_from": [{"file": "cp.json", "command": "python benchmarks/control_plane.py --processes 4"}],
            "command": "python benchmarks/scale.py"}


def test_the_fit_recovers_background_and_cost_a_turn(scale):
    f = scale.fit(_doc()["measured"], "scheduler")
    assert [f[t] for t in "rabc"] == pytest.approx([0.02, 1.0, 0.1, 2.0])
    assert f["held_at_zero"] == [] and f["worst_relative_error"] == pytest.approx(0.0, abs=1e-9)


def test_pairs_take_the_background_off_the_added_turns(scale):
    points = _doc()["measured"]  # 8 engines: 256 and 1,024 trajectories
    (pair,) = scale.pairs(points, "scheduler", 0.02)
    assert pair["engines"] == 8 and pair["trajectories"] == [256, 1024]
    extra = points[4]["scheduler_cpu_s"] - points[1]["scheduler_cpu_s"] - 0.02 * (300.0 - 120.0)
    assert pair["cpu_ms_per_turn"] == pytest.approx(1e3 * extra / (2200 - 556))


def test_a_growth_the_runs_put_below_zero_is_held_at_zero(scale):
    points = _doc()["measured"]
    for p in points:  # a cost a turn a little lower with more engines, as noise can make it
        p["scheduler_cpu_s"] = 0.02 * p["run_wall_s"] + p["turns"] * (1.0 - 0.002 * p["engines"]
                                                                      + 2.0 * p["trajectories"] / 1e3) / 1e3
    f = scale.fit(points, "scheduler")
    assert f["held_at_zero"] == ["b"] and f["b"] == 0.0
    assert f["r"] > 0 and f["a"] > 0 and f["c"] > 0 and f["worst_relative_error"] > 0


def test_rows_are_the_arithmetic_they_claim(scale):
    doc = _doc()
    out = scale.build(doc)
    rows = {r["gpus"]: r for r in out["rows"]}
    assert [rows[g]["demand"] for g in (8, 16, 64)] == ["simulated", "simulated", "extrapolated from 16"]
    r = rows[64]  # 4x the 16-GPU simulation
    assert (r["engines"], r["trajectories"]) == (64, 512)
    assert r["turns_per_s_mean"] == pytest.approx(80.0) and r["turns_per_s_peak"] == pytest.approx(160.0)
    assert r["tasks_per_s_peak"] == pytest.approx(480.0)
    ms, idle = 1 + 0.1 * 64 + 2 * 0.512, 0.02  # 8.424 ms, a background of 2% of a core
    s = r["scheduler"]
    assert s["cpu_ms_per_turn"] == pytest.approx(ms) and s["background_share"] == pytest.approx(idle)
    assert s["capacity_turns_per_s"] == pytest.approx((1 - idle) * 1e3 / ms)
    assert s["utilisation"] == pytest.approx(idle + 160.0 * ms / 1e3)
    assert s["headroom"] == pytest.approx(s["capacity_turns_per_s"] / r["turns_per_s_peak"])
    assert s["headroom_mean"] == pytest.approx(s["capacity_turns_per_s"] / 80.0)
    d = r["driver"]  # no background
    assert d["headroom"] == pytest.approx(1e3 / (0.5 + 0.64 + 0.512) / 160)
    assert d["headroom"] == pytest.approx(1 / d["utilisation"])
    # 16 GPUs: scheduler 1 + 1.6 + 0.256 = 2.856 ms, 2% background, at 40 turns/s
    assert rows[16]["scheduler"]["headroom"] == pytest.approx(0.98 * 1e3 / 2.856 / 40)
    assert rows[16]["ok"] and rows[16]["cells"] == 1
    # 64 GPUs: 2% + 160 x 8.424 ms = 1.37 cores: not ok; in 2 cells of 32 engines each has 2x
    assert not r["ok"] and s["headroom"] < 2.0
    assert r["cells"] == 2
    assert 0.98 * (1e3 / (1 + 0.1 * 32 + 2 * 0.256)) / 80 >= 2.0
    assert out["headline"]["dense"]["largest_row"] == 16


def test_the_largest_cluster_is_where_headroom_crosses_the_goal(scale):
    doc = _doc()
    out = scale.build(doc)
    g = out["headline"]["dense"]["largest_gpus"]

    def headroom(gpus: int) -> float:  # demand 2.5 turns/s a GPU, 1 engine and 8 trajectories a GPU
        scheduler = 0.98 * 1e3 / (1 + 0.1 * gpus + 2 * 8 * gpus / 1e3)
        return min(scheduler, 1e3 / (0.5 + 0.01 * gpus + 8 * gpus / 1e3)) / (2.5 * gpus)

    assert headroom(g) >= 2.0 > headroom(g + 1)
    assert 16 <= g < 64
    at_mean = out["headline"]["dense"]["largest_gpus_mean"]  # half the peak's demand: 1.25 turns/s a GPU
    assert 2 * headroom(at_mean) >= 2.0 > 2 * headroom(at_mean + 1)


def test_points_that_do_not_pin_the_fit_are_refused(scale):
    with pytest.raises(ValueError):
        scale.fit([_point(8, 256, 556, 100.0)] * 4, "scheduler")


def test_the_table_renders_the_rows(scale):
    tables = load_script("tables.py")
    doc = _doc()
    doc |= scale.build(doc)
    text = "\n".join(tables.t_scale({"scale.json": doc}))
    assert "| 64 | dense | 64 | 512 | extrapolated from 16 | 80 / 160 | 480 | 8.42 ms | 137% | 1.45x / 0.73x |" in text
    assert "dense: 16 GPUs of the rows; up to 37 GPUs at the peak, 53 at the mean" in text and "cells for 2x" in text
