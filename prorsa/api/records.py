"""What the Python API hands back: a trajectory as a trainer reads it, and its turns as they ran.

    Trajectory   token ids, loss mask, rollout logprobs, reward, policy version, status, turns
    Turn         one turn's engines, tokens and timings (queue, prefill, transfer, decode, tool)
    TrajectoryStatus   how a trajectory ended (a str enum: completed, failed, ...)
    trajectory_of(result, vocab_size) -> Trajectory   from the agent loop's TrajectoryResult

The sequence is the trainer's (train/samples.py sample_of): prompt, each turn's generated tokens
(mask 1, with their logprobs) and the observation appended after it (mask 0). Engines that work
from token counts (emulated) generate no ids: their sequences are empty and the turns' counts
and timings are what there is. In replay on engines that need ids, the loop appended synthetic
observations (agent/loop.py synth_ids) that no turn records: they are drawn again from the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from prorsa.agent.loop import TrajectoryResult, TrajectoryStatus, TurnResult, synth_ids
from prorsa.train.samples import sample_of


@dataclass(frozen=True)
class Turn:
    """One turn of a trajectory as it ran: append, prefill, decode, then the tool call.

    Attributes:
        index: the turn's place in the trajectory; 0 is the prompt's turn.
        prefill_engine: the engine that prefilled it; "" when it had no separate prefill leg
            (a colocated or mixed engine did both).
        decode_engine: the engine that decoded it.
        prefill_tokens: tokens appended this turn (turn 0: the prompt; later: the observation).
        cached_tokens: of the context before the append, tokens served from an engine's prefix cache.
        decode_tokens: tokens generated this turn.
        queue_s: seconds waiting for an engine to admit it.
        prefill_s: seconds prefilling.
        transfer_s: seconds moving the KV from the prefill engine to the decode engine (0 without one).
        decode_s: seconds decoding.
        tool_s: seconds in the tool call after the decode (0 on the last turn).
        tool_name: the real tool called; "" when the tool's latency was replayed from the workload.
        tool_status: ok | error | timeout | crash | truncated; "" when no tool ran.
        observation: what the tool returned, as the model saw it ("" when none ran).
    """

    index: int
    prefill_engine: str
    decode_engine: str
    prefill_tokens: int
    cached_tokens: int
    decode_tokens: int
    queue_s: float
    prefill_s: float
    transfer_s: float
    decode_s: float
    tool_s: float
    tool_name: str
    tool_status: str
    observation: str


@dataclass(frozen=True)
class Trajectory:
    """One trajectory as a trainer reads it: the token sequence, its loss mask and logprobs, the
    reward, and the turns that made it.

    Attributes:
        traj_id: "s<batch>-p<prompt>-g<member>"; the members of a GRPO group share a task.
        task_id: the environment's task it worked on ("" without an environment).
        status: how it ended, a TrajectoryStatus: completed or failed (a str, so
            `status == "completed"` works).
        error: why it failed; "" when it completed.
        reward: the environment's reward; NaN without one, or when the reward function raised.
        policy_version: the weight updates pushed (Rollout.update_weights) before it started.
        token_ids: the sequence: prompt, each turn's generated tokens, the observations between
            them; empty on engines that work from token counts (emulated).
        loss_mask: per token of token_ids: 1 where the policy generated it, 0 on prompt and observations.
        rollout_logprobs: per token of token_ids: the engine's logprob of a generated token; 0.0 elsewhere.
        turns: the Turn records, in order.
        start_s: seconds since the Rollout started its engines, when it started.
        end_s: seconds since the Rollout started its engines, when it ended.
    """

    traj_id: str
    task_id: str
    status: TrajectoryStatus
    error: str
    reward: float
    policy_version: int
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    rollout_logprobs: tuple[float, ...]
    turns: tuple[Turn, ...]
    start_s: float
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
        traj_id=result.spec.traj_id, task_id=result.task_id, status=TrajectoryStatus(result.status),
        error=result.error,
        reward=result.reward, policy_version=result.policy_version, token_ids=sample.token_ids,
        loss_mask=sample.loss_mask, rollout_logprobs=sample.rollout_logprobs,
        turns=tuple(_turn(t) for t in result.turns), start_s=result.start_s, end_s=result.end_s)
