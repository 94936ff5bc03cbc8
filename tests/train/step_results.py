"""Finished trajectories for the learner tests: step `step`'s trajectory `i`, one turn of four
generated tokens distinct per step and trajectory, rewards that differ within each group."""

from prorsa.agent.loop import TrajectoryResult, TurnResult
from prorsa.agent.workload import TrajectorySpec, TurnSpec

BATCH = 4  # trajectories per step: two groups of two


def step_result(step: int, i: int, version: int) -> TrajectoryResult:
    traj = f"s{step}-t{i}"
    spec = TrajectorySpec(traj, "arith", i // 2, step, 0, (TurnSpec(5, 4, 0.0, True),), 7)
    reward = [0.0, 1.0, 0.2, 0.9][(i + step) % 4]
    r = TrajectoryResult(spec=spec, status="completed", reward=reward, prompt_ids=(11, 12, 13, 14, 15),
                         policy_version=version)
    gen = (100 + 7 * step + i, 101 + i, 102, 103)
    r.turns.append(TurnResult(traj, 0, "", "e0", 5, 0, len(gen), token_ids=gen, logprobs=(-1.5,) * len(gen)))
    return r
