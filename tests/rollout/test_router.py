from prorsa.roles import Role
from prorsa.rollout.router import Router


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
