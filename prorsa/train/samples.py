"""What the trainer learns from: one token sequence per trajectory, with the tokens the policy
wrote marked.

    Sample(token_ids, loss_mask, rollout_logprobs, reward, group, policy_version, traj_id)
    samples_from_results(results) -> [Sample]                     from the rollout's TrajectoryResults
    sample_of(result) -> Sample                                   one result, trainable or not
    trainable_sample(result) -> Sample | None                     one result, None if untrainable
    SequenceBuilder(prompt_ids)   .generated(ids, logprobs) / .appended(ids) / .sample(...): one sequence
    samples_from_rows(rows, fmt, policy_version=0) -> [Sample]    from trajectories.parquet rows
                                                                  (live mode; the tokenizer rebuilds
                                                                  the observations' ids)
    group_key(step, prompt_index) -> str                          the GRPO group of a trajectory

A live trajectory's context, and the mask over it:

    prompt_ids | turn_0.token_ids | turn_0.observation_ids | turn_1.token_ids | ... | turn_n.token_ids
        0      |        1         |           0            |        1         |     |        1

The last turn's observation (a trajectory cut at the turn cap) is left off: nothing after it is
trained, so it would only cost compute. Failed trajectories and those without a reward (NaN) are
skipped: there is nothing to weigh their tokens by.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prorsa.agent.live_episode import ChatFormat
    from prorsa.agent.loop import TrajectoryResult


@dataclass(frozen=True)
class Sample:
    token_ids: tuple[int, ...]  # the whole context: prompt, generated turns, observations between
    loss_mask: tuple[int, ...]  # 1 on tokens the policy generated, 0 on prompt and observations
    rollout_logprobs: tuple[float, ...]  # the engine's logprob of each token; 0.0 where the mask is 0
    reward: float
    group: str  # trajectories sharing a prompt in one step (group_key); advantages are relative to it
    policy_version: int  # the weights that generated it
    traj_id: str = ""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.rollout_logprobs) != n:
            raise ValueError(f"sample {self.traj_id!r}: token_ids, loss_mask and rollout_logprobs differ in "
                             f"length ({n}, {len(self.loss_mask)}, {len(self.rollout_logprobs)})")
        if n and self.loss_mask[0]:
            raise ValueError(f"sample {self.traj_id!r}: the first token has no prefix to be generated from")

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)


def group_key(step: int, prompt_index: int) -> str:
    """Sync: prompt p of step s. Async: step is 0 and prompt_index a run-wide counter, so the key
    is still unique per prompt draw (a task drawn twice is two groups)."""
    return f"s{step}-p{prompt_index}"


class SequenceBuilder:
    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.ids, self.mask, self.logprobs = list(prompt_ids), [0] * len(prompt_ids), [0.0] * len(prompt_ids)

    def generated(self, ids: Sequence[int], logprobs: Sequence[float] | None, traj_id: str) -> None:
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"trajectory {traj_id!r}: {len(ids)} generated tokens but {len(logprobs)} logprobs")
        self.ids += ids
        self.mask += [1] * len(ids)
        # No logprobs from the engine: NaN tells the trainer to compute them itself.
        self.logprobs += list(logprobs) if logprobs is not None else [math.nan] * len(ids)

    def appended(self, ids: Sequence[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def sample(self, reward: float, group: str, version: int, traj_id: str) -> Sample:
        return Sample(tuple(self.ids), tuple(self.mask), tuple(self.logprobs), reward, group, version, traj_id)


def _trainable(status: str, reward: float) -> bool:
    return status == "completed" and not math.isnan(reward)


def samples_from_results(results: Iterable[TrajectoryResult]) -> list[Sample]:
    """Each sample's version is its result's `policy_version` (0 where a rollout tagged none)."""
    return [s for r in results if (s := trainable_sample(r)) is not None]


def trainable_sample(r: TrajectoryResult) -> Sample | None:
    return sample_of(r) if _trainable(r.status, r.reward) and r.turns else None


def sample_of(r: TrajectoryResult) -> Sample:
    """One result's sequence, trainable or not (the Python API hands back every trajectory)."""
    b = SequenceBuilder(r.prompt_ids)
    for k, t in enumerate(r.turns):
        b.generated(t.token_ids, t.logprobs if t.logprobs else None, r.spec.traj_id)
        if k < len(r.turns) - 1:
            b.appended(t.observation_ids)
    return b.sample(r.reward, group_key(r.spec.step, r.spec.prompt_index),
                    getattr(r, "policy_version", 0), r.spec.traj_id)


def samples_from_rows(rows: Iterable[Mapping[str, Any]], fmt: ChatFormat, policy_version: int = 0) -> list[Sample]:
    """trajectories.parquet keeps each turn's observation as text, not ids; live mode made its ids
    with `fmt.observation_ids(text, ended)`, so the same tokenizer makes them again exactly.
    `policy_version` stands in for rows without a policy_version column (files written before
    the RL loop)."""
    out = []
    for row in rows:
        turns = row["turns"] or []
        if not _trainable(row["status"], row["reward"]) or not turns:
            continue
        b = SequenceBuilder(row["prompt_ids"])
        for k, t in enumerate(turns):
            ids = t["token_ids"] or []
            b.generated(ids, t["logprobs"] or None, row["traj_id"])
            if k < len(turns) - 1:
                ended = bool(ids) and ids[-1] == fmt.eos_id
                b.appended(fmt.observation_ids(t["observation"] or "", ended))
        version = row.get("policy_version")
        out.append(b.sample(row["reward"], group_key(row["step"], row["prompt_index"]),
                            policy_version if version is None else version, row["traj_id"]))
    return out
