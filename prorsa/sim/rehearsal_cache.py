"""Rehearsals kept across runs: a replay's makespan, keyed by everything the replay reads.

    cached(key_parts, replay) -> float   the makespan stored under the digest of `key_parts`, or
                                         replay() run and stored
    cache_path() -> Path | None          where they are kept; None when switched off

A rehearsal is a deterministic function of its inputs: the run's engines and cost models (as the
policy sees them: a wrong or calibrated model is another key), the split, the trajectories replayed,
the pipeline's shaping and this package's source. The no-prior opening rehearses fixed draws of the
plausible families under every split (control/opening.py), the same for every run on the same
engines and turn cap: a sweep over seeds, or a user's second run, finds them here instead of
replaying them again (on the paper's MoE cells the opening is ~95% of simulating prorsa). Like
vLLM's compile cache: `PRORSA_CACHE_ROOT` (default `$XDG_CACHE_HOME/prorsa`, else
`~/.cache/prorsa`) says where, `PRORSA_DISABLE_REHEARSAL_CACHE=1` switches it off.

The key hashes what the replay reads, so a stale entry can only be missed, never read: a digest of
this package's files is part of it (any code change starts afresh), and anything hashed in an order
that may differ between processes (a set) gives another key, not a wrong value. A cache that cannot
be read or written (a read-only home, a damaged file) is passed by with one warning: the replay runs
as it would without it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sqlite3
import threading
import warnings
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import prorsa

_SCHEMA = "CREATE TABLE IF NOT EXISTS rehearsal (key TEXT PRIMARY KEY, makespan_s REAL NOT NULL)"
_warned = threading.Event()
_memory: dict[str, float] = {}  # this process's, in front of the file
_MEMORY_MAX = 65536


def cache_path() -> Path | None:
    if os.environ.get("PRORSA_DISABLE_REHEARSAL_CACHE", "") not in ("", "0"):
        return None
    root = os.environ.get("PRORSA_CACHE_ROOT") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prorsa"
    return Path(root) / "rehearsals.sqlite"


@lru_cache(maxsize=1)
def source_digest() -> str:
    """This package's files (code and data), hashed once a process."""
    h = hashlib.sha256()
    root = Path(prorsa.__file__).parent
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def digest(key_parts: object) -> str:
    return hashlib.sha256(source_digest().encode() + pickle.dumps(key_parts, protocol=5)).hexdigest()


def cached(key_parts: object, replay: Callable[[], float]) -> float:
    path = cache_path()
    if path is None:
        return replay()
    key = digest(key_parts)
    if key in _memory:
        return _memory[key]
    stored = _read(path, key)
    if stored is None:
        stored = replay()
        _write(path, key, stored)
    if len(_memory) >= _MEMORY_MAX:
        _memory.clear()
    _memory[key] = stored
    return stored


def _execute(path: Path, sql: str, args: tuple) -> tuple | None:
    """One statement in a transaction of its own (sweeps' processes share the file); None where
    the cache cannot be used."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(path, timeout=30)
        try:
            with con:
                con.execute(_SCHEMA)
                return con.execute(sql, args).fetchone() or ()
        finally:
            con.close()
    except (OSError, sqlite3.Error) as e:
        _warn(path, e)
        return None


def _read(path: Path, key: str) -> float | None:
    row = _execute(path, "SELECT makespan_s FROM rehearsal WHERE key = ?", (key,))
    return float(row[0]) if row else None


def _write(path: Path, key: str, makespan_s: float) -> None:
    _execute(path, "INSERT OR REPLACE INTO rehearsal VALUES (?, ?)", (key, makespan_s))


def _warn(path: Path, error: Exception) -> None:
    if not _warned.is_set():
        _warned.set()
        warnings.warn(f"rehearsal cache {path}: {error}; rehearsals run without it "
                      "(PRORSA_CACHE_ROOT chooses another place, PRORSA_DISABLE_REHEARSAL_CACHE=1 none)",
                      RuntimeWarning, stacklevel=3)
