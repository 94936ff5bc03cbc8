"""The trainer side of the RL loop: pure torch and transformers, no Dask and no engines.

    samples.py   Sample (token ids, loss mask, rollout logprobs, reward, group, policy version)
                 and how rollouts become samples
    grpo.py      group-normalised advantages and the clipped GRPO loss, as functions of tensors
    trainer.py   Trainer: the model, GRPO and SFT steps with gradient accumulation, save
    sft.py       the supervised warm-up on demonstrations of a tool-use task
    warmup.py    `prorsa sft` wired up: a model directory and settings in, the warm-up job out
    evaluate.py  how often the model's generations are a well-formed tool call, and their reward
    export.py    rollout batches as parquet for other trainers (verl, OpenRLHF, TRL), and back
    learner.py   Learner: finished trajectories in, a trainer's step, the new weights out (through
                 the body's `push`); its state after each step, for a resumed run
    protocol.py  PolicyTrainer: what the loop asks of a trainer (train.trainer plugs one in)
    handle.py    TrainerHandle: how the Learner reaches its trainer, wherever that lives
    weights.py   where the RL loop keeps its weight versions (RUN_DIR/weights/v<N>)
"""
