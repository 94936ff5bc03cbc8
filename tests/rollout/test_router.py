from pathlib import Path

import pytest

from prorsa.roles import Role
from prorsa.rollout.router import Router

REPO = Path(__file__).resolve().parents[2]


def roles(p, d, m=0):
    names = [f"engine-{i}" for i in range(p + d + m)]
    return dict(zip(names, [Role.PREFILL] * p + [Role.DECODE] * d + [Role.MIXED] * m))


def test_disaggregated_route_uses_role_pools():
    r = Router(roles(2, 1))
    route = r.route("t0")
    assert route.prefill in ("engine-0", "engine-1") and route.decode == "engine-2"


def test_sticky_unless_overloaded():
    r = Router(roles(2, 1), overload=2.0)
    first = r.route("t0")
    r.finished(first)
    again = r.route("t0")
    assert again.prefill == first.prefill  # prefix stays where it is cached
    # pile load on t0's prefill engine: stickiness gives way
    for i in range(5):
        r.load[first.prefill] += 1
    r.finished(again)
    moved = r.route("t0")
    assert moved.prefill != first.prefill


def test_a_turn_stays_at_overload_times_the_least_load_and_leaves_past_it():
    """Ratio rule 2 (the router's default), the other engine idle (its load taken as 1): two turns
    ahead of it on its engine keep it there, three send it to the idle one."""
    for ahead, stays in ((2, True), (3, False)):
        r = Router(roles(0, 0, 2))
        first = r.route("t0", colocated=True)
        r.finished(first)
        r.load[first.decode] += ahead
        assert (r.route("t0", colocated=True).decode == first.decode) is stays, ahead


def test_with_no_overload_a_turn_stays_on_its_engines_however_busy_they_are():
    r = Router(roles(2, 2), overload=None)  # runtime.sticky_overload: null
    first = r.route("t0")
    r.finished(first)
    for engine in (first.prefill, first.decode):
        r.load[engine] += 50
    again = r.route("t0")
    assert (again.prefill, again.decode) == (first.prefill, first.decode)
    r.set_role(first.prefill, Role.DECODE)  # its engine no longer serves the leg: it leaves then
    assert r.route("t0").prefill != first.prefill
    assert r.route("t1").decode not in (first.prefill, first.decode)  # a new one goes to the least loaded


def test_load_balances_new_trajectories():
    r = Router(roles(2, 2))
    routes = [r.route(f"t{i}") for i in range(4)]
    assert {x.prefill for x in routes} == {"engine-0", "engine-1"}
    assert {x.decode for x in routes} == {"engine-2", "engine-3"}


def test_colocated_has_no_prefill_leg():
    r = Router(roles(0, 0, 3))
    route = r.route("t0")
    assert route.prefill is None and route.decode.startswith("engine-")


def test_role_change_redirects_new_turns():
    r = Router(roles(1, 2))
    r.set_role("engine-1", Role.PREFILL)
    routes = [r.route(f"t{i}") for i in range(4)]
    assert all(x.decode == "engine-2" for x in routes)


def test_small_append_is_prefilled_on_the_decode_engine_holding_the_context():
    r = Router(roles(2, 2), local_prefill_tokens=64)
    first = r.route("t0")  # turn 0: nothing cached anywhere yet, a normal disaggregated turn
    assert first.prefill is not None and not first.local_prefill
    r.finished(first)
    small = r.route("t0", appended=40)
    assert small == type(small)(prefill=None, decode=first.decode, local_prefill=True)
    assert r.load[first.decode] == 1 and sum(r.load.values()) == 1  # one engine busy, not two
    r.finished(small)
    big = r.route("t0", appended=65)  # over the threshold: prefill engine plus KV transfer
    assert big.prefill is not None and not big.local_prefill
    r.finished(big)


def test_decode_local_prefill_gives_way_when_the_holder_moved_or_is_busy():
    r = Router(roles(1, 2), local_prefill_tokens=64)
    first = r.route("t0")
    r.finished(first)
    r.set_role(first.decode, Role.PREFILL)  # the holder stopped serving decodes
    moved = r.route("t0", appended=10)
    assert moved.prefill is not None and moved.decode != first.decode and not moved.local_prefill
    r.finished(moved)
    r.set_role(first.decode, Role.DECODE)
    r.load[moved.decode] += 5  # holder overloaded: stickiness and locality give way
    busy = r.route("t0", appended=10)
    assert busy.prefill is not None and busy.decode != moved.decode
    assert r.load[moved.decode] == 5  # the abandoned pick was not counted


def test_decode_local_off_by_default():
    r = Router(roles(1, 1))
    r.finished(r.route("t0"))
    assert r.route("t0", appended=1).prefill is not None


def test_prefill_engines_first_mixed_engines_take_the_overflow():
    """With prefill engines holding `slots` turns each, a turn decoding on a mixed engine runs
    whole there; until then its prefill goes to a prefill engine like everyone's."""
    r = Router(roles(1, 0, 3), slots=2)
    first = [r.route(f"t{i}") for i in range(2)]
    assert all(x.prefill == "engine-0" for x in first)
    over = r.route("t9")
    assert over.prefill is None and r.roles[over.decode] is Role.MIXED
    r.finished(first[0])  # room again on the prefill engine
    assert r.route("t8").prefill == "engine-0"
    # a turn decoding on a DECODE engine waits for a prefill engine rather than overflow
    r2 = Router(roles(1, 1), slots=1)
    routes = [r2.route(f"t{i}") for i in range(3)]
    assert all(x.prefill == "engine-0" and x.decode == "engine-1" for x in routes)


def test_a_closed_engine_gets_no_new_work_until_reopened():
    r = Router(roles(1, 1, 1))
    r.close("engine-2")
    assert all("engine-2" not in (x.prefill, x.decode) for x in (r.route(f"t{i}") for i in range(6)))
    r.reopen("engine-2")
    assert any(x.decode == "engine-2" for x in (r.route(f"u{i}") for i in range(6)))


def test_with_no_prefill_engine_the_mixed_engines_prefill_for_the_decode_engines():
    """P0 D1 M2: the decode engine gets turns (it would idle), their prefills run on the mixed
    engines and ship the KV; a turn decoding on a mixed engine runs whole there."""
    r = Router(roles(0, 1, 2))
    routes = [r.route(f"t{i}") for i in range(6)]
    on_d = [x for x in routes if x.decode == "engine-0"]
    on_m = [x for x in routes if x.decode != "engine-0"]
    assert on_d and on_m
    assert all(r.roles[x.prefill] is Role.MIXED for x in on_d)
    assert all(x.prefill is None for x in on_m)
    assert {x.prefill for x in on_d} | {x.decode for x in on_m} == {"engine-1", "engine-2"}
    # all mixed, or only decode engines: every turn whole on one engine, as before
    assert all(x.prefill is None for x in (Router(roles(0, 0, 2)).route(f"t{i}") for i in range(4)))


# -- runtime.sticky_overload: cost ---------------------------------------------------------------

def _priced(p=0, d=0, m=2, slots=8, decode_tokens=256.0, clock=lambda: 0.0):
    from prorsa.costmodel import CostModel
    from prorsa.rollout.placement import MoveCost

    price = MoveCost(CostModel.from_names("h200", "qwen3-8b"), slots, decode_tokens)
    return Router(roles(p, d, m), overload="cost", slots=slots, move_cost=price, clock=clock), price


def test_the_cost_rule_keeps_a_long_context_on_its_busy_engine_where_the_ratio_rule_moves_it():
    """Three times the least-loaded engine's turns, all admitted (under the slots): the move
    would recompute 32k tokens to save a slightly smaller batch. The ratio rule moves it anyway."""
    for overload, stays in ((2.0, False), ("cost", True)):
        r, _ = _priced() if overload == "cost" else (Router(roles(0, 0, 2), overload=2.0, slots=8), None)
        first = r.route("t0")
        r.finished(first)
        r.load[first.decode] += 6
        r.load[next(e for e in r.roles if e != first.decode)] += 2
        again = r.route("t0", appended=512, context=32768)
        assert (again.decode == first.decode) is stays, overload


def test_the_cost_rule_moves_a_short_context_off_an_engine_with_a_queue():
    """Slots full and three waves queued: the wait is three decodes, the move recomputes 300 tokens."""
    r, price = _priced()
    first = r.route("t0")
    r.finished(first)
    other = next(e for e in r.roles if e != first.decode)
    r.load[first.decode] += 4 * 8
    moved = r.route("t0", appended=100, context=300)
    assert moved.decode == other
    assert price.wait_s("whole", 32, 0, 0) > price.move_s("whole", 300, 100, stalled=0)
    assert r.backlog(other) == 400  # the moved turn prefills its whole context there


def test_the_cost_rule_weighs_the_stall_a_recompute_puts_on_co_batched_decodes():
    """The same queue to escape; the engine it would move to decodes 7 turns that a 16k recompute
    would stall: staying is cheaper. With that engine idle, the move pays."""
    for busy_other, stays in ((7, True), (0, False)):
        r, _ = _priced()
        first = r.route("t0")
        r.finished(first)
        r.load[first.decode] += 10  # two past the slots: a short queue
        r.load[next(e for e in r.roles if e != first.decode)] += busy_other
        again = r.route("t0", appended=256, context=16384)
        assert (again.decode == first.decode) is stays, busy_other


def test_the_cost_rule_counts_a_prefill_engines_backlog_and_drains_it_with_time():
    """Disaggregated: a 200k-token prompt lands on t0's prefill engine just before t0's next turn,
    which then waits seconds there, where recomputing 2k tokens elsewhere costs far less. Ten
    seconds on, that backlog is prefilled (a fluid queue at the engine's rate) and the turn stays.
    A decode leg moves for its queue only: shipping the whole context costs a KV pull, not a recompute."""
    for later, stays in ((0.0, False), (10.0, True)):
        now = [0.0]
        r, price = _priced(p=2, d=1, m=0, clock=lambda: now[0])
        first = r.route("t0")
        r.finished(first)
        assert r.route("big", appended=200_000).prefill == first.prefill  # the least loaded, by order
        now[0] = later
        again = r.route("t0", appended=256, context=2048)
        assert (again.prefill == first.prefill) is stays, later
    assert price.wait_s("prefill", 1, 200_000, 0) > price.move_s("prefill", 2048, 256)
    assert 200_000 / price.prefill_rate < 10.0
    assert price.move_s("decode", 2048, 256) < price.move_s("prefill", 2048, 256)


def test_move_prices_grow_with_the_context_and_the_wait_with_the_queue():
    _, price = _priced()
    assert price.move_s("whole", 0, 500) == 0.0  # nothing cached: nothing to lose
    assert 0 < price.move_s("whole", 4096, 256) < price.move_s("whole", 32768, 256)
    assert price.move_s("whole", 4096, 256, stalled=7) == pytest.approx(8 * price.move_s("whole", 4096, 256))
    assert price.wait_s("whole", 0, 0, 0) == 0.0  # an idle engine makes nobody wait
    waits = [price.wait_s("whole", load, 0, load * 4096) for load in (0, 4, 7, 8, 16, 24)]
    assert waits == sorted(waits) and waits[-1] > 2 * waits[3]  # full batches ahead: whole decodes
    assert price.wait_s("decode", 4, 10**6, 4 * 4096) == price.wait_s("decode", 4, 0, 4 * 4096)


def test_an_engine_full_of_kv_makes_a_turn_wait_below_its_slots():
    """At 60k-token contexts an H200 holds about a dozen Qwen3-8B sequences, far fewer than its
    64 slots: past that the next one queues (for the first of them to end), which costs it more
    than one more sequence in the batch costs below the limit."""
    _, price = _priced(slots=64)
    ctx = 60_000
    admits = price.cost.kv_capacity_tokens() // ctx
    assert 8 <= admits < 64
    waits = {n: price.wait_s("whole", n, 0, n * ctx) for n in (admits - 2, admits - 1, admits)}
    below = waits[admits - 1] - waits[admits - 2]
    assert waits[admits] - waits[admits - 1] > 1.2 * below


def test_sticky_overload_cost_needs_a_cost_model():
    with pytest.raises(ValueError, match="move_cost"):
        Router(roles(0, 0, 2), overload="cost")
    _, price = _priced()
    for given in ({"move_cost": price}, {"clock": lambda: 0.0}):  # each of the two is not enough alone
        with pytest.raises(ValueError, match="move_cost"):
            Router(roles(0, 0, 2), overload="cost", **given)


def test_a_pipeline_with_sticky_overload_cost_routes_by_the_cost_rule():
    from prorsa.rollout.context import load_run, make_router

    run = load_run(REPO / "pipelines" / "swe.yaml", {"runtime.sticky_overload": "cost"})
    router = make_router(run, roles(0, 0, 2), clock=lambda: 0.0)
    assert router.move_cost is not None and router.move_cost.slots == run.cfg.engines.slots
    run = load_run(REPO / "pipelines" / "swe.yaml", {"runtime.sticky_overload": None})
    assert make_router(run, roles(0, 0, 2), clock=lambda: 0.0).move_cost is None


def test_the_cost_rule_books_a_turns_kv_on_its_decode_engine_and_finished_gives_it_back():
    """A turn holds its context, its append and the mean decode (256 here) on its decode engine by
    the end of its decode; the cost rule counts that much there while the turn is in flight."""
    r, _ = _priced()
    a = r.route("a", appended=100, context=1000)
    b = r.route("b")  # a first turn with nothing said: no context, no append, the decode alone
    assert (a.kv, b.kv) == (1000 + 100 + 256, 256)
    assert r._kv == {a.decode: 1356, b.decode: 256} and a.decode != b.decode
    r.finished(a)
    assert r._kv == {a.decode: 0, b.decode: 256}
    r.finished(b)
    assert r._kv == {a.decode: 0, b.decode: 0}


def test_a_turn_that_stays_after_a_scan_still_prefills_locally():
    """Ratio rule 2: t0's decode engine carries 3 turns, the other 2. That is over twice the
    lower bound the router keeps of the least load (0, taken as 1), so it scans, and finds 3 within
    twice the least load: t0 stays, and its small append is prefilled where its context is."""
    r = Router(roles(1, 2), local_prefill_tokens=64)
    first = r.route("t0")
    r.finished(first)
    other = next(e for e in ("engine-1", "engine-2") if e != first.decode)
    r.load[first.decode] += 3
    r.load[other] += 2
    again = r.route("t0", appended=10)
    assert again == type(again)(prefill=None, decode=first.decode, local_prefill=True)


# -- scheduling.migrate: Router.relocate ---------------------------------------------------------

def test_relocate_moves_a_trajectory_off_a_queued_engine_to_an_idle_one_for_free():
    """Its engine holds two waves past its slots; the other is idle, so the warm-up there stalls
    nothing: the next turn goes there, its context booked as that engine's prefill backlog."""
    r, price = _priced()
    route = r.route("t0")
    other = next(e for e in r.roles if e != route.decode)
    r.load[route.decode] += 3 * 8
    assert r.relocate("t0", route, context=16384, remaining=2000.0) == other
    assert r.backlog(other) == 16384
    r.finished(route)
    again = r.route("t0", appended=256, context=16384)
    assert again.decode == other  # sticky now: the context is cached there


def test_relocate_charges_the_warm_up_to_every_turn_the_other_engine_holds():
    """The same queue to escape. Where the other engine holds 7 turns, a 16k-token prefill in
    their batch costs them more than the wait it saves (a 2k context costs less and moves); the
    price is the recompute times the turns it stalls, not counting the trajectory's own."""
    for context, moves in ((16384, False), (2048, True)):
        r, price = _priced()
        route = r.route("t0")
        other = next(e for e in r.roles if e != route.decode)
        r.load[route.decode] += 10
        r.load[other] += 7
        stay = price.wait_s("whole", r.load[route.decode] - 1, 0, 0)
        go = price.wait_s("whole", 7, 0, 0) + price.move_s("whole", context, 0) * 7
        assert (go < stay) is moves
        assert (r.relocate("t0", route, context=context, remaining=5000.0) == other) is moves, context


def test_relocate_prices_one_turn_and_less_for_a_trajectory_near_its_end():
    """The wait is priced for the next turn (a mean turn's decode) or what the trajectory has left,
    whichever is less: with 10 tokens left a 4k move saves almost nothing; a mean turn ahead pays
    for it. A 32k context is not worth moving for one turn, however long the trajectory: its
    remainder would pay, but the loads it is priced on last about a turn."""
    moved = {}
    for context, remaining in ((4096, 10.0), (4096, 256.0), (4096, 1e6), (32768, 256.0), (32768, 1e6)):
        r, _ = _priced()
        route = r.route("t0")
        other = next(e for e in r.roles if e != route.decode)
        r.load[route.decode] += 12
        r.load[other] += 1
        moved[context, remaining] = r.relocate("t0", route, context=context, remaining=remaining) == other
    assert moved == {(4096, 10.0): False, (4096, 256.0): True, (4096, 1e6): True,
                     (32768, 256.0): False, (32768, 1e6): False}


def test_relocate_stays_without_the_cost_rule_for_local_prefill_and_on_balanced_engines():
    r = Router(roles(0, 0, 2), slots=8)
    assert r.relocate("t0", r.route("t0"), context=4096, remaining=100.0) is None  # no cost model
    r, _ = _priced()
    route = r.route("t0")
    for e in r.roles:
        r.load[e] += 12
    assert r.relocate("t0", route, context=4096, remaining=1000.0) is None  # no engine is better
    r, _ = _priced(p=0, d=2, m=0)
    assert r.relocate("t0", r.route("t0"), context=0, remaining=1000.0) is None  # nothing cached to move


def test_relocate_moves_a_prefill_engines_trajectory_to_one_without_a_backlog():
    """Disaggregated: t0's context is cached on its prefill engine, which has 400k tokens queued;
    the other prefill engine is idle. The next turn's prefill goes there."""
    r, _ = _priced(p=2, d=1, m=0)
    route = r.route("t0")
    other = next(e for e in r.roles if r.roles[e] is Role.PREFILL and e != route.prefill)
    r._backlog[route.prefill] = 400_000
    assert r.relocate("t0", route, context=8192, remaining=1000.0) == other
    r.finished(route)
    assert r.route("t0", appended=256, context=8192).prefill == other


def test_relocate_leaves_a_trajectory_alone_on_its_engine_where_it_is():
    """Its turn is the only one there: once it ends its engine is idle, and a move cannot beat an
    idle engine, even to another idle one."""
    r, _ = _priced()
    route = r.route("t0")
    assert r.load[route.decode] == 1
    assert r.relocate("t0", route, context=4096, remaining=1000.0) is None


def test_relocate_prices_staying_without_the_trajectorys_own_kv():
    """t0 holds 60k tokens of KV on its engine beside one small turn; the other engine holds one
    small turn too. Once t0's turn ends its engine is as busy as the other, which would also take
    the warm-up: it stays. Counted with its own KV, staying would look 0.5 s dearer and it would go."""
    now = [0.0]
    r, price = _priced(clock=lambda: now[0])
    route = r.route("t0", appended=256, context=60_000)
    others = [r.route(t, appended=256, context=1000) for t in ("a", "b")]
    assert route.decode == others[1].decode != others[0].decode
    now[0] = 10.0  # every backlog prefilled
    small = others[0].kv
    assert price.wait_s("whole", 1, 0, small + route.kv) - price.wait_s("whole", 1, 0, small) > 0.5
    assert price.move_s("whole", 2048, 0) < 0.1
    assert r.relocate("t0", route, context=2048, remaining=256.0) is None


def test_relocate_stays_where_the_engine_changed_role_or_there_is_no_context():
    """t0's engine became a prefill engine, with 9 other turns still on it: its next turn goes
    where the router sends it, not to an engine warmed now. Nor is a trajectory with no context
    warmed anywhere, however queued its engine."""
    r, _ = _priced(m=3)
    route = r.route("t0")
    r.load[route.decode] += 9
    r.set_role(route.decode, Role.PREFILL)
    assert r.relocate("t0", route, context=4096, remaining=1000.0) is None
    r, _ = _priced()
    route = r.route("t0")
    r.load[route.decode] += 3 * 8
    assert r.relocate("t0", route, context=0, remaining=1000.0) is None


def test_relocate_prices_the_warm_up_as_the_context_alone():
    """The warm-up prefills the context the trajectory holds; its next turn's append is not known
    yet and is not part of it."""
    from prorsa.costmodel import CostModel
    from prorsa.rollout.placement import MoveCost

    class Asked(MoveCost):
        def move_s(self, leg, context, appended, stalled=0):
            self.asked.append((leg, context, appended))
            return super().move_s(leg, context, appended, stalled)

    price = Asked(CostModel.from_names("h200", "qwen3-8b"), 8, 256.0)
    price.asked = []
    r = Router(roles(0, 0, 2), overload="cost", slots=8, move_cost=price, clock=lambda: 0.0)
    route = r.route("t0")
    r.load[route.decode] += 3 * 8
    assert r.relocate("t0", route, context=16384, remaining=2000.0) is not None
    assert price.asked == [("whole", 16384, 0)]


def test_relocate_charges_a_prefill_engines_warm_up_to_the_prefill_behind_it():
    """Disaggregated: t0's prefill engine has 4k tokens queued (0.11 s), the other none. Warming
    8k tokens there delays the next prefill behind it by 0.23 s: t0 stays. 400k queued, it goes."""
    for queued, moves in ((4000, False), (400_000, True)):
        r, price = _priced(p=2, d=1, m=0)
        route = r.route("t0")
        r._backlog[route.prefill] = queued
        assert (price.wait_s("prefill", 1, queued, 0) > price.move_s("prefill", 8192, 0)) is moves
        assert (r.relocate("t0", route, context=8192, remaining=1000.0) is not None) is moves, queued


def test_the_priors_mean_decode_starts_the_cost_rules_mean_and_the_runs_decodes_take_over():
    """A pipeline's `prior:` is where the move cost's mean decode starts; every decode that ends
    is one observation against the prior's 8 (MoveCost.prior_weight), so the run's own decodes
    outweigh it after 8 and it fades from there. Without a prior the forecaster's default starts it."""
    from prorsa.control.forecast_stats import Priors
    from prorsa.rollout.context import load_run, make_router

    over = {"runtime.sticky_overload": "cost"}
    plain = make_router(load_run(REPO / "pipelines" / "swe.yaml", over), roles(0, 0, 2), clock=lambda: 0.0)
    assert plain.move_cost.decode_tokens == Priors().decode_tokens == 400.0
    prior = {"prompt_tokens": 2000, "observation_tokens": 1000, "decode_tokens": 300, "tool_s": 1.0, "turns": 10}
    router = make_router(load_run(REPO / "pipelines" / "swe.yaml", over | {"prior": prior}), roles(0, 0, 2),
                         clock=lambda: 0.0)
    price = router.move_cost
    assert price.decode_tokens == 300.0  # the prior alone: its mean
    for tokens in (500, 700):
        router.decoded(tokens)
    assert price.decode_tokens == pytest.approx((8 * 300 + 500 + 700) / 10)  # 360
    for _ in range(8):
        router.decoded(600)
    assert price.decode_tokens == pytest.approx((8 * 300 + 1200 + 8 * 600) / 18)  # 466.7: past the prior's half


def test_an_engine_that_leaves_gets_no_turn_and_one_that_joins_does():
    """Cells: an engine moved to another cell leaves this router; its trajectories' next turns go
    to the engines left, and a turn it held that ends afterwards is not counted against anyone."""
    r = Router({"p0": Role.PREFILL, "d0": Role.DECODE, "d1": Role.DECODE})
    held = r.route("t0")
    r.close(held.decode)
    r.leave(held.decode)
    r.finished(held)  # ended after the engine left: nothing to uncount there
    stay = "d1" if held.decode == "d0" else "d0"
    assert {r.route(f"t{i}").decode for i in range(4)} == {stay}
    r.join("d9", Role.DECODE)
    assert "d9" in {r.route(f"n{i}").decode for i in range(4)}
    assert held.decode not in r.load and r.load["p0"] == 8


def test_a_reserved_trajectory_runs_on_its_engine_and_no_other_trajectory_goes_there():
    r = Router(roles(0, 0, 4), overload=2.0)
    # t0 starts on engine-0, then is reserved engine-3: it moves there at its next turn, however
    # loaded, and every other trajectory (new ones, and ones sticky to engine-3) keeps off it
    first = {t: r.route(t, colocated=True) for t in ("t0", "t1", "t2", "t3")}
    assert [first[t].decode for t in ("t0", "t3")] == ["engine-0", "engine-3"]
    for route in first.values():
        r.finished(route)
    r.reserve({"t0": "engine-3"})
    r.load["engine-3"] += 10  # beyond what the ratio rule would stay for
    assert r.route("t0", colocated=True).decode == "engine-3"
    assert r.route("t3", colocated=True).decode != "engine-3"
    assert {r.route(f"n{i}", colocated=True).decode for i in range(9)} == {"engine-0", "engine-1", "engine-2"}
    # a role change rebuilds the pools: the reservation holds in the new ones, and after its
    # trajectory ended the engine stays its (a reservation is for the step)
    r.set_role("engine-1", Role.MIXED)
    r.forget("t0")
    assert "engine-3" not in {r.route(f"m{i}", colocated=True).decode for i in range(9)}


def test_a_pinned_trajectory_runs_its_next_turn_on_the_engine_it_was_pinned_to():
    r = Router(roles(0, 0, 4), overload=2.0)
    r.finished(r.route("t0", colocated=True))
    r.pin("t0", "engine-3")  # not its engine, and no emptier than the others
    assert r.route("t0", colocated=True).decode == "engine-3"


def test_no_other_trajectory_goes_to_a_reserved_engine_however_idle_it_is():
    r = Router(roles(0, 0, 3), overload=2.0)
    r.reserve({"t0": "engine-0"})
    assert [r.route(f"n{i}", colocated=True).decode for i in range(4)] == ["engine-1", "engine-2"] * 2
    assert r.route("t0", colocated=True).decode == "engine-0"


def test_an_engine_that_leaves_and_rejoins_holds_no_trajectory_and_empty_books():
    """Its prefix cache went with it: a trajectory that ran there goes to the least loaded engine
    when it comes back, and the trajectories of the other engines keep theirs. It rejoins with no
    turn in flight, and for the cost rule no prefill backlog and no KV."""
    r = Router(roles(0, 0, 3), overload=2.0)
    for route in [r.route(t, colocated=True) for t in ("t0", "t1", "t2")]:  # engine-0, engine-1, engine-2
        r.finished(route)
    r.load["engine-1"] += 1  # t1's engine holds a turn: within the ratio, t1 stays there
    r.close("engine-2")
    r.leave("engine-2")
    r.join("engine-2", Role.MIXED)
    assert r.load["engine-2"] == 0
    assert r.route("t2", colocated=True).decode == "engine-0"  # the least loaded, by engine order
    assert r.route("t1", colocated=True).decode == "engine-1"

    r, _ = _priced(m=3)  # the clock stays at 0: nothing is prefilled meanwhile
    for route in [r.route(t, appended=1000) for t in ("t0", "t1", "t2")]:
        r.finished(route)
    assert r.backlog("engine-2") == 1000
    r.close("engine-2")
    r.leave("engine-2")
    r.join("engine-2", Role.MIXED)
    assert (r.load["engine-2"], r.backlog("engine-2"), r._kv["engine-2"]) == (0, 0.0, 0)


# -- engines of their own sizes (engines.groups): load as a share of each engine's slots ----------

def _sized(**kw) -> Router:
    return Router({"wide": Role.MIXED, "narrow": Role.MIXED}, overload=2.0, slots={"wide": 256, "narrow": 32}, **kw)


def test_a_new_trajectory_goes_to_the_engine_whose_load_is_the_least_share_of_its_slots():
    r = _sized()
    r.load["wide"], r.load["narrow"] = 32, 16  # an eighth of its slots, and half
    assert r.route("t0", colocated=True).decode == "wide"
    r.load["wide"] = 160  # 0.625
    assert r.route("t1", colocated=True).decode == "narrow"


def test_on_engines_of_their_own_sizes_a_turn_stays_within_overload_times_the_least_share():
    """Ratio rule 2 on shares: t0's narrow engine a quarter full stays against a wide one an
    eighth full, a turn more and it leaves. An empty engine counts as holding one turn: a
    sticky engine may hold up to two turns' share of the empty engine's slots."""
    for narrow, stays in ((8, True), (9, False)):
        r = _sized()
        r.load["wide"] = 32
        first = r.route("t0", colocated=True)
        assert first.decode == "narrow"  # empty
        r.finished(first)
        r.load["narrow"] = narrow
        assert (r.route("t0", colocated=True).decode == "narrow") is stays, narrow
    for wide, stays in ((16, True), (17, False)):  # 2 x 1/256 of the wide one: 16 of its own 256
        r = _sized()
        r.load["narrow"] = 1
        first = r.route("t0", colocated=True)
        assert first.decode == "wide"
        r.finished(first)
        r.load["narrow"], r.load["wide"] = 0, wide
        assert (r.route("t0", colocated=True).decode == "wide") is stays, wide
    r = _sized()
    r.load["narrow"] = 1
    r.finished(r.route("t0", colocated=True))
    r.load["narrow"], r.load["wide"] = 0, 1  # 1/256 against an empty narrow engine's 2/32
    assert r.route("t0", colocated=True).decode == "wide"


def test_an_engine_that_joins_without_its_slots_takes_the_widest_engines():
    r = _sized()
    r.join("new", Role.MIXED)
    r.load["wide"], r.load["narrow"], r.load["new"] = 64, 16, 96  # 1/4, 1/2 and 96/256 = 3/8
    assert r.route("t0", colocated=True).decode == "wide"
    r.load["new"] = 32  # 1/8
    assert r.route("t1", colocated=True).decode == "new"


def test_the_cost_rule_drains_each_engines_backlog_at_its_own_prefill_rate():
    """Engines of different sizes are priced each by its own MoveCost: a 2-GPU engine clears its
    prefill backlog faster than a 1-GPU one."""
    from prorsa.costmodel import CostModel
    from prorsa.rollout.placement import MoveCost

    one = MoveCost(CostModel.from_names("h200", "qwen3-8b"), 8, 256.0)
    two = MoveCost(CostModel.from_names("h200", "qwen3-8b", tp=2), 8, 256.0)
    assert two.prefill_rate > 1.2 * one.prefill_rate
    now = [0.0]
    r = Router(roles(0, 0, 2), overload="cost", slots=8, move_cost=one, clock=lambda: now[0],
               engine_prices={"engine-0": two, "engine-1": one})
    assert [r.route(t, appended=20_000).decode for t in ("a", "b")] == ["engine-0", "engine-1"]
    now[0] = 0.25
    assert r.backlog("engine-0") == pytest.approx(20_000 - 0.25 * two.prefill_rate)
    assert r.backlog("engine-1") == pytest.approx(20_000 - 0.25 * one.prefill_rate)


def test_the_cost_rule_prices_a_move_to_a_mixed_engine_as_a_recompute_and_to_a_decode_engine_as_a_pull():
    """P1 D1 M1, the prefill engine full: a mixed engine takes a turn whole. t0's decode engine
    has a queue (0.67 s for the mean decode); the mixed engine is idle, but going there recomputes
    the whole 32k context (1.4 s), where pulling it to a decode engine would cost 0.12 s. It
    stays; a 2k context (0.05 s to recompute) goes."""
    for context, stays in ((32768, True), (2048, False)):
        r, price = _priced(p=1, d=1, m=1)
        first = r.route("t0")
        assert (first.prefill, first.decode) == ("engine-0", "engine-1")
        r.finished(first)
        r.load["engine-0"] += 8  # its slots: full
        r.load["engine-1"] += 10
        stay = price.wait_s("decode", 10, 0, 0)
        assert price.move_s("decode", context, 256) < stay < price.move_s("whole", 32768, 256)
        again = r.route("t0", appended=256, context=context)
        if stays:
            assert (again.prefill, again.decode) == ("engine-0", "engine-1")
        else:
            assert (again.prefill, again.decode) == (None, "engine-2")


def test_the_cost_rule_looks_past_an_engine_whose_move_alone_costs_more_than_staying():
    """Three mixed engines. t0's has a queue (0.67 s); the first other one decodes 7 turns that a
    16k recompute would stall (8 x 0.54 s), the second is idle (0.54 s): t0 goes to the second."""
    r, price = _priced(m=3)
    routes = [r.route(t) for t in ("a", "b", "t0")]
    assert routes[2].decode == "engine-2"
    for route in routes:
        r.finished(route)
    r.load["engine-0"] += 7
    r.load["engine-2"] += 10
    move = price.move_s("whole", 16384, 256)
    assert move < price.wait_s("whole", 10, 0, 0) < 8 * move
    assert r.route("t0", appended=256, context=16384).decode == "engine-1"


def test_engines_switched_by_restart_never_ask_a_mixed_engine_to_export_kv():
    """In place, with no prefill engine the mixed engines prefill for the decode engines. By
    restart a mixed engine only pulls KV (roles.py), so every engine that decodes runs its
    turns whole; with a prefill engine, mixed engines still take decodes and their overflow."""
    kv_both = Router(roles(0, 2, 1))
    route = kv_both.route("t0")
    assert route.prefill == "engine-2" and route.decode in ("engine-0", "engine-1")
    restart = Router(roles(0, 2, 1), mixed_exports_kv=False)
    routes = [restart.route(f"t{i}") for i in range(6)]
    assert all(r.prefill is None for r in routes)
    assert {r.decode for r in routes} == {"engine-0", "engine-1", "engine-2"}
    with_prefill = Router(roles(1, 0, 2), mixed_exports_kv=False)
    assert all(with_prefill.route(f"t{i}").prefill == "engine-0" for i in range(4))
