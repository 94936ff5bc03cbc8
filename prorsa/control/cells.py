"""Cells: one scheduler and controller per group of engines, and the coordinator above them.

A cell is a whole rollout body over a group of engines: its own Dask scheduler (live), driver,
router and control loop, which switches roles inside the cell as a one-cell run does. A
trajectory is placed on a cell when it starts and lives there to its end, so its KV and prefix
stay on that cell's engines. The coordinator, on a slower clock than the controllers', moves a
whole engine from one cell to another when a cell's demand outgrows its engines; a move retires
the engine in its cell (no new work, its legs drain, it stops) and starts it in the other, so
moves are rare and each is priced by that drain plus the restart.

    place(groups, cells, slots)   -> [cell of each group]: each GRPO group (a prompt's samples
                                     share its prefix, so a group stays in one cell), in order, on
                                     the cell with the largest share of its slots free
    Coordinator.decide(now, views) -> EngineMove | None: every coordinator interval, a pure
                                     function of the cells' views (and of its own last moves)
    CellView                      what a cell's body tells the coordinator
    EngineMove / MoveRecord       what the coordinator asks for / what the bodies did

The brain: no dask, no simulator. rollout/cells.py runs the coordinator's loop over bodies that
carry a move out (sim/cells.py on the virtual clock, live/cells.py on Dask clusters).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CellView:
    cell: int  # the cell's index
    engines: tuple[str, ...]  # its engines now, in engine order
    movable: tuple[str, ...]  # those that may leave: not switching roles, not leaving already
    slots: int  # turns one engine admits at once
    in_flight: int  # trajectories placed on the cell and not yet finished
    legs: dict[str, int]  # engine -> legs it holds now (the cheapest to retire holds the fewest)
    left_s: float | None = None  # how long the cell's work is expected to last; None: not known yet

    @property
    def per_engine(self) -> float:
        return self.in_flight / max(len(self.engines), 1)


@dataclass(frozen=True)
class EngineMove:
    engine: str  # the engine to retire in `source` and start in `target`
    source: int  # cell it leaves
    target: int  # cell it joins
    reason: str  # the numbers that decided it, for the log


@dataclass(frozen=True)
class MoveRecord:
    time_s: float  # when the coordinator asked for it (the bodies' clock)
    engine: str
    source: int
    target: int
    reason: str
    drain_s: float  # from the request until the engine held no leg in its old cell
    restart_s: float  # from then until it took work in its new cell


def place(groups: Sequence[int], cells: int, slots: Sequence[int]) -> list[int]:
    """The cell of each group, in order: `groups` are their sizes (trajectories), `slots` each
    cell's engines x slots. Each goes to the cell with the largest share of its slots left free by
    the groups placed before it (ties: the lower index), so cells fill in proportion to their
    engines."""
    if cells < 1 or len(slots) != cells:
        raise ValueError(f"{cells} cells, slots given for {len(slots)}")
    used = [0] * cells
    out = []
    for size in groups:
        c = max(range(cells), key=lambda i: ((slots[i] - used[i]) / slots[i], -i))
        used[c] += size
        out.append(c)
    return out


class Coordinator:
    """Moves one engine at a time from the cell with the least demand an engine to the one with the
    most, when (all must hold):
      - the taker would still carry `ratio` x the giver's trajectories an engine after the move
        (so a move never overshoots and the next one does not send it back);
      - the taker has work for the engine: at least `min_load` trajectories an engine after it;
      - the giver keeps `min_engines`;
      - neither cell moved an engine in the last `interval_s` (moves are rare: each empties an engine);
      - the taker's work is expected to outlast `payback` x the move's price (`move_s`: drain plus
        restart), when the taker knows how long it has left.
    """

    def __init__(self, ratio: float = 1.5, min_load: float = 1.0, min_engines: int = 1,
                 interval_s: float = 30.0, move_s: float = 30.0, payback: float = 2.0) -> None:
        self.ratio = ratio
        self.min_load = min_load
        self.min_engines = min_engines
        self.interval_s = interval_s
        self.move_s = move_s
        self.payback = payback
        self._last: dict[int, float] = {}  # cell -> when it last gave or took an engine

    def decide(self, now: float, views: Sequence[CellView]) -> EngineMove | None:
        live = [v for v in views if v.engines]
        if len(live) < 2:
            return None
        taker = max(live, key=lambda v: (v.per_engine, -v.cell))
        givers = [v for v in live if v.cell != taker.cell and len(v.engines) > self.min_engines and v.movable]
        if not givers:
            return None
        giver = min(givers, key=lambda v: (v.per_engine, v.cell))
        if any(now - self._last.get(c, -1e18) < self.interval_s for c in (taker.cell, giver.cell)):
            return None
        after_t = taker.in_flight / (len(taker.engines) + 1)
        after_g = giver.in_flight / (len(giver.engines) - 1)
        if after_t < self.ratio * max(after_g, 1.0) or after_t < self.min_load:
            return None
        if taker.left_s is not None and taker.left_s < self.payback * self.move_s:
            return None
        engine = min(giver.movable, key=lambda e: (giver.legs.get(e, 0), e))
        self._last[taker.cell] = self._last[giver.cell] = now
        return EngineMove(engine, giver.cell, taker.cell,
                          f"cell {taker.cell}: {taker.in_flight} trajectories on {len(taker.engines)} engines, "
                          f"cell {giver.cell}: {giver.in_flight} on {len(giver.engines)}")
