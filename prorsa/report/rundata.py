"""A stored run (or a sweep's comparison Dataset) read back for a report; no live cluster.

    load_run(path) -> RunData        a run directory: metrics.nc, summary.json, trajectories.parquet
                                     (pipeline.json when there is one)
    load_sweep(path) -> Sweep        a netCDF with a `policy` dimension and a `makespan_s` variable
    RunData.turns                    one row per turn: its trajectory, index and timings
    RunData.control_unit             report seconds per second of control_t / switch_time_s
    RunData.time_scale               report seconds per body second (forecast horizons)
    ReportError                      bad input; its message names the file

Clocks: a live run's metrics.nc (`clock` attribute "wall") has every time in wall seconds since
the rollout began; only the forecast's horizons are body seconds (wall / time_scale). Runs stored
before that (no `clock` attribute) stamped the controller's records (control_t, switch_time_s) in
body seconds, so those are multiplied by the time scale from pipeline.json. A simulated run
(`clock` "body ...") has one clock throughout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xarray as xr

from prorsa.engine.registry import BACKENDS
from prorsa.metrics.outputs import ROLE_CODES, WALL_CLOCK

REQUIRED_VARS = ("role", "active", "traj_start_s", "traj_end_s", "traj_completed")
PHASES = ("queue_s", "prefill_s", "transfer_s", "decode_s", "tool_s")
_TURN_FIELDS = ("turn", "start_s", "end_s", "prefill_tokens", *PHASES)


class ReportError(Exception):
    """One line for the user: which file, what is wrong with it."""


@dataclass(frozen=True)
class RunData:
    path: Path
    ds: xr.Dataset
    summary: dict[str, Any]
    pipeline: dict[str, Any] | None  # None: the directory has no pipeline.json (a simulated run)
    turns: pd.DataFrame  # columns: traj_id, status, *_TURN_FIELDS
    control_unit: float
    time_scale: float
    clock: str  # "wall" or "body": the unit of every time the report shows for this run

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def policy(self) -> str:
        return str(self.summary.get("policy") or self.ds.attrs.get("policy", "?"))

    @property
    def role_names(self) -> dict[int, str]:
        codes = self.ds.attrs.get("role_codes")
        named = json.loads(codes) if isinstance(codes, str) else {r.value: c for r, c in ROLE_CODES.items()}
        return {int(c): str(r) for r, c in named.items()}


@dataclass(frozen=True)
class Sweep:
    path: Path
    ds: xr.Dataset
    clock: str  # as the Dataset says, else "unknown"

    @property
    def name(self) -> str:
        return self.path.name


def load_run(path: Path) -> RunData:
    if not path.exists():
        raise ReportError(f"{path}: no such file or directory")
    if not path.is_dir():
        raise ReportError(f"{path}: not a run directory")
    missing = [f for f in ("metrics.nc", "summary.json", "trajectories.parquet") if not (path / f).is_file()]
    if missing:
        raise ReportError(f"{path}: not a run directory (no {', '.join(missing)})")
    ds = _read(path / "metrics.nc", _netcdf)
    absent = [v for v in REQUIRED_VARS if v not in ds.variables]
    if absent:
        raise ReportError(f"{path / 'metrics.nc'}: not a run's metrics (no variable {', '.join(absent)})")
    summary = _read_json(path / "summary.json")
    pipeline = _read_json(path / "pipeline.json") if (path / "pipeline.json").is_file() else None
    turns = _read(path / "trajectories.parquet", _turn_table)
    clock = str(ds.attrs.get("clock", ""))
    if clock.startswith("body"):
        return RunData(path, ds, summary, pipeline, turns, 1.0, 1.0, "body")
    stored = ds.attrs.get("time_scale")
    scale = float(stored) if clock == WALL_CLOCK and isinstance(stored, (int, float)) and stored > 0 else _time_unit(pipeline)
    return RunData(path, ds, summary, pipeline, turns, 1.0 if clock == WALL_CLOCK else scale, scale, "wall")


def load_sweep(path: Path) -> Sweep:
    if not path.is_file():
        raise ReportError(f"{path}: no such file")
    ds = _read(path, _netcdf)
    if "policy" not in ds.dims or "makespan_s" not in ds.variables:
        raise ReportError(f"{path}: not a sweep Dataset (needs a policy dimension and makespan_s)")
    clock = str(ds.attrs.get("clock", "unknown"))
    return Sweep(path, ds, "body" if clock.startswith("body") else clock)


def _read(path: Path, reader):
    # Any reader failure on a stored file (truncated, not netCDF, not parquet) is bad input.
    try:
        return reader(path)
    except Exception as e:  # noqa: BLE001
        raise ReportError(f"{path}: cannot read ({type(e).__name__}: {_first_line(e)})") from None


def _read_json(path: Path) -> dict[str, Any]:
    data = _read(path, lambda p: json.loads(p.read_text()))
    if not isinstance(data, dict):
        raise ReportError(f"{path}: expected a JSON object")
    return data


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else "no detail"


def _turn_table(path: Path) -> pd.DataFrame:
    table = pq.read_table(path, columns=["traj_id", "status", "turns"])
    lengths = pc.list_value_length(table["turns"]).fill_null(0).to_numpy()
    flat = pc.list_flatten(table["turns"])
    cols = {f: pc.struct_field(flat, f).to_numpy(zero_copy_only=False) for f in _TURN_FIELDS}
    return pd.DataFrame({
        "traj_id": np.repeat(table["traj_id"].to_numpy(zero_copy_only=False), lengths),
        "status": np.repeat(table["status"].to_numpy(zero_copy_only=False), lengths),
        **cols,
    })


def _time_unit(pipeline: dict[str, Any] | None) -> float:
    """Wall seconds per body second, the rule the live run used (rollout/context.py: time_unit)."""
    engines = (pipeline or {}).get("engines") or {}
    backend = BACKENDS.get(engines.get("backend"))
    scale = engines.get("time_scale", 1.0) if backend is not None and backend.time_scaled else 1.0
    return float(scale) if isinstance(scale, (int, float)) and scale > 0 else 1.0


def _netcdf(path: Path) -> xr.Dataset:
    return xr.load_dataset(path, engine="netcdf4")  # the engine every writer here uses
