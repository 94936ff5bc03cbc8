"""The split search: plans as pricing every split does, for a fraction of the splits.

The allocator prices every split up to SplitSearch.exact_side engines; past it, a search. Here the
search is forced on at a few dozen engines (exact_side=0, a coarse lattice) and its plans compared
with those of the full table on seeded random states: current roles, busy engines, locks, a goal
being carried out, the switch cap, hysteresis, dense and MoE.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prorsa.control.allocator import Allocator, Capacity, _Movers, count_roles, score, splits
from prorsa.control.forecast import Forecast
from prorsa.control.split_search import SplitSearch, within
from prorsa.costmodel import CostModel
from prorsa.loads import EngineLoad
from prorsa.roles import Role

ROLES = (Role.PREFILL, Role.DECODE, Role.MIXED)
DENSE = Capacity.from_cost(CostModel.from_names("h200", "qwen3-8b"), slots=16)
MOE = Capacity.from_cost(CostModel.from_names("h200", "qwen3-30b-a3b", ep=4), slots=64)
FORCED = SplitSearch(exact_side=0, coarse=6)  # a stride of 2-7 at 10-40 engines
EVERY = SplitSearch(exact_side=10 ** 6)


def random_state(seed: int, n: int, cap: Capacity):
    """Demand in proportion to n, random roles and loads, some engines locked, maybe an anchor."""
    rng = np.random.default_rng(seed)
    scale, bins = n * cap.ranks, 8
    append = float(rng.choice([100, 500, 2000, 8000]))
    turns = rng.uniform(0, 3.0, bins) * scale * rng.uniform(0, 1)
    seqs = rng.uniform(0, 16, bins) * scale
    backlog = float(rng.integers(0, 50)) * scale
    fc = Forecast(start_s=0.0, bin_s=0.5, prefill_tokens_per_s=turns * append, prefill_turns_per_s=turns,
                  decode_seqs=seqs, kv_tokens=seqs * float(rng.choice([2000, 8000, 20000])),
                  backlog_tokens=backlog * append, backlog_turns=backlog,
                  prefill_prefix_tokens=float(rng.choice([0, 4000, 16000])),
                  decode_tokens_per_turn=float(rng.choice([100, 300, 800])),
                  decode_tps_per_seq=float(rng.uniform(20, 100)), decode_remaining_tokens=float(rng.uniform(10, 400)))
    roles = [ROLES[k] for k in rng.choice(3, n, p=rng.dirichlet([1, 1, 1]))]
    engines = [EngineLoad(f"e{i}", r, int(rng.integers(0, 3)), int(rng.integers(0, 16)),
                          int(rng.integers(0, 80000)), 700000) for i, r in enumerate(roles)]
    locked = {e.engine_id for e in engines if rng.random() < rng.choice([0.0, 0.3])}
    anchor = None
    if rng.random() < 0.3:
        p = int(rng.integers(0, n))
        d = int(rng.integers(0, n - p + 1))
        anchor = (p, d, n - p - d)
    return fc, engines, locked, anchor


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(10, 40), moe=st.booleans(),
       cap=st.integers(1, 3), hysteresis=st.sampled_from([0.0, 1.0, 2.0]), min_gain=st.sampled_from([0.05, 0.15]))
def test_the_search_plans_as_every_split_does(seed, n, moe, cap, hysteresis, min_gain):
    capacity = MOE if moe else DENSE
    fc, engines, locked, anchor = random_state(seed, n, capacity)
    kw = dict(hysteresis=hysteresis, max_switches_per_interval=cap, min_gain=min_gain)
    searched = Allocator(capacity, search=FORCED, **kw).plan(fc, engines, locked, anchor)
    every = Allocator(capacity, search=EVERY, **kw).plan(fc, engines, locked, anchor)
    assert searched == every


def test_the_default_prices_every_split_of_a_few_engines_and_few_of_many():
    """Up to 128 engines the table is the one plan() always priced; at 512 the search prices a
    few percent of it and plans the same on a seeded state."""
    priced = []

    def counting(c: np.ndarray) -> np.ndarray:
        priced.append(len(c))
        return score(DENSE, fc, c[:, 0], c[:, 1], c[:, 2])

    fc, _, _, _ = random_state(3, 128, DENSE)
    cands, costs = SplitSearch().priced(counting, 128)
    assert (cands == splits(128)).all() and len(costs) == len(splits(128))
    priced.clear()
    fc, engines, locked, anchor = random_state(5, 512, DENSE)
    cands, _ = SplitSearch().priced(counting, 512, seeds=[count_roles([e.role for e in engines])])
    assert sum(priced) < 0.05 * len(splits(512)) and len(cands) == sum(priced)  # each priced once
    assert Allocator(DENSE).plan(fc, engines, locked, anchor) == Allocator(DENSE, search=EVERY).plan(
        fc, engines, locked, anchor)


def test_a_splits_cost_does_not_depend_on_the_splits_priced_beside_it():
    """The search prices splits in batches of its own; the DP-attention fixed point must then
    settle each split alone, or tied splits could order differently than in the full table."""
    fc, _, _, _ = random_state(11, 24, MOE)
    table = splits(24)
    full = score(MOE, fc, table[:, 0], table[:, 1], table[:, 2])
    for part in (table[::7], table[-5:], table[3:4]):
        rows = [int(np.flatnonzero((table == r).all(1))[0]) for r in part]
        assert (score(MOE, fc, part[:, 0], part[:, 1], part[:, 2]) == full[rows]).all()


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(2, 30))
def test_the_slowest_move_is_the_slowest_of_the_moves_listed(seed, n):
    fc, engines, locked, _ = random_state(seed, n, DENSE)
    movers = _Movers(DENSE, engines, locked, fc.decode_remaining_tokens)
    cur, movable = count_roles([e.role for e in engines]), movers.counts()
    for goal in map(tuple, splits(n)):
        if goal != cur and all(c - g <= m for c, g, m in zip(cur, goal, movable)):
            assert movers.slowest(cur, goal) == max(movers.moves(cur, goal)[1])


@pytest.mark.parametrize("cur,moves", [((3, 4, 5), 1), ((0, 0, 12), 2), ((12, 0, 0), 3), ((2, 2, 8), 0)])
def test_within_lists_every_split_the_cap_reaches(cur, moves):
    n = sum(cur)
    every = {tuple(s) for s in np.array([(p, d, n - p - d) for p in range(n + 1) for d in range(n + 1 - p)])
             if np.maximum(np.array(cur) - s, 0).sum() <= moves}
    got = [tuple(int(x) for x in s) for s in within(cur, moves, n)]
    assert len(got) == len(set(got)) and set(got) == every
