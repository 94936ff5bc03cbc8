import math

import pytest

from prorsa.agent.live_episode import ChatFormat
from prorsa.agent.loop import TrajectoryResult, TurnResult
from prorsa.agent.workload import TrajectorySpec, TurnSpec
from prorsa.metrics.outputs import trajectory_row
from prorsa.train.samples import Sample, group_key, samples_from_results, samples_from_rows


@pytest.fixture(scope="module")
def fmt(tiny_dir):
    return ChatFormat.load(tiny_dir)


def _result(fmt, traj_id="s1-p2-g0", reward=0.3, status="completed", turns=3, logprobs=True):
    spec = TrajectorySpec(traj_id, "arith", 2, 0, 1, (TurnSpec(5, 4, 0.0, True),), 7)
    r = TrajectoryResult(spec=spec, status=status, reward=reward, prompt_ids=(11, 12, 13, 14, 15))
    for k in range(turns):
        gen = tuple(100 + 10 * k + i for i in range(3 + k)) + (fmt.eos_id,)
        text = f"result {k}"
        obs = tuple(fmt.observation_ids(text, ended=True))
        r.turns.append(TurnResult(traj_id, k, "", "e0", 0, 0, len(gen), token_ids=gen,
                                  logprobs=tuple(-0.1 * (i + 1) for i in range(len(gen))) if logprobs else (),
                                  observation=text, observation_ids=obs, tool_status="ok"))
    return r


def test_mask_covers_exactly_the_generated_tokens(fmt):
    r = _result(fmt)
    r.policy_version = 4
    (s,) = samples_from_results([r])
    generated = [i for t in r.turns for i in t.token_ids]
    assert [i for i, m in zip(s.token_ids, s.loss_mask) if m] == generated
    # context order: prompt, turn 0, its observation, turn 1, its observation, turn 2 (no trailing observation)
    expect = list(r.prompt_ids)
    for k, t in enumerate(r.turns):
        expect += t.token_ids + (t.observation_ids if k < len(r.turns) - 1 else ())
    assert list(s.token_ids) == expect
    assert [x for x, m in zip(s.rollout_logprobs, s.loss_mask) if m] == [x for t in r.turns for x in t.logprobs]
    assert all(x == 0.0 for x, m in zip(s.rollout_logprobs, s.loss_mask) if not m)
    assert (s.reward, s.group, s.policy_version, s.traj_id) == (0.3, group_key(1, 2), 4, "s1-p2-g0")


def test_untrainable_trajectories_are_skipped_and_missing_logprobs_are_nan(fmt):
    out = samples_from_results([_result(fmt, status="failed"), _result(fmt, reward=math.nan),
                                _result(fmt, traj_id="x", logprobs=False)])
    assert [s.traj_id for s in out] == ["x"]
    assert all(math.isnan(x) for x, m in zip(out[0].rollout_logprobs, out[0].loss_mask) if m)


def test_parquet_rows_give_the_same_samples(fmt):
    results = [_result(fmt, traj_id=f"t{i}", reward=float(i), turns=i + 1) for i in range(3)]
    direct = samples_from_results(results)
    from_rows = samples_from_rows([trajectory_row(r) for r in results], fmt)
    for a, b in zip(direct, from_rows, strict=True):
        assert (a.token_ids, a.loss_mask, a.reward, a.group, a.policy_version) == \
            (b.token_ids, b.loss_mask, b.reward, b.group, b.policy_version)
        assert a.rollout_logprobs == pytest.approx(b.rollout_logprobs)


def test_sample_checks_its_lengths():
    with pytest.raises(ValueError, match="differ in length"):
        Sample((1, 2, 3), (0, 1), (0.0, 0.0, 0.0), 1.0, "g", 0)
    with pytest.raises(ValueError, match="first token"):
        Sample((1, 2), (1, 1), (0.0, 0.0), 1.0, "g", 0)
