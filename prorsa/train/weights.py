"""Where the RL loop keeps its weight versions, for the learner that writes them and the engine
hosts that read them.

    WEIGHTS                         RUN_DIR/weights: one model directory per version, v0 v1 ...
    newest_version(run_dir) -> Path | None   the highest complete v<N> with N >= 1, if any
    shared_manifest(run_dir) -> str | None   weight_sync memory: the region's manifest (JSON) the
                                    learner last published, if any
    with written_whole(out_dir) as tmp:      fill tmp; it becomes out_dir whole at the end

A version directory is renamed into place whole (Trainer.save), so one that is there is complete;
the temporary ones beside it start with a dot and are never matched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

WEIGHTS = "weights"
# weight_sync memory: RUN_DIR/weights/shared/manifest.json names the trainer's shared-memory region
SHARED, SHARED_MANIFEST = "shared", "manifest.json"
_VERSION = re.compile(r"^v(\d+)$")


def newest_version(run_dir: str | Path) -> Path | None:
    root = Path(run_dir) / WEIGHTS
    if not root.is_dir():
        return None
    versions = [(int(m.group(1)), p) for p in root.iterdir() if (m := _VERSION.match(p.name))
                and int(m.group(1)) >= 1 and (p / "config.json").is_file()]
    return max(versions)[1] if versions else None


def shared_manifest(run_dir: str | Path) -> str | None:
    path = Path(run_dir) / WEIGHTS / SHARED / SHARED_MANIFEST
    return path.read_text() if path.is_file() else None


@contextlib.contextmanager
def written_whole(out_dir: Path) -> Iterator[Path]:
    """A directory written beside `out_dir` under a temporary name, then swapped in: a reader sees
    the old directory, for an instant none, or the new one whole, never a half-written one."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        yield tmp
        old = None
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}-old-{os.getpid()}-{time.monotonic_ns()}")
            os.rename(out_dir, old)
        os.rename(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
