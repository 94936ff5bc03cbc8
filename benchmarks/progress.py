"""Points simulated in a process pool, each told on stderr as it ends: a long benchmark shows its
progress, and the order points finish in does not matter to what is kept.

    each_done(pool, fn, jobs, describe) -> iterator of fn(job), in the order they finish
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.pool import Pool
from typing import Any


def each_done(pool: Pool, fn: Callable[[Any], dict], jobs: Sequence[Any],
              describe: Callable[[dict], str]) -> Iterator[dict]:
    for i, point in enumerate(pool.imap_unordered(fn, jobs), 1):
        print(f"[{i}/{len(jobs)}] {describe(point)}", file=sys.stderr, flush=True)
        yield point
