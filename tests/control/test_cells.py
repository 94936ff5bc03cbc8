"""The coordinator's rules (control/cells.py): placement by free slots, and when an engine moves."""

from __future__ import annotations

import pytest

from prorsa.control.cells import CellView, Coordinator, place


def view(cell: int, engines: int, in_flight: int, left_s: float | None = None, first: int = 0) -> CellView:
    names = tuple(f"engine-{first + i}" for i in range(engines))
    return CellView(cell, names, names, 64, in_flight, {n: i for i, n in enumerate(names)}, left_s)


def test_groups_fill_cells_in_proportion_to_their_slots():
    where = place([8] * 12, 2, [3 * 64, 1 * 64])
    assert where.count(0) == 9 and where.count(1) == 3
    assert place([8] * 4, 2, [64, 64]) == [0, 1, 0, 1]  # ties: the lower index first
    with pytest.raises(ValueError):
        place([8], 2, [64])


def test_an_engine_moves_to_the_cell_whose_demand_outgrew_it_and_not_back_at_once():
    c = Coordinator(ratio=1.5, interval_s=30.0)
    move = c.decide(100.0, [view(0, 4, 40), view(1, 4, 4, first=4)])
    assert move is not None and (move.source, move.target) == (1, 0)
    assert move.engine == "engine-4"  # the giver's engine holding the fewest legs
    assert c.decide(110.0, [view(0, 4, 40), view(1, 3, 4, first=4)]) is None  # within interval_s of the last
    assert c.decide(131.0, [view(0, 5, 40), view(1, 3, 4, first=4)]) is not None


def test_no_move_when_balanced_overshooting_or_not_worth_its_price():
    c = Coordinator(ratio=1.5, move_s=30.0, payback=2.0)
    assert c.decide(0.0, [view(0, 4, 32), view(1, 4, 30, first=4)]) is None  # balanced
    assert c.decide(0.0, [view(0, 4, 12), view(1, 4, 8, first=4)]) is None  # 12/5 < 1.5 x 8/3: would overshoot
    assert c.decide(0.0, [view(0, 4, 40, left_s=50.0), view(1, 4, 0, first=4)]) is None  # ends before it pays
    assert c.decide(0.0, [view(0, 4, 40), view(1, 1, 0, first=4)]) is None  # the giver keeps min_engines
    assert c.decide(0.0, [view(0, 4, 40, left_s=61.0), view(1, 4, 0, first=4)]) is not None
