"""Splits over engine groups: each group's engines priced as themselves, the search, the plan.

Demand is a steady Forecast (tests/control/test_allocator.py's), so the right counts follow from
the cost model: with no prefill to serve, the one engine that must serve prefill is best taken
from where it holds the fewest decode slots, which the slots alone decide.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from prorsa.control.allocator import Capacity, score, splits
from prorsa.control.group_search import (Group, GroupAllocator, group_counts, group_roles, group_splits,
                                         score_groups)
from prorsa.costmodel import CostModel
from prorsa.loads import EngineLoad
from prorsa.roles import Role
from tests.control.test_allocator import demand, dense, moe  # noqa: F401 (fixtures)

P, D, M = Role.PREFILL, Role.DECODE, Role.MIXED
ALL = (P, D, M)


FORECASTS = [demand(append=600, turns_per_s=20, seqs=60), demand(append=4000, turns_per_s=5, seqs=30, backlog_turns=10),
             demand(append=300, turns_per_s=2, seqs=120, ctx=20000)]


@pytest.mark.parametrize("fc", FORECASTS)
def test_one_group_is_priced_as_engines_alike(dense, moe, fc):
    for cap in (dense, moe):
        c = splits(8)
        want = score(cap, fc, c[:, 0], c[:, 1], c[:, 2])
        got = score_groups([Group(8, ALL, cap)], fc, c[:, None, :])
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("fc", FORECASTS)
def test_two_groups_alike_are_priced_as_their_sum(dense, fc):
    """Two groups of the same engines: a split's price is the price of its totals on one group."""
    both = group_splits([Group(3, ALL, dense), Group(5, ALL, dense)])
    tot = both.sum(axis=1)
    np.testing.assert_allclose(score_groups([Group(3, ALL, dense), Group(5, ALL, dense)], fc, both),
                               score(dense, fc, tot[:, 0], tot[:, 1], tot[:, 2]), rtol=1e-9)


def test_each_group_is_priced_by_its_own_slots(dense):
    """100 sequences decoding and nothing to prefill: one engine must still serve prefill. Taken
    from the 64-slot group, 16 + 16 + 64 = 96 slots hold 4 sequences too few; from a 16-slot
    group, 16 + 128 = 144 hold all. So the answer is one prefill engine among the small ones, the
    rest decoding; a price that gave every engine the first group's slots could not tell."""
    wide = replace(dense, slots=64)
    groups = [Group(2, (P, D), dense), Group(2, (P, D), wide)]
    fc = demand(append=0.0, turns_per_s=0.0, seqs=100, ctx=2048)
    cands = group_splits(groups)
    costs = score_groups(groups, fc, cands)
    best = tuple(map(tuple, cands[int(np.argmin(costs))]))
    assert best == ((1, 1, 0), (0, 2, 0))
    # and the two choices of where the prefill engine stands are priced apart by the 4 waiting
    at = {tuple(map(tuple, c)): v for c, v in zip(cands, costs)}
    assert at[(0, 2, 0), (1, 1, 0)] > at[(1, 1, 0), (0, 2, 0)] + 4 * fc.bin_s * fc.n_bins * 0.9


def test_splits_keep_to_each_groups_roles(dense, moe):
    groups = [Group(3, (P,), dense), Group(2, (D, M), moe), Group(1, (M, P), dense)]
    cands = group_splits(groups)
    assert len(cands) == 1 * 3 * 2  # the prefill group has one split, the others 3 and 2
    assert (cands[:, 0, 1:] == 0).all() and (cands[:, 1, 0] == 0).all() and (cands[:, 2, 1] == 0).all()


def test_the_descent_finds_what_pricing_every_split_finds(dense, moe):
    groups = [Group(4, ALL, dense), Group(3, (P, M), dense), Group(2, (D, M), moe)]
    for fc in FORECASTS:
        price = lambda c: score_groups(groups, fc, c)  # noqa: E731
        every = GroupAllocator(groups)
        assert every._all is not None
        cands, costs = every.priced(price)
        descent = GroupAllocator(groups, exact=0)
        start = ((0, 0, 4), (0, 0, 3), (0, 0, 2))
        sub, sub_costs = descent.priced(price, starts=(start,))
        assert len(sub) < len(cands)
        assert float(sub_costs.min()) == pytest.approx(float(costs.min()), rel=1e-9)


def _loads(roles, active=4, kv=30000, cap=700000):
    return [EngineLoad(f"engine-{i}", r, 0, active, kv, cap) for i, r in enumerate(roles)]


def test_a_plan_moves_within_each_groups_roles_and_the_cap(dense, moe):
    groups = [Group(2, (P, M), dense), Group(2, (D, M), moe)]
    # a heavy prefill load: the small engines should prefill, not decode
    fc = demand(append=4000, turns_per_s=40, seqs=40, backlog_turns=20)
    alloc = GroupAllocator(groups, hysteresis=0.0, min_gain=0.0)
    roles = [M, M, M, M]
    plan = alloc.plan(fc, _loads(roles))
    assert plan.current == ((0, 0, 2), (0, 0, 2)) and len(plan.targets) == 1
    allowed = {f"engine-{i}": set(g.roles) for i, g in enumerate(g for g in groups for _ in range(g.count))}
    assert all(role in allowed[e] for e, role in plan.targets.items())
    assert plan.goal != plan.current and plan.summary().goal_prefill == sum(s[0] for s in plan.goal)


def test_roles_and_counts_round_trip(dense):
    groups = [Group(2, ALL, dense), Group(3, ALL, dense)]
    split = ((1, 0, 1), (0, 2, 1))
    assert group_roles(groups, split) == [P, M, D, D, M]
    assert group_counts(groups, group_roles(groups, split)) == split
