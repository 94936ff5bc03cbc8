"""Where the RL loop keeps its weight versions, for the learner that writes them and the engine
hosts that read them.

    WEIGHTS                         RUN_DIR/weights: one model directory per version, v0 v1 ...
    newest_version(run_dir) -> Path | None   the highest complete v<N> with N >= 1, if any

A version directory is renamed into place whole (Trainer.save), so one that is there is complete;
the temporary ones beside it start with a dot and are never matched.
"""

from __future__ import annotations

import re
from pathlib import Path

WEIGHTS = "weights"
_VERSION = re.compile(r"^v(\d+)$")


def newest_version(run_dir: str | Path) -> Path | None:
    root = Path(run_dir) / WEIGHTS
    if not root.is_dir():
        return None
    versions = [(int(m.group(1)), p) for p in root.iterdir() if (m := _VERSION.match(p.name))
                and int(m.group(1)) >= 1 and (p / "config.json").is_file()]
    return max(versions)[1] if versions else None
