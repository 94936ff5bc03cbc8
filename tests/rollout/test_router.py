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
