"""Which splits the allocator prices: every one for a few engines, a coarse-to-fine search past that.

    SplitSearch(exact_side, coarse, keep, lines)   how far to enumerate, how coarse to start, how much to refine
    search.exhaustive(n) -> bool                   whether n engines' splits are all priced
    search.priced(price, n, floors, seeds, also) -> (cands, costs)
        the splits of n engines worth pricing, in (P, D, M) order, and their costs: a search of each
        region of splits at least a floor (all splits: (0, 0, 0); those an interval can reach:
        cur - movable), around the seeds too; each split priced once
    within(cur, moves, n) -> (k, 3) ints           every split of n engines at most `moves` moves from cur

A split of n engines is (P, D, M) with P + D + M = n: a triangle of (n + 1)(n + 2) / 2 points, ~525,000
at 1,024 engines, where the allocator's score (a fluid model, one numpy pass over every candidate)
took about a second. The score is a function of the three counts, smooth in them: it is searched over
the counts instead. Up to `exact_side` engines (8,385 splits at 128) every split is priced, as
always. Past that, in each region (a triangle of side s: the splits floor + (p, d, s - p - d)):

    1. a lattice of stride ceil(s / coarse), and the region's three edges whole (an edge split,
       no mixed or no prefill engine, is often the best)
    2. around the `keep` best splits so far and the seeds (the current split, the goal being
       carried out): the splits within a stride (P and D each) on a lattice a quarter as fine,
       down to stride 1
    3. from the best split priced, a local descent at stride 1 until no neighbour is better
    4. the three lines (P, D or M fixed) through the `lines` best splits and the seeds: trading an
       engine between two roles often leaves the cost all but unchanged, and of such ties the
       full table's order decides; back to 3 while a line finds a better split

About 7,000 splits at 512 engines and 12,000 at 1,024 instead of 131,841 and 525,825. `price` must
price each split alone (a split's cost may not depend on which others are priced beside it), or a
search and the full table could order two tied splits differently.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Price = Callable[[np.ndarray], np.ndarray]  # (k, 3) splits -> (k,) costs
Split = tuple[int, int, int]


@dataclass(frozen=True)
class SplitSearch:
    exact_side: int = 128  # up to this many engines every split is priced (8,385 splits)
    coarse: int = 48  # lattice points along a side of a region past exact_side
    keep: int = 4  # best splits refined at each finer level
    lines: int = 1  # best splits whose three lines are priced whole

    def __post_init__(self) -> None:
        if self.exact_side < 0 or self.coarse < 1 or self.keep < 1 or self.lines < 0:
            raise ValueError("exact_side must be >= 0, coarse and keep >= 1, lines >= 0")

    def exhaustive(self, n: int) -> bool:
        return n <= self.exact_side

    def priced(self, price: Price, n: int, floors: Sequence[Split] = ((0, 0, 0),),
               seeds: Sequence[Split] = (), also: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The splits of n engines worth pricing for each region (the splits at least a floor), in
        (P, D, M) order, and their costs (module docstring). Every split of a region no wider than
        exact_side is priced; a seed outside a region is ignored there; `also`: (k, 3) splits
        priced besides."""
        grid = _Grid(price, n)
        if also is not None and len(also):
            grid.add(also[:, 0], also[:, 1])
        for floor in dict.fromkeys(tuple(int(x) for x in f) for f in floors):
            self._search(grid, _Region(floor, n - sum(floor)), seeds)
        return grid.result()

    def _search(self, grid: _Grid, region: _Region, seeds: Sequence[Split]) -> None:
        if region.side <= self.exact_side:
            grid.add(*region.lattice(1))
            return
        stride = math.ceil(region.side / self.coarse)
        grid.add(*region.lattice(stride))
        own = [(p, d) for p, d, m in seeds if region.holds(p, d)]
        while stride > 1:  # each level a quarter of the last one's stride, around the best so far
            finer = max(stride // 4, 1)
            grid.add(*region.clip(*_around([*grid.best(region, self.keep), *own], _box, stride, finer)))
            stride = finer
        while True:  # each round prices new splits or ends: the region is finite
            while (top := grid.best(region, 1)) and grid.add(*region.clip(*_box(*top[0], 1))):
                pass
            # Trading an engine between two roles can leave the cost all but unchanged (a mixed
            # engine that prefills nothing costs what a decode engine does): whole lines through
            # the best splits, so that of such ties the search keeps the one the full table would.
            grid.add(*region.clip(*_around([*grid.best(region, self.lines), *own], _lines, grid.n)))
            if grid.best(region, 1) == top:
                return


@dataclass(frozen=True)
class _Region:
    """The splits of n engines at least `floor` in every role: a triangle of side n - sum(floor)."""

    floor: Split
    side: int

    def holds(self, p, d):
        n = sum(self.floor) + self.side
        return (p >= self.floor[0]) & (d >= self.floor[1]) & (n - p - d >= self.floor[2])

    def clip(self, p: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inside = self.holds(p, d)
        return p[inside], d[inside]

    def lattice(self, stride: int) -> tuple[np.ndarray, np.ndarray]:
        """A lattice of `stride` over the region, and its three edges whole (P, D or M at the
        floor): an edge (no prefill, no decode or no mixed engine beyond the floor's) is where the
        best split often lies, in a basin of its own narrower than a stride."""
        (f0, f1, _), top = self.floor, self.side

        def axis(lo: int) -> np.ndarray:  # on multiples of stride, so regions share lattice points
            return np.union1d(np.arange(-(-lo // stride) * stride, lo + top + 1, stride), [lo, lo + top])

        p, d = (a.ravel() for a in np.meshgrid(axis(f0), axis(f1), indexing="ij"))
        inside = (p - f0) + (d - f1) <= top
        t = np.arange(top + 1)
        return (np.concatenate([p[inside], f0 + 0 * t, f0 + t, f0 + t]),
                np.concatenate([d[inside], f1 + t, f1 + 0 * t, f1 + top - t]))


class _Grid:
    """The splits of n engines priced so far, by (P, D), and their costs."""

    def __init__(self, price: Price, n: int) -> None:
        self.price, self.n = price, n
        self.seen = np.zeros((n + 1) * (n + 1), dtype=bool)  # by P * (n + 1) + D
        self.flat: list[np.ndarray] = []  # priced splits that serve both phases, and their costs
        self.costs: list[np.ndarray] = []

    def add(self, p: np.ndarray, d: np.ndarray) -> bool:
        """Price the new ones of these splits (each in the triangle); whether any was new."""
        flat = np.unique(np.asarray(p, dtype=int) * (self.n + 1) + np.asarray(d, dtype=int))
        flat = flat[~self.seen[flat]]
        if len(flat) == 0:
            return False
        self.seen[flat] = True
        p, d = np.divmod(flat, self.n + 1)
        splits = np.stack([p, d, self.n - p - d], axis=1)
        ok = (splits[:, 0] + splits[:, 2] >= 1) & (splits[:, 1] + splits[:, 2] >= 1)
        if ok.any():
            self.flat.append(flat[ok])
            self.costs.append(self.price(splits[ok]))
        return True

    def best(self, region: _Region, k: int) -> list[tuple[int, int]]:
        """The k cheapest splits of `region` priced, ties to the lowest (P, D) (the full table's order)."""
        flat, cost = self._all()
        p, d = np.divmod(flat, self.n + 1)
        inside = region.holds(p, d)
        flat, cost = flat[inside], cost[inside]
        return [divmod(int(f), self.n + 1) for f in flat[np.lexsort((flat, cost))[:k]]]

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """Every split priced, in (P, D, M) order as splits() lists them, and its cost."""
        flat, cost = self._all()
        order = np.argsort(flat)
        p, d = np.divmod(flat[order], self.n + 1)
        return np.stack([p, d, self.n - p - d], axis=1).reshape(-1, 3), cost[order]

    def _all(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.flat:
            return np.zeros(0, dtype=int), np.zeros(0)
        if len(self.flat) > 1:  # keep one array: best() is asked every round of a descent
            self.flat, self.costs = [np.concatenate(self.flat)], [np.concatenate(self.costs)]
        return self.flat[0], self.costs[0]


def _around(points, shape, *args) -> tuple[np.ndarray, np.ndarray]:
    """shape(p, d, *args) around every point, in one pair of arrays (one pricing call: each costs
    the score's fixed work per bin)."""
    parts = [shape(p, d, *args) for p, d in points] or [(np.zeros(0, dtype=int),) * 2]
    return np.concatenate([p for p, _ in parts]), np.concatenate([d for _, d in parts])


def _box(p: int, d: int, r: int, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Splits within r of (P, D) = (p, d) in both, on a lattice of `stride` through it."""
    span = np.arange(-(r // stride) * stride, r + 1, stride)
    return (p + span[:, None] + 0 * span).ravel(), (d + 0 * span[:, None] + span).ravel()


def _lines(p: int, d: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The three lines through (p, d): P fixed, D fixed, and M fixed (P traded for D)."""
    t = np.arange(n + 1)
    return (np.concatenate([np.full_like(t, p), t, t]),
            np.concatenate([t, np.full_like(t, d), p + d - t]))


def within(cur: Split, moves: int, n: int) -> np.ndarray:
    """Every (P, D, M) of n engines that at most `moves` engines leaving their role reach from cur."""
    p, d = _box(cur[0], cur[1], moves)
    out = np.stack([p, d, n - p - d], axis=1)
    out = out[(out >= 0).all(axis=1)]
    return out[np.maximum(np.array(cur) - out, 0).sum(axis=1) <= moves]
