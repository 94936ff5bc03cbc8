"""Where a run directory can go, asked before anything starts.

    output_problem(base, name) -> str | None   why `prorsa run` could not make <name>-<stamp>/ under
                                               `base` (a file in the way, a name longer than the
                                               file system allows, no permission), or None
    holds_anything(path) -> bool               a folder there already holds files: a command that
                                               writes one whole refuses it

`prorsa validate` asks it, so a pipeline whose output_dir cannot hold runs is refused with the other
input errors instead of when the run starts.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

STAMP_CHARS = len("-20261203-021500-99")  # what the run adds to its name: date, time, a suffix


def output_problem(base: Path, name: str) -> str | None:
    try:
        existing = base
        while not existing.exists():  # the directories the run would make, up to one that is there
            existing = existing.parent
        if not existing.is_dir():
            return f"{existing} is a file, not a directory"
        limit = os.pathconf(existing, "PC_NAME_MAX")
        for part in (*base.parts, name + "x" * STAMP_CHARS):
            if len(os.fsencode(part)) > limit:
                return f"a name of {len(os.fsencode(part))} bytes there; the file system allows {limit}"
        # permission bits say little to root or on special file systems (/proc): try it
        os.rmdir(tempfile.mkdtemp(prefix=".prorsa-probe-", dir=existing))
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        return f"cannot make a directory there ({getattr(e, 'strerror', None) or e})"
    return None


def holds_anything(path: Path) -> bool:
    return path.exists() and any(path.iterdir())
