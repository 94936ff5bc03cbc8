"""What the Python API hands back: a trajectory as a trainer reads it, and its turns as they ran.

    Trajectory   token ids, loss mask, rollout logprobs, reward, policy version, status, turns
    Turn         one turn's engines, tokens and timings (queue, prefill, transfer, decode, tool)
    trajectory_of(result, vocab_size) -> Trajectory   from the agent loop's TrajectoryResult

The sequence is the trainer's (train/samples.py sample_of): prompt, each turn's generated tokens
(mask 1, with their logprobs) and the observation appended after it (mask 0). Engines that work
from token counts (emulated) generate no ids: their sequences are empty and the turns' counts
and timings are what there is. In replay on engines that need ids, the loop appended synthetic
observations (agent/loop.py synth_ids) that no turn records: they are drawn again from the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from prorsa.agent.loop import TrajectoryResult, TurnResult, synth_ids
from prorsa.train.samples import sample_of


@dataclass(frozen=True)
class Turn:
    index: int  # 0 is the prompt's turn
    prefill_engine: str  # "" when the turn had no separate prefill leg (colocated)
    decode_engine: str
    prefill_tokens: int  # appended this turn (turn 0: the prompt)
    cached_tokens: int  # of the context, served from an engine's prefix cache
    decode_tokens: int  # generated this turn
    queue_s: float  # waiting for an engine
    prefill_s: float
    transfer_s: float  # the KV from the prefill engine to the decode engine
    decode_s: float
    tool_s: float  # the tool call after the decode (0 on the last turn)
    tool_name: str  # the real tool called; "" when the latency was replayed
    tool_status: str  # ok | error | timeout | crash | truncated; "" when none ran
    observation: str  # what the tool returned, as the model saw it


@dataclass(frozen=True)
class Trajectory:
    traj_id: str  # "s<batch>-p<prompt>-g<member>": members of a group share a task
    task_id: str  # the task it worked on ("" without an environment)
    status: str  # completed | failed
    error: str  # why it failed; "" when it completed
    reward: float  # NaN without an environment's reward (or when the reward failed)
    policy_version: int  # the weight updates pushed before it started
    token_ids: tuple[int, ...]  # prompt, generated turns, observations between them
    loss_mask: tuple[int, ...]  # 1 on the tokens the policy generated
    rollout_logprobs: tuple[float, ...]  # the engine's logprob of each generated token; 0.0 elsewhere
    turns: tuple[Turn, ...]
    start_s: float  # seconds since the Rollout started its engines
    end_s: float

    @property
    def group(self) -> str:
        """The GRPO group: trajectories of one batch's prompt."""
        return self.traj_id.rpartition("-g")[0]


def _turn(t: TurnResult) -> Turn:
    return Turn(t.turn, t.prefill_engine, t.decode_engine, t.prefill_tokens, t.cached_tokens, t.decode_tokens,
                t.queue_s, t.prefill_s, t.transfer_s, t.decode_s, t.tool_s, t.tool_name, t.tool_status,
                t.observation)


def _replayed_observations(result: TrajectoryResult, vocab_size: int) -> TrajectoryResult:
    turns = list(result.turns)
    for k in range(len(turns) - 1):
        if not turns[k].observation_ids and turns[k + 1].prefill_tokens:
            ids = synth_ids((1, result.spec.seed, k + 1), turns[k + 1].prefill_tokens, vocab_size)
            turns[k] = replace(turns[k], observation_ids=tuple(ids))
    return replace(result, turns=turns)


def trajectory_of(result: TrajectoryResult, vocab_size: int = 0) -> Trajectory:
    """`vocab_size`: the engines' when they work on token ids (0: they work from counts)."""
    if vocab_size and result.prompt_ids:
        result = _replayed_observations(result, vocab_size)
    sample = sample_of(result)
    return Trajectory(
        traj_id=result.spec.traj_id, task_id=result.task_id, status=result.status, error=result.error,
        reward=result.reward, policy_version=result.policy_version, token_ids=sample.token_ids,
        loss_mask=sample.loss_mask, rollout_logprobs=sample.rollout_logprobs,
        turns=tuple(_turn(t) for t in result.turns), start_s=result.start_s, end_s=result.end_s)
