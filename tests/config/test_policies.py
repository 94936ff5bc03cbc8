"""A policy's arguments as a typed record (config/policies.py): the colon shorthand and a pipeline's
mapping parse into the same record, the shorthand names the policy, and a wrong argument is named."""

from __future__ import annotations

import pytest

from prorsa.config.load import load_pipeline
from prorsa.config.policies import POLICY_ARGS, ProrsaArgs, ReactiveArgs, StaticArgs, parse_policy, shorthand
from prorsa.control.policy import make_policy


@pytest.mark.parametrize("spec", ["colocated", "static", "static:1:7", "static:1:0:7", "reactive:4096:0.01:1",
                                  "prorsa", "prorsa:2", "prorsa:4:2:1:1", "prorsa:4:2:1:2:0.05", "oracle:4:1:2:1:0.02"])
def test_the_shorthand_parses_and_renders_back_as_written(spec):
    name, args = parse_policy(spec)
    assert shorthand(name, args) == spec


def test_a_mapping_is_the_record_written_by_name_its_shorthand_filled_up_to_the_last_given():
    name, args = parse_policy({"name": "prorsa", "horizon_s": 8, "votes": 1})
    assert args == ProrsaArgs(horizon_s=8, votes=1)
    assert shorthand(name, args) == "prorsa:8:2:1:1"  # hysteresis and max_switches at their defaults
    assert parse_policy(shorthand(name, args))[1] == args


def test_a_mapping_round_trips_through_its_shorthand_to_the_last_digit():
    name, args = parse_policy({"name": "prorsa", "min_gain": 0.1234567, "horizon_s": 2.5})
    assert parse_policy(shorthand(name, args))[1] == args
    assert shorthand(name, args) == "prorsa:2.5:2:1:2:0.1234567"


def test_the_record_reaches_the_policy():
    p = make_policy({"name": "prorsa", "horizon_s": 8, "votes": 3, "min_gain": 0.05})
    assert (p.horizon_s, p.votes, p.allocator.min_gain, p.name) == (8.0, 3, 0.05, "prorsa:8:2:1:3:0.05")
    r = make_policy("reactive:1000:0.5")
    assert (r.queue_tokens, r.kv_util, r.cooldown_s) == (1000.0, 0.5, ReactiveArgs().cooldown_s)
    assert make_policy({"name": "static", "prefill": 2, "decode": 1}).name == "static:2:1"


@pytest.mark.parametrize("spec,field", [("prorsa:0", "horizon_s"), ("prorsa:4:2:1:0", "votes"), ("prorsa:4:-1", "hysteresis"),
                                        ("reactive:100:1.5", "kv_util"), ("static:x:1", "prefill"),
                                        ({"name": "reactive", "cooldown_s": -1}, "cooldown_s")])
def test_a_wrong_argument_is_named(spec, field):
    with pytest.raises(ValueError, match=field):
        make_policy(spec)


def test_every_built_in_policy_has_a_record_with_a_default_for_each_argument():
    make_policy("colocated")  # registers the adaptive policies beside the fixed ones
    assert {"colocated", "static", "reactive", "prorsa", "oracle"} <= set(POLICY_ARGS)
    for model in POLICY_ARGS.values():
        model()  # no argument is required: the bare name is a policy
    assert StaticArgs().prefill is None  # `static` alone: the groups' opening roles


def test_a_pipeline_may_write_the_mapping_and_holds_the_shorthand(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: t\npolicy: {name: prorsa, horizon_s: 2}\nengines: {count: 3}\n")
    assert load_pipeline(f).policy == "prorsa:2"
