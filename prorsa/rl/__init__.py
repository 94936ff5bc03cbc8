"""The RL loop around a live rollout: the supervised warm-up, the learner between steps, a trainer
on a worker of its own."""
