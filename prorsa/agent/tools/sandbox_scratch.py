"""Host-side scratch directories of sandboxed calls, and the ones a killed caller left behind.

    fd, path = make(root)     a fresh prorsa-scratch-* directory, flock'ed by this process through fd
    remove(fd, path)          after the call
    sweep(root)               remove every prorsa-scratch-* directory whose owner is gone

The directory holds the seeded files and is where the sandbox mounts its root; the call writes to
a tmpfs of its own, never here. A caller killed mid-call cannot remove it, but its lock goes with
it (the kernel drops a dead process's flocks), so the next caller's first call sweeps it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time

PREFIX = "prorsa-scratch-"  # not the "prorsa-sbx-" of earlier versions, which took no lock
# A directory is locked a moment after mkdtemp makes it; one younger than this is left alone.
GRACE_S = 2.0
_swept: set[str] = set()


def make(root: str | None) -> tuple[int, str]:
    path = tempfile.mkdtemp(prefix=PREFIX, dir=root)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd, path


def remove(fd: int, path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    os.close(fd)


def sweep(root: str | None, grace_s: float = GRACE_S) -> list[str]:
    """Remove the unlocked prorsa-scratch-* directories of `root` (None: the system temp); returns them."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(root) if n.startswith(PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # not a directory of ours, or gone
        try:
            young = time.time() - os.fstat(fd).st_mtime < grace_s
            if not young:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        except OSError:
            pass  # its owner is alive
        finally:
            os.close(fd)
    return removed


def sweep_once(root: str | None) -> None:
    """sweep() on a process's first call for each root: what a killed caller left is old by then."""
    key = root or tempfile.gettempdir()
    if key not in _swept:
        _swept.add(key)
        sweep(root)
