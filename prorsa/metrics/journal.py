"""Finished trajectories on disk as they land, so a killed driver loses at most one batch.

    RunJournal.open(run_dir, config_hash, batch, flush_s)   start or continue a run directory
    journal.add(result)          buffer a finished trajectory; flush when the batch is full or old
    journal.flush()              write the buffer as one part, then list it in the manifest
    journal.finish()             trajectories.parquet from every part; the manifest says the
                                 rollout is over (rolled_out: a resume only writes the outputs)
    journal.seal()               the manifest says complete: called once the run's other files
                                 (summary.json, metrics.nc) are written, so a driver killed before
                                 leaves a run that --resume finishes, not one it calls done
    journal.done_ids             trajectory ids some earlier flush made durable (resume skips them)
    journal.clock                set by the run once its rollout starts: this session's elapsed
                                 seconds, written with every manifest (a killed session's time
                                 counts up to its last flush)
    journal.elapsed_before       earlier sessions' rollout seconds, summed
    journal.driver_state         set by a driver whose trajectories cannot be drawn again from the
                                 seed (a partial rollout): where it stands, JSON, written with every
                                 manifest so it agrees with the parts; None from it defers a flush
    journal.saved_state          what the last committed manifest holds of it (None: nothing)
    flush_every(journal, s)      the run's timer for tick()

Layout:
    manifest.json                what is committed: the parts, their rows, the config hash,
                                 each session's rollout seconds and the driver's state
    parts/part-NNNNNN.parquet    one flush each, TRAJECTORY_SCHEMA

A part counts only once the manifest names it. Each file is written under a temporary name,
fsynced and renamed, and the manifest is replaced after its part, so whatever instant the driver
dies at, the manifest names only whole parts and a part it does not name is deleted on the next
open: a trajectory is either in exactly one listed part or it runs again.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prorsa.agent.loop import TrajectoryResult
from prorsa.metrics.outputs import TRAJECTORY_SCHEMA, trajectory_row
from prorsa.metrics.recorder import DROPPED

MANIFEST = "manifest.json"
PARTS = "parts"
TRAJECTORIES = "trajectories.parquet"
VERSION = 1


class JournalError(Exception):
    """A run directory that cannot be continued; one line naming the directory and the problem."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable(path: Path, write) -> None:
    """Write via a temporary name, fsync, rename: a reader sees the old file or the whole new one,
    also after a power cut (the rename alone survives only a killed process)."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


@dataclass
class RunJournal:
    run_dir: Path
    config_hash: str
    batch: int  # trajectories per part
    flush_s: float  # a non-empty buffer older than this is flushed on the next add or tick
    parts: list[dict[str, Any]] = field(default_factory=list)  # the manifest's, in order
    done_ids: set[str] = field(default_factory=set)
    completed_before: int = 0  # finished in earlier sessions, by status
    failed_before: int = 0
    dropped_before: int = 0  # a partial rollout's cancelled and stale: untrained, no failure
    complete: bool = False
    rolled_out: bool = False  # every trajectory is saved; what is left is the write-out
    sessions_before: list[float] = field(default_factory=list)  # earlier sessions' rollout seconds
    clock: Callable[[], float] | None = None  # this session's rollout seconds, once it started
    driver_state: Callable[[], dict | None] | None = None  # the module docstring's
    saved_state: dict | None = None
    _buffer: list[dict[str, Any]] = field(default_factory=list)
    _oldest: float = 0.0
    _lock: Any = None

    @classmethod
    def open(cls, run_dir: Path, config_hash: str, batch: int = 64, flush_s: float = 5.0) -> RunJournal:
        """Take the directory's lock, read what earlier sessions committed, drop what they did not."""
        run_dir = Path(run_dir)
        journal = cls(run_dir, config_hash, batch, flush_s)
        journal._lock = _lock(run_dir)
        manifest = _read_manifest(run_dir)
        if manifest is not None:
            if manifest["config_hash"] != config_hash:
                raise JournalError(f"{run_dir}: pipeline.json no longer matches the run "
                                   f"(config hash {config_hash}, manifest {manifest['config_hash']})")
            journal.parts = manifest["parts"]
            journal.complete = manifest["complete"]
            journal.rolled_out = manifest.get("rolled_out") is True
            journal.sessions_before = list(manifest.get("sessions", []))
            journal.saved_state = manifest.get("driver_state")
        journal._load_parts()
        journal._drop_uncommitted()
        return journal

    def _load_parts(self) -> None:
        for part in self.parts:
            path = self.run_dir / part["file"]
            try:
                table = pq.read_table(path, columns=["traj_id", "status"])
            except (OSError, pa.ArrowException) as e:
                raise JournalError(f"{path}: listed in {MANIFEST} but unreadable ({e})") from None
            if table.num_rows != part["rows"]:
                raise JournalError(f"{path}: {table.num_rows} rows, {MANIFEST} says {part['rows']}")
            for traj, status in zip(table.column("traj_id").to_pylist(), table.column("status").to_pylist()):
                if traj in self.done_ids:
                    raise JournalError(f"{path}: trajectory {traj!r} is already in an earlier part")
                self.done_ids.add(traj)
                if status == "completed":
                    self.completed_before += 1
                elif status in DROPPED:
                    self.dropped_before += 1
                else:
                    self.failed_before += 1

    def _drop_uncommitted(self) -> None:
        listed = {self.run_dir / p["file"] for p in self.parts}
        for path in (self.run_dir / PARTS).glob("*"):
            if path not in listed:  # written by a session that died before its manifest update
                path.unlink()

    def add(self, result: TrajectoryResult) -> None:
        traj = result.spec.traj_id
        if traj in self.done_ids:
            raise ValueError(f"trajectory {traj!r} finished twice")
        self.done_ids.add(traj)
        if not self._buffer:
            self._oldest = time.monotonic()
        self._buffer.append(trajectory_row(result))
        self.tick()

    def tick(self) -> None:
        """Flush if the batch is full or its oldest row has waited flush_s."""
        if self._buffer and (len(self._buffer) >= self.batch or time.monotonic() - self._oldest >= self.flush_s):
            self.flush()

    def flush(self, final: bool = False) -> None:
        """`final`: the run is over, so nothing is left to resume and no state need agree."""
        if not self._buffer:
            return
        state = None if self.driver_state is None else self.driver_state()
        if self.driver_state is not None and state is None and not final:  # mid-way through a fate
            return
        (self.run_dir / PARTS).mkdir(exist_ok=True)
        name = f"{PARTS}/part-{len(self.parts):06d}.parquet"
        table = pa.Table.from_pylist(self._buffer, schema=TRAJECTORY_SCHEMA)
        _durable(self.run_dir / name, lambda tmp: pq.write_table(table, tmp))
        self.parts.append({"file": name, "rows": table.num_rows})
        self.saved_state = state if state is not None else self.saved_state
        self._write_manifest()
        self._buffer = []

    def finish(self) -> Path:
        """Every committed trajectory, in the order they finished, as one file."""
        # the manifest that commits the last part says the rollout is over: from then on a
        # resume has nothing to roll out, whatever instant of the write-out the driver died at
        self.rolled_out = True
        if self._buffer:
            self.flush(final=True)
        else:
            self._write_manifest()
        tables = [pq.read_table(self.run_dir / p["file"], schema=TRAJECTORY_SCHEMA) for p in self.parts]
        table = pa.concat_tables(tables) if tables else TRAJECTORY_SCHEMA.empty_table()
        out = self.run_dir / TRAJECTORIES
        _durable(out, lambda tmp: pq.write_table(table, tmp))
        self._write_manifest()
        return out

    def seal(self) -> None:
        self.complete = True
        self._write_manifest()

    @property
    def saved_before(self) -> int:
        """Trajectories earlier sessions saved, whatever their status."""
        return self.completed_before + self.failed_before + self.dropped_before

    @property
    def committed(self) -> int:
        return sum(p["rows"] for p in self.parts)

    @property
    def elapsed_before(self) -> float:
        return float(sum(self.sessions_before))

    def _write_manifest(self) -> None:
        sessions = self.sessions_before + ([round(self.clock(), 3)] if self.clock is not None else [])
        data = {"version": VERSION, "config_hash": self.config_hash, "complete": self.complete,
                "trajectories": self.committed, "parts": self.parts, "sessions": sessions} | (
                    {"rolled_out": True} if self.rolled_out else {}) | (
                    {} if self.saved_state is None else {"driver_state": self.saved_state})
        _durable(self.run_dir / MANIFEST, lambda tmp: tmp.write_text(json.dumps(data, indent=1) + "\n"))

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None


def _lock(run_dir: Path):
    """One session per run directory: two writers would run the same trajectories twice."""
    f = open(run_dir / ".lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise JournalError(f"{run_dir}: another prorsa run is writing this directory") from None
    return f


def _read_manifest(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / MANIFEST
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        parts = data["parts"]
        ok = (data["version"] == VERSION and isinstance(data["config_hash"], str)
              and isinstance(data["complete"], bool) and isinstance(parts, list)
              and all(isinstance(p, dict) and isinstance(p.get("file"), str) and p["file"].startswith(f"{PARTS}/")
                      and "/" not in p["file"][len(PARTS) + 1:] and isinstance(p.get("rows"), int)
                      for p in parts)
              and all(isinstance(s, (int, float)) and not isinstance(s, bool) and 0 <= s < float("inf")
                      for s in data.get("sessions", []))
              and isinstance(data.get("driver_state", {}), dict))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise JournalError(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    if not ok:
        raise JournalError(f"{path}: not a prorsa manifest (version {VERSION})")
    return data


async def flush_every(journal: RunJournal, interval_s: float) -> None:
    """Tick the journal while a run goes, so a slow trickle of trajectories is not held back."""
    import asyncio

    while True:
        await asyncio.sleep(max(interval_s, 0.05))
        journal.tick()

