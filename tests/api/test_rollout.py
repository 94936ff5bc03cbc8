"""prorsa.Rollout on emulated engines: one cluster for every call; batches of tasks from a Hugging
Face dataset or given as Task records come back as typed trajectories; weight updates reach the
engines and tag what starts after them."""

from __future__ import annotations

import concurrent.futures as cf
import json

import datasets
import pytest
from safetensors.torch import load_file

import prorsa
from prorsa.agent.datasets import Task
from prorsa.agent.tools import ToolCall
from prorsa.api.weights import WeightsError
from prorsa.config.load import ConfigError

PIPELINE = """\
name: api
seed: 5
policy: static:2:1
engines: {backend: emulated, count: 3, slots: 8, time_scale: 0.05}
workload: {family: swe, mode: sync, prompts: 2, group_size: 2, steps: 1, max_turns: 3,
           token_scale: 0.2, tool_time_scale: 0.05}
runtime: {turn_shape: driver, metrics_interval_s: 0.1, dashboard_address: null, control_interval_s: 0.2}
environment: {dataset: sums, columns: {prompt: question, answer: solution, task_id: uid, calls: calls},
              tools: [calculator], reward: exact_match}
"""
SUMS = [("2 + 3", "5"), ("4 * 5", "20"), ("9 - 7", "2")]


def _call(expr: str) -> ToolCall:
    return ToolCall("calculator", {"expression": expr})


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    d = tmp_path_factory.mktemp("api")
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({
        "question": [f"What is {e}?" for e, _ in SUMS], "solution": [a for _, a in SUMS],
        "uid": [f"sum-{i}" for i in range(len(SUMS))],
        "calls": [json.dumps([{"name": "calculator", "arguments": {"expression": e}}]) for e, _ in SUMS],
    }).save_to_disk(str(d / "sums"))
    (d / "p.yaml").write_text(PIPELINE)
    with prorsa.Rollout(d / "p.yaml", run_dir=d / "run") as r:
        yield r


def test_a_batch_from_the_pipelines_dataset_is_a_group_per_prompt(rollout):
    out = rollout.generate()  # workload.prompts prompts, each a group of workload.group_size
    assert [t.traj_id for t in out] == ["s0-p0-g0", "s0-p0-g1", "s0-p1-g0", "s0-p1-g1"]
    assert [t.task_id for t in out] == ["sum-0", "sum-0", "sum-1", "sum-1"]
    assert all(isinstance(t, prorsa.Trajectory) and t.status == "completed" for t in out)
    assert [t.reward for t in out] == [1.0] * 4  # the reference calls compute the answers
    assert [t.group for t in out] == ["s0-p0", "s0-p0", "s0-p1", "s0-p1"]


def test_turns_carry_engines_tokens_and_timings(rollout):
    (t,) = rollout.generate([Task("mine", "sums", "What is 6 * 7?", "42", (_call("6 * 7"),))])[:1]
    assert t.policy_version == rollout.version
    *called, last = t.turns
    assert [x.index for x in t.turns] == list(range(len(t.turns))) and called
    for x in t.turns:
        assert isinstance(x, prorsa.Turn)
        assert x.prefill_engine in {"engine-0", "engine-1"} and x.decode_engine == "engine-2"  # static:2:1
        assert x.prefill_s > 0 and x.decode_s > 0 and x.decode_tokens > 0 and x.prefill_tokens > 0
    for x, nxt in zip(called, t.turns[1:]):
        assert x.tool_name == "calculator" and x.tool_status == "ok" and x.tool_s > 0 and x.observation == "42"
    assert last.tool_name == "" and t.start_s < t.end_s


def test_given_tasks_are_scored_against_their_own_answers(rollout):
    right = Task("right", "sums", "What is 8 + 1?", "9", (_call("8 + 1"),))
    wrong = Task("wrong", "sums", "What is 8 + 2?", "11", (_call("8 + 2"),))
    out = rollout.generate([right, wrong])
    assert [(t.task_id, t.reward) for t in out] == [("right", 1.0), ("right", 1.0), ("wrong", 0.0), ("wrong", 0.0)]


def test_overlapping_batches_stream_as_they_finish(rollout):
    first = rollout.submit(1)
    streamed = list(rollout.stream(2))
    done = [f.result() for f in cf.as_completed(first)]
    batches = {t.traj_id.split("-")[0] for t in streamed} | {t.traj_id.split("-")[0] for t in done}
    assert len(batches) == 2 and len(streamed) == 4 and len(done) == 2  # two batch numbers, no reuse
    assert [t.end_s for t in streamed] == sorted(t.end_s for t in streamed)  # in the order they finished


def test_weights_from_a_state_dict_reach_every_engine_and_tag_later_trajectories(rollout):
    torch = pytest.importorskip("torch")
    before = rollout.version
    version = rollout.update_weights(lambda: {"w": torch.arange(6.0).reshape(2, 3)})
    assert version == before + 1 == rollout.version
    written = load_file(str(rollout.run_dir / "weights" / f"v{version}" / "model.safetensors"))
    assert written["w"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert {t.policy_version for t in rollout.generate(1)} == {version}
    with pytest.raises(WeightsError, match="not a model directory"):
        rollout.update_weights(rollout.run_dir)
    assert rollout.version == version  # a refused source changes nothing


def test_batches_it_cannot_run_are_refused(rollout):
    for bad in (0, [], "tasks"):
        with pytest.raises(ValueError, match="^tasks: "):
            rollout.submit(bad)


def test_misuse_is_told_before_anything_starts(tmp_path):
    (tmp_path / "p.yaml").write_text(PIPELINE.replace("environment:", "environment_:"))
    with pytest.raises(ConfigError, match="environment_: unknown field"):
        prorsa.Rollout(tmp_path / "p.yaml")
    (tmp_path / "q.yaml").write_text("name: q\nengines: {backend: emulated}\n")
    with pytest.raises(ConfigError, match="workload.prompts"):
        prorsa.Rollout(tmp_path / "q.yaml", workload__prompts=0)
    r = prorsa.Rollout(tmp_path / "q.yaml", **{"workload.group_size": 3})
    assert r.cfg.workload.group_size == 3 and r.run_dir is None  # nothing made before it starts
    with pytest.raises(ConfigError, match=r"^workload.group_size: "):  # a config object's overrides too
        prorsa.Rollout(r.cfg, workload__group_size=0)
    with pytest.raises(RuntimeError, match="not running"):
        r.generate()


def test_closing_with_a_batch_in_flight_cancels_it_and_leaves_nothing(tmp_path):
    (tmp_path / "p.yaml").write_text("name: slow\nengines: {backend: emulated, count: 2}\npolicy: static:1:1\n"
                                     "workload: {family: swe, prompts: 2, group_size: 2}\n"
                                     "runtime: {dashboard_address: null}\n")
    r = prorsa.Rollout(tmp_path / "p.yaml")
    r.start()
    run_dir = r.run_dir
    assert run_dir.is_dir()
    futures = r.submit()  # real-time SWE trajectories: minutes, far longer than this test
    r.close()
    assert all(f.cancelled() for f in futures) and not run_dir.exists()
    with pytest.raises(RuntimeError, match="not running"):
        r.submit()


def test_a_partial_rollout_trains_whole_groups_each_call_and_carries_the_rest(tmp_path):
    (tmp_path / "p.yaml").write_text(
        "name: partial\nseed: 3\npolicy: static:2:1\n"
        "engines: {backend: emulated, count: 3, slots: 8, time_scale: 0.05}\n"
        "workload: {family: swe, mode: sync, prompts: 2, group_size: 2, steps: 1, max_turns: 3, token_scale: 0.2,\n"
        "           tool_time_scale: 0.05}\n"
        "partial_rollout: {over_sample: 1.0, carry: true}\n"
        "runtime: {turn_shape: driver, dashboard_address: null}\n")
    with prorsa.Rollout(tmp_path / "p.yaml") as r:
        with pytest.raises(ValueError, match="^submit: a partial rollout's steps end early"):
            r.submit()
        batches = [r.generate() for _ in range(4)]
    trained = [t for batch in batches for t in batch]
    assert [len(batch) for batch in batches] == [4] * 4  # workload.prompts whole groups a call
    assert len({t.traj_id for t in trained}) == len(trained)  # none trained twice
    for batch in batches:
        groups: dict[str, list] = {}
        for t in batch:
            groups.setdefault(t.group, []).append(t)
        assert sorted(map(len, groups.values())) == [2, 2] and {t.status for t in batch} == {"completed"}
    # 4 groups in flight a step, 2 trained: the other 2 ran on into the next call, none was cut
    assert r.dropped == []
    carried = [t for k, batch in enumerate(batches) for t in batch if int(t.traj_id[1:].split("-")[0]) < k]
    assert carried, [t.traj_id for t in trained]
