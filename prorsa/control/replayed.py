"""The trajectories a policy rehearses: a step as the next one is expected to run, resamples of it.

    decodes_as(ahead, older)      `older` with its decodes scaled to `ahead`'s mean
    scaled_decodes(specs, f)      every decode x f
    completed_since(finished, t)  how many completed after trajectory t
    resampled(specs, r)           the r-th resample of a step's GRPO groups
    fill(specs, n)                n trajectories from specs, cycled with seeds of their own
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from prorsa.agent.trace import TrajectorySpec


def decodes_as(ahead: Sequence[TrajectorySpec], older: Sequence[TrajectorySpec]) -> list[TrajectorySpec]:
    """`older` with its decodes scaled to `ahead`'s mean decode: an earlier step as the next one
    is expected to decode (responses drift as a policy learns)."""
    if not ahead or not older:
        return []
    have = float(np.mean([t.decode_tokens for s in older for t in s.turns]))
    want = float(np.mean([t.decode_tokens for s in ahead for t in s.turns]))
    return scaled_decodes(older, want / have if have > 0 else 1.0)


def scaled_decodes(specs: Sequence[TrajectorySpec], factor: float) -> list[TrajectorySpec]:
    return [replace(s, turns=tuple(replace(t, decode_tokens=max(1, round(t.decode_tokens * factor)))
                                   for t in s.turns)) for s in specs]


def completed_since(finished: Sequence[TrajectorySpec], traj_id: str) -> int:
    """How many of `finished` (oldest first) completed after `traj_id`; all of them when it has
    left the window."""
    for k, spec in enumerate(reversed(finished)):
        if spec.traj_id == traj_id:
            return k
    return len(finished)


def resampled(specs: Sequence[TrajectorySpec], r: int) -> list[TrajectorySpec]:
    """The `r`th resample of a step: as many GRPO groups (trajectories of one step and prompt) as
    it ran, drawn from its own with replacement. Each copy is a prompt of its own with seeds of its
    own, so copies share no cached prefix (shared token ids would hit a cache no real step has)."""
    groups: dict[tuple[int, int], list[TrajectorySpec]] = {}
    for s in specs:
        groups.setdefault((s.step, s.prompt_index), []).append(s)
    keys = list(groups)
    draw = random.Random(7919 * (r + 1) + len(specs))
    return [replace(s, traj_id=f"{s.traj_id}~{r}.{j}", prompt_index=j,
                    seed=(s.seed + 2654435761 * (r + 1) + 40503 * j) % 2**32)
            for j in range(len(keys)) for s in groups[keys[draw.randrange(len(keys))]]]


def fill(specs: Sequence[TrajectorySpec], n: int) -> list[TrajectorySpec]:
    """`n` trajectories from `specs` (all of them when n is 0): cycled when there are fewer, each
    repeat with a seed of its own (shared seeds would share token ids, and prefix caches hit)."""
    if not specs or not n:
        return list(specs)
    return [s if i < len(specs) else replace(s, seed=(s.seed + 2654435761 * (i // len(specs))) % 2**32)
            for i in range(n) for s in (specs[i % len(specs)],)]
