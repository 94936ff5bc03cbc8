"""The run folder `prorsa run` and `prorsa serve` write (and calibrate its engine logs): made new,
refused when it holds anything, and after a start that did not finish either removed or marked failed.

    RunFolder(path, fresh)                   where the run writes; fresh: this command made it
    new_run_folder(base, name) -> RunFolder  <base>/<name>-<timestamp>/, a suffix where that exists
    run_folder_at(target) -> RunFolder       --output: the folder itself, new or empty
    write_pipeline(folder, cfg)              pipeline.json, what --resume starts again from
    failed_start(folder, msg) -> str         the error line of a start that failed
    interrupted(folder) -> str               the error line of an interrupted run
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prorsa.commands.errors import fail
from prorsa.metrics.run_dirs import holds_anything, output_problem

if TYPE_CHECKING:
    from prorsa.config.pipeline import PipelineConfig

FAILED = "failed.json"


@dataclass(frozen=True)
class RunFolder:
    path: Path
    fresh: bool  # made by this command (not a resumed run's): nothing in it is older than the start


def new_run_folder(base: Path, name: str) -> RunFolder:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = base / f"{name}-{stamp}"
    suffix = 1
    try:
        while run_dir.exists():
            suffix += 1
            run_dir = base / f"{name}-{stamp}-{suffix}"
        run_dir.mkdir(parents=True)
    except OSError as e:  # a file where a directory goes, no permission, a name too long
        fail(f"{base}: cannot make the run directory {run_dir.name} there ({e.strerror or e})")
    return RunFolder(run_dir, fresh=True)


def run_folder_at(target: Path) -> RunFolder:
    """A folder that holds anything already is refused, so no run is written over another."""
    if (problem := output_problem(target, "")) is not None:  # a file in the way, a place no folder can go
        fail(f"--output: got '{target}'; {problem}")
    try:
        if holds_anything(target):
            fail(f"--output: {target} exists and is not empty (it is the run folder itself; "
                 f"output_dir={target} makes a new run folder under it, --resume {target} finishes a stopped run)")
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"--output: cannot make {target} ({e.strerror or e})")
    return RunFolder(target, fresh=True)


def write_pipeline(folder: RunFolder, cfg: PipelineConfig) -> None:
    (folder.path / "pipeline.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")


def failed_start(folder: RunFolder, msg: str) -> str:
    """A run whose cluster or engines never started leaves no half-made directory: a new one with
    nothing to read is removed; else it is marked failed (RUN_DIR/failed.json) beside the engine
    logs that say why, and the error line points at them."""
    logs = sorted((folder.path / "engines").glob("*.log"))
    if folder.fresh and not logs:
        shutil.rmtree(folder.path, ignore_errors=True)
        return msg
    (folder.path / FAILED).write_text(json.dumps({"stage": "start", "error": msg}) + "\n")
    return msg + (f" (engine logs: {folder.path / 'engines'})" if logs else "")


def out_of_space(folder: RunFolder, error: OSError) -> str:
    """A disk that filled mid-run: the journal's committed parts stay whole (each is written, then
    listed), so the run is resumed once space is freed."""
    where = f" writing {error.filename}" if error.filename else ""
    return (f"{folder.path}: no space left on the device{where}; the trajectories saved so far are kept: "
            f"free some space, then prorsa run --resume {folder.path}")


def interrupted(folder: RunFolder) -> str:
    """An interrupted run keeps what its journal committed; one interrupted before anything was
    committed is a start that did not finish."""
    from prorsa.metrics.journal import MANIFEST

    manifest = folder.path / MANIFEST
    if manifest.exists():
        if json.loads(manifest.read_text()).get("complete"):  # stopped as it ended: its outputs written
            return f"interrupted as the run ended; it is complete in {folder.path}"
        return f"interrupted; finished trajectories kept in {folder.path} (prorsa run --resume {folder.path})"
    return failed_start(folder, "interrupted before any trajectory was saved")
