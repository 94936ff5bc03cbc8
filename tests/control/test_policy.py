import pytest

from prorsa.control.policy import Snapshot, make_policy
from prorsa.roles import Role, role_resources


def test_static_roles():
    p = make_policy("static:2:1")
    assert p.initial_roles(3) == [Role.PREFILL, Role.PREFILL, Role.DECODE]
    assert p.decide(Snapshot(time_s=1.0, engines=())).targets == {}
    assert make_policy("static:1:1:2").initial_roles(4)[-1] is Role.MIXED
    assert make_policy("static:0:2:2").initial_roles(4) == [Role.DECODE] * 2 + [Role.MIXED] * 2


def test_colocated_roles():
    assert make_policy("colocated").initial_roles(4) == [Role.MIXED] * 4


@pytest.mark.parametrize("spec", ["static:0:3", "static:2:0", "static:2", "static:x:y", "nope"])
def test_bad_specs(spec):
    with pytest.raises(ValueError):
        make_policy(spec)


def test_role_resources_declare_both_keys():
    assert role_resources(Role.PREFILL, 8) == {"prefill": 8.0, "decode": 0.0}
    assert role_resources(Role.DECODE, 8) == {"prefill": 0.0, "decode": 8.0}
    assert role_resources(Role.MIXED, 8) == {"prefill": 8.0, "decode": 8.0}
