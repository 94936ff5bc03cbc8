"""The CPU host that vLLM CPU engines share: what slows an engine while others work.

`prorsa calibrate` times one engine alone on its core. In a live run on a small CPU host two
things slow it, both only while other engines are busy too:

- pinning: the runtime pins engine i to cores i*k .. i*k+k-1, wrapping around (engine_cores
  below), so with more engines than cores two engines take turns on one core;
- the rest of the host: each sequence in flight keeps its server's processes (HTTP, scheduling,
  detokenizing) and the driver, the scheduler and the tools busy, `load` cores' worth (a hardware
  profile's host_load_per_sequence, fitted by prorsa calibrate --from-run) that floats over
  every core.

Measured on the quickstart (3 engines, 2 cores): the last trajectory of a step decodes at 14 ms a
token alone on the host, 24-47 ms while the step's other trajectories run; one average factor
over-predicted the makespan by 20%, this model by 0-8%. The simulator applies it to a vLLM CPU
deployment.

    engine_cores(i, k[, n])          the cores engine i is pinned to: k consecutive, wrapping around
    CoreShare(cores, n_cores, load)  engine id -> the cores it is pinned to (empty: unpinned)
    with share.busy(engine, n):      the engine computes n sequences; the factor it yields stretches its step

A step's factor is fixed when it starts: a neighbour that starts later does not stretch it, which
is why the emulated engine re-plans its decode stretches every few steps while cores are shared.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


def engine_cores(index: int, per_engine: int, n_cpus: int | None = None) -> list[int] | None:
    """Engines take consecutive cores, wrapping around when there are more engines than cores."""
    if per_engine <= 0:
        return None
    n = n_cpus or os.cpu_count() or 1
    return sorted({(index * per_engine + j) % n for j in range(per_engine)})


def node_share(cores: list[int] | None, nodes: int, node: int) -> list[int] | None:
    """Node `node`'s slice of an engine spanning `nodes` nodes (cluster/nodes.py): its ranks'
    cores, as one server would bind them; None: not pinned."""
    if not cores:
        return None
    per_node = len(cores) // nodes
    return cores[node * per_node:(node + 1) * per_node]


class CoreShare:
    def __init__(self, cores: Mapping[str, frozenset[int]], n_cores: int, load: float = 0.0):
        self.cores = dict(cores)
        self.n_cores, self.load = n_cores, load
        self._busy: dict[str, int] = {}  # engine -> sequences in its step

    @classmethod
    def pinned(cls, engine_ids: list[str], per_engine: int, n_cores: int, load: float = 0.0) -> CoreShare:
        """As the live runtime pins them; per_engine 0 = not pinned."""
        return cls({e: frozenset(engine_cores(i, per_engine, n_cores) or ()) for i, e in enumerate(engine_ids)},
                   n_cores, load)

    def slowdown(self, engine_id: str, sequences: int = 1) -> float:
        """Demand on this engine's most crowded core, counting itself: the busy engines pinned
        there, plus an even part of what floats over every core (`load` per sequence in the busy
        engines' steps; unpinned engines' compute). An engine's threads meet at every layer, so
        its step waits for its slowest core."""
        busy = {e: n for e, n in self._busy.items() if e != engine_id} | {engine_id: sequences}
        floating = sum(self.load * n + (not self.cores[e]) for e, n in busy.items()) / self.n_cores
        mine = self.cores[engine_id] or range(self.n_cores)
        return max(1.0, max(sum(c in self.cores[e] for e in busy) for c in mine) + floating)

    @contextlib.contextmanager
    def busy(self, engine_id: str, sequences: int = 1) -> Iterator[float]:
        factor = self.slowdown(engine_id, sequences)
        self._busy[engine_id] = sequences
        try:
            yield factor
        finally:
            self._busy.pop(engine_id, None)
