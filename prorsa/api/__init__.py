"""The Python API: Prorsa's rollout called from another program (a trainer, an RL loop).

    rollout.py   Rollout: cluster and engines kept up across calls; generate / submit / stream
                 batches of tasks, update_weights
    records.py   Trajectory and Turn: what comes back (token ids, loss mask, logprobs, reward,
                 policy version, per-turn timings); TrajectoryStatus: how it ended
    weights.py   model_dir_for: a state dict, a model directory or a callable as the directory
                 the engines reload

`import prorsa` stays cheap: `prorsa.Rollout` imports this package on first use.
"""

from prorsa.api.records import Trajectory, TrajectoryStatus, Turn
from prorsa.api.rollout import Rollout

__all__ = ["Rollout", "Trajectory", "TrajectoryStatus", "Turn"]
