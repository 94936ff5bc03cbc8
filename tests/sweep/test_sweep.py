"""`prorsa sweep`: the sweep file, a grid of simulations on a Dask cluster, resume and lost workers."""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from click.testing import CliRunner
from distributed import Client, LocalCluster
from rich.console import Console

from prorsa.cli import main
from prorsa.config.load import ConfigError, load_pipeline
from prorsa.sim.run import simulate
from prorsa.rollout.context import resolve
from prorsa.sweep.grid import DIMS, load_grid
from prorsa.sweep.run import run_sweep

BASE = {
    "name": "tiny", "seed": 0, "policy": "colocated",
    "engines": {"backend": "emulated", "count": 3, "slots": 8, "gpu": "h200", "model": "qwen3-8b"},
    "workload": {"family": "search", "mode": "sync", "prompts": 2, "group_size": 2, "max_turns": 2},
}
SWEEP = {"base": "tiny.yaml", "axes": {"policy": ["colocated", "static:*"], "seed": [0, 1]}}


def write_sweep(tmp_path: Path, sweep: dict, base: dict = BASE) -> Path:
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(base))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


@pytest.fixture(scope="module")
def client():
    # processes, as the command uses: the lost-worker test kills one
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as c:
        yield c


def quiet() -> Console:
    return Console(file=io.StringIO())


@pytest.mark.parametrize("sweep, expected", [
    (SWEEP | {"colour": "red"}, "colour: unknown field"),
    ({**SWEEP, "axes": {"gpus": [8]}}, "axes.gpus: unknown field"),
    ({**SWEEP, "axes": {"mode": ["sync", "later"]}}, "axes.mode.1: got 'later'"),
    ({**SWEEP, "axes": {"seed": [0, 0]}}, "axes.seed: got [0, 0]; expected: 0 appears twice"),
    ({**SWEEP, "axes": {"model": ["qwen3-9b"]}}, "point (workload=search, model=qwen3-9b, gpu=h200, n_gpus=3"),
    ({**SWEEP, "axes": {"model": [{"name": "qwen3-30b-a3b", "ep": 2}]}}, "n_gpus 3 is not a multiple of tp x ep = 2"),
    ({**SWEEP, "axes": {"policy": ["static:1:5"]}}, "point (policy=static:1:5, workload=search"),
    ({**SWEEP, "overrides": {"seed": 3}}, "override seed is set by the seed axis"),
    ({**SWEEP, "base": "missing.yaml"}, "base: got 'missing.yaml'; no such pipeline file"),
])
def test_a_bad_sweep_file_is_one_error_line_and_exit_2(tmp_path, sweep, expected):
    path = write_sweep(tmp_path, sweep)
    result = CliRunner().invoke(main, ["sweep", str(path), "--output", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {path}: ") and result.stderr.count("\n") == 1
    assert expected in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_tiny_sweep_matches_direct_simulations(tmp_path, client):
    path = write_sweep(tmp_path, SWEEP)
    out = tmp_path / "out"
    address = client.cluster.scheduler_address
    result = CliRunner().invoke(main, ["sweep", str(path), "--cluster", address, "--output", str(out)])
    assert result.exit_code == 0, result.output
    ds = xr.load_dataset(out / "sweep.nc")
    assert ds.makespan_s.dims == DIMS
    assert dict(ds.sizes) == {"policy": 2, "workload": 1, "model": 1, "gpu": 1, "n_gpus": 1, "mode": 1, "seed": 2}
    assert list(ds.policy.values) == ["colocated", "static:best"] and ds.n_gpus.values.tolist() == [3]
    for seed in (0, 1):
        cfg = load_pipeline(tmp_path / "tiny.yaml", {"seed": seed})
        at = {"seed": seed, "workload": "search", "model": "qwen3-8b", "gpu": "h200", "n_gpus": 3, "mode": "sync"}
        coloc = simulate(resolve(cfg), "colocated").summary
        for f in ("makespan_s", "trajectories_per_s", "role_switches", "prefix_hit_rate", "recomputed_tokens"):
            assert float(ds[f].sel(policy="colocated", **at)) == coloc[f]
        splits = {p: simulate(resolve(cfg), f"static:{p}:{3 - p}").summary["makespan_s"] for p in (1, 2)}
        best = min(splits, key=splits.get)
        assert float(ds.makespan_s.sel(policy="static:best", **at)) == splits[best]
        assert int(ds.static_best_prefill.sel(**at)) == best and int(ds.static_best_decode.sel(**at)) == 3 - best
        assert float(ds.speedup_vs_colocated.sel(policy="static:best", **at)) == coloc["makespan_s"] / splits[best]
    assert np.isfinite(ds.sim_wall_s).all()
    assert (out / "speedup.png").stat().st_size > 0 and len(list((out / "points").glob("*.json"))) == 6


def test_a_rerun_computes_only_the_missing_point(tmp_path, client):
    grid = load_grid(write_sweep(tmp_path, SWEEP))
    out = tmp_path / "out"
    first = run_sweep(grid, out, client, quiet())
    assert len(first.computed) == 6 and first.skipped == 0
    files = sorted((out / "points").glob("*.json"))
    mtimes = {f.name: f.stat().st_mtime_ns for f in files}
    files[2].unlink()
    again = run_sweep(grid, out, client, quiet())
    assert again.computed == [files[2].stem] and again.skipped == 5
    assert all(f.stat().st_mtime_ns == mtimes[f.name] for f in files if f != files[2])
    assert np.isfinite(xr.load_dataset(out / "sweep.nc").makespan_s).all()


def test_a_worker_killed_mid_sweep_loses_no_point(tmp_path, client):
    sweep = {**SWEEP, "axes": {"policy": ["colocated", "prorsa"], "seed": list(range(6))},
             "overrides": {"workload.prompts": 6}}
    grid = load_grid(write_sweep(tmp_path, sweep))
    lost: list[str] = []
    killed: list[int] = []

    def kill_a_busy_worker(point, summary) -> None:
        if lost:
            return
        busy = {w: keys for w, keys in client.processing().items() if keys}
        if not busy:
            return  # nothing in flight this instant: try at the next result
        worker, keys = next(iter(busy.items()))
        pid = client.run(os.getpid, workers=[worker])[worker]
        os.kill(pid, signal.SIGKILL)  # no goodbye to the scheduler: the connection just drops
        killed.append(pid)
        lost.extend(k.removeprefix("sim-") for k in keys)

    outcome = run_sweep(grid, tmp_path / "out", client, quiet(), on_point=kill_a_busy_worker)
    assert lost, "no task was in flight when a result landed"
    assert killed[0] not in client.run(os.getpid).values()
    assert not outcome.failed and len(outcome.computed) == 12 and set(lost) <= set(outcome.computed)
    ds = xr.load_dataset(tmp_path / "out" / "sweep.nc")
    assert ds.sizes["seed"] == 6 and np.isfinite(ds.makespan_s).all()


def test_a_workload_axis_over_a_mix_is_refused_and_a_mix_is_a_coordinate(tmp_path):
    mixed = BASE | {"workload": {k: v for k, v in BASE["workload"].items() if k != "family"} | {"mix": {"search": 1}}}
    with pytest.raises(ConfigError, match=r"axes.workload: the base pipeline draws a mix of families; drop the mix"):
        load_grid(write_sweep(tmp_path, {"base": "tiny.yaml", "axes": {"workload": ["swe"]}}, mixed))
    grid = load_grid(write_sweep(tmp_path, SWEEP, mixed))
    assert grid.coords["workload"] == ["mix"]
