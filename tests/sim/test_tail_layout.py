"""scheduling.tail_layout in the simulator: a merge happens at the tail, loses no trajectory, shortens
the step, and the lower bound stays below it; live runs refuse it."""

from __future__ import annotations

import pytest

from prorsa.config.load import ConfigError
from prorsa.config.pipeline import PipelineConfig
from prorsa.rollout.context import make_scheduler, resolve
from prorsa.sim.bounds import lower_bound
from prorsa.sim.run import simulate


def swe(tail: bool, steps: int = 1) -> PipelineConfig:
    # the paper table's SWE dense sync cell (benchmarks/paper.py), one step or two
    return PipelineConfig.model_validate({
        "name": "tail-layout", "seed": 0, "policy": "colocated",
        "engines": {"backend": "emulated", "count": 8, "slots": 32, "gpu": "h200", "model": "qwen3-8b"},
        "workload": {"family": "swe", "mode": "sync", "prompts": 32, "group_size": 8, "steps": steps,
                     "concurrency": 128, "trajectories": 256, "max_turns": 12},
        "runtime": {"sticky_overload": "cost"},
        "scheduling": {"tail_layout": tail},
    })  # fmt: skip


@pytest.fixture(scope="module")
def runs():
    return simulate(resolve(swe(False))), simulate(resolve(swe(True)))


def test_a_merge_shortens_the_step_and_loses_no_trajectory(runs):
    off, on = runs
    merges = on.summary["tail_merges"]
    assert len(merges) == 1 and merges[0]["width"] > 1
    assert off.summary["tail_merges"] == []
    # it fires late in the step, when few trajectories remain: never in its first 80%
    assert merges[0]["t"] > 0.8 * off.makespan_s
    done = on.recorder.trajectories
    assert len(done) == 256 and all(r.status == "completed" for r in done)
    assert all(len(r.turns) == len(r.spec.turns) for r in done)  # every turn ran, none lost or repeated
    assert on.makespan_s < 0.98 * off.makespan_s


def test_the_merge_is_the_one_priced_and_the_tail_runs_on_it(runs):
    off, on = runs
    # known answer: four trajectories left at 218 s, four idle engines merged into one TP4 engine
    (m,) = on.summary["tail_merges"]
    assert (m["t"], m["width"], m["wide"]) == (218.0, 4, 1)
    after = [t for r in on.recorder.trajectories for t in r.turns if t.start_s > m["t"]]
    assert after  # turns started after the merge ...
    hosts = {t.decode_engine for t in after}
    assert len(hosts) == 1  # ... all ran on the one wide engine (the lent ones are closed)
    first = {}
    for t in sorted(after, key=lambda t: t.start_s):
        first.setdefault(t.traj_id, t)
    # each trajectory recomputed its context there once, as priced; its later turns found it cached
    assert all(t.cached_tokens == 0 for t in first.values())
    assert any(t.cached_tokens > 0 for t in after if t is not first[t.traj_id])


def test_the_bound_stays_below_the_merged_run(runs):
    _, on = runs
    wide, narrow = lower_bound(resolve(swe(True))), lower_bound(resolve(swe(False)))
    assert wide.makespan_s <= on.makespan_s
    # the slowest trajectory on the widest layout is faster than on one engine; work is not cheaper
    assert wide.critical_path_s < narrow.critical_path_s
    assert wide.work_s == pytest.approx(narrow.work_s)


def test_every_step_gets_its_own_merge_and_the_engines_come_back():
    run = simulate(resolve(swe(True, steps=2)))
    # a second merge needs the first's engines restored and reopened between the steps
    assert len(run.summary["tail_merges"]) == 2
    assert sum(r.status == "completed" for r in run.recorder.trajectories) == 512


def test_a_live_run_refuses_it():
    with pytest.raises(ConfigError, match="tail_layout"):
        make_scheduler(resolve(swe(True)))
