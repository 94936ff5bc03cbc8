"""A turn's task group as the Dask runtime submits it (live/tasks.py), without engines (fast)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prorsa.agent.loop import TurnRequest
from prorsa.live.tasks import leg_graph, tool_graph
from prorsa.rollout.router import Route

TURN = TurnRequest("t0", 1, "math", appended_tokens=10, context_tokens=100, decode_tokens=20,
                   tool_latency_s=0.0, done=False, seed=0)
ADDRESSES = {"engine-0": "tcp://127.0.0.1:1", "engine-1": "tcp://127.0.0.1:2"}


def layers(obj) -> dict[str, dict]:
    return {name: layer.annotations for name, layer in obj.__dask_graph__().layers.items()}


def requests(obj) -> list:
    """The leg requests a delayed task was built with."""
    return [arg for arg in obj.__dask_graph__()[obj.key].args if hasattr(arg, "priority")]


@pytest.mark.parametrize("route", [Route("engine-0", "engine-1"), Route(None, "engine-1"),
                                   Route(None, "engine-1", local_prefill=True)])
def test_legs_carry_the_priority_to_engines_and_to_dask(route):
    """Lower key, sooner: on the requests as it is; as Dask's annotation negated (higher first)."""
    pf, df = leg_graph(TURN, route, ADDRESSES, priority=12.5)
    legs = [df] if pf is None else [pf, df]
    for leg in legs:
        (req,) = requests(leg)
        assert req.priority == 12.5
        assert layers(leg)[leg.key]["priority"] == -12.5
    graph = tool_graph(TURN, *leg_graph(TURN, route, ADDRESSES, priority=-3.0), "turn-t0-1", 0.0, 0.0, priority=-3.0)
    assert {a["priority"] for a in layers(graph).values()} == {3.0}  # legs and the tool task


def test_no_priority_leaves_dask_its_own_order():
    pf, df = leg_graph(TURN, Route("engine-0", "engine-1"), ADDRESSES)
    assert all("priority" not in a for leg in (pf, df) for a in layers(leg).values())
    assert [r.priority for leg in (pf, df) for r in requests(leg)] == [0.0, 0.0]


def test_the_scheduler_orders_tasks_by_the_annotation():
    """What reaches the scheduler: each task's priority tuple (lowest runs first) leads with the key."""
    distributed = pytest.importorskip("distributed")
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None,
                            resources={"prefill": 1, "decode": 1}) as client:
        late = leg_graph(TURN, Route("engine-0", "engine-1"), ADDRESSES, priority=7.0)
        first = client.compute(list(late), optimize_graph=False)  # no engines here: they fail
        soon = leg_graph(TURN, Route("engine-0", "engine-1"), ADDRESSES, attempt=1, priority=-40.0)
        then = client.compute(list(soon), optimize_graph=False)
        distributed.wait(first + then)
        keys = [f.key for f in first + then]
        prio = client.run_on_scheduler(lambda dask_scheduler: [dask_scheduler.tasks[k].priority for k in keys])
    assert [p[0] for p in prio] == [7.0, 7.0, -40.0, -40.0]
    assert max(prio[2:]) < min(prio[:2])  # submitted later, yet ahead: the key beats Dask's own order


def test_a_decode_request_carries_the_runs_cap_and_the_replayed_length_apart():
    """max_tokens is the cap a real run sets (the context budget left); the replayed length rides
    only in replay_tokens, for the engine, and on the decode leg's annotations, which the lifecycle
    plugin reads once the leg has finished. A live turn's decode length is its cap, and it has no
    replayed length: the model ends its own turn."""
    pf, df = leg_graph(TURN, Route("engine-0", "engine-1"), ADDRESSES, budget=4096)
    (req,) = [r for r in requests(df) if hasattr(r, "replay_tokens")]
    assert (req.max_tokens, req.replay_tokens, req.ignore_eos) == (4096 - 100, 20, True)
    a = layers(df)[df.key]
    assert a["max_tokens"] == 3996 and a["replay_tokens"] == 20 and a["tokens"] == 0
    assert "replay_tokens" not in layers(pf)[pf.key]
    _, df = leg_graph(TURN, Route("engine-0", "engine-1"), ADDRESSES)  # no budget declared: no cap
    (req,) = [r for r in requests(df) if hasattr(r, "replay_tokens")]
    assert req.max_tokens is None and req.replay_tokens == 20
    live = replace(TURN, live=True, decode_tokens=256)
    _, df = leg_graph(live, Route("engine-0", "engine-1"), ADDRESSES, budget=4096)
    (req,) = [r for r in requests(df) if hasattr(r, "replay_tokens")]
    assert (req.max_tokens, req.replay_tokens, req.ignore_eos) == (256, None, False)
    assert "replay_tokens" not in layers(df)[df.key]
