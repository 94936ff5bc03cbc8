"""The live body's side of the RL loop (a pipeline with a `train:` section).

    await warm_start(cfg, run_dir, console) -> cfg   train.sft_steps > 0: the supervised warm-up
                                        runs first, and the engines start from its weights
                                        (RUN_DIR/weights/v0); else cfg unchanged
    await open_learner(cfg, run_dir, client, addresses, now, journal) -> Learner   the trainer
                                        (train.trainer's plug-in or the GRPO Trainer) in the driver
                                        or on the trainer worker (train.placement), pushing each
                                        new version to every engine worker; a run directory with
                                        a saved state (RUN_DIR/trainer-state) resumes from it
    unfinished(journal, taken, fmt) -> [Finished]   what earlier sessions finished and no update
                                        took: the learner's first batch after a resume

Weights travel as a model directory on a filesystem every engine worker can read (the run
directory): each engine loads it in place (vLLM's reload_weights) and drops its cached prefixes.
With train.weight_sync: memory they travel through a shared-memory region on the driver's node
instead (shared_weights.py): the engines load them from it, no file in between.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Callable

from distributed import Client
from rich.console import Console

from prorsa.cluster.engine_host import engine_here
from prorsa.cluster.recovery import live_addresses
from prorsa.config.pipeline import PipelineConfig
from prorsa.engine.registry import resolve_model_dir
from prorsa.engine.vllm.errors import EngineUnavailable
from prorsa.metrics.journal import RunJournal
from prorsa.metrics.training import TRAIN_LOG
from prorsa.shared_weights import SharedRegion, WeightManifest
from prorsa.train.handle import LocalTrainer, TrainerHandle
from prorsa.train.learner import Finished, Learner, LearnerFiles, Push
from prorsa.train.weights import WEIGHTS

BATCHES = "batches"  # each trained batch, for trainers outside (verl, OpenRLHF, TRL)
STATE_DIR = "trainer-state"  # the learner's and trainer's state after the last update (resume)


async def _load_weights_here(model_dir: str, dask_worker=None) -> bool:
    try:
        await engine_here(dask_worker).load_weights(model_dir)
    except EngineUnavailable:  # down, not restarted yet: the engine keeps the directory and loads
        return False           # it when its worker restarts it, before it serves again
    return True


async def _load_shared_here(manifest: str, dask_worker=None) -> bool:
    engine = engine_here(dask_worker)
    load = getattr(engine, "load_shared", None)
    try:
        if load is None:  # an engine without weights (emulated): a new policy drops its cached KV
            await engine.load_weights(None)
        else:
            await load(WeightManifest.from_json(manifest))
    except EngineUnavailable:  # as above: the region holds the newest weights for its restart
        return False
    return True


def push_weights(client: Client, addresses: dict[str, str]) -> Push:
    async def push(weights: Path | WeightManifest) -> None:
        workers = await live_addresses(client, addresses)
        if isinstance(weights, WeightManifest):
            await client.run(_load_shared_here, weights.to_json(), workers=workers)
        else:
            await client.run(_load_weights_here, str(weights), workers=workers)
    return push


def shared_region(run_dir: Path) -> SharedRegion:
    """Where train.weight_sync: memory puts the weights: memory-backed where the system has it."""
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return SharedRegion(root / f"prorsa-weights-{run_dir.resolve().name}-{os.getpid()}")


def _trainer_config(cfg: PipelineConfig, lr: float):
    from prorsa.train.trainer import TrainerConfig

    t = cfg.train
    # one torch thread: the engines hold the cores, and a small model gains nothing from more
    return TrainerConfig(lr=lr, clip_eps=t.clip_eps, kl_coef=t.kl_coef, loss_agg=t.loss_agg,
                         micro_batch=t.micro_batch, grad_accum=t.grad_accum,
                         seed=cfg.seed if t.seed is None else t.seed, threads=1)


def _warm_up(cfg: PipelineConfig, base: Path, out: Path, say: Callable[[str], None]) -> None:
    from prorsa.agent.environment import ToolEnvironment, dataset_tasks
    from prorsa.agent.datasets import make_dataset
    from prorsa.agent.live_episode import ChatFormat
    from prorsa.train.sft import DEMONSTRATIONS, SftPlan, run_sft
    from prorsa.train.trainer import Trainer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its loading bars would cut into the run's progress
    env = cfg.environment
    trainer = Trainer(base, _trainer_config(cfg, cfg.train.sft_lr))
    tasks = dataset_tasks(env, cfg.seed)
    held_out = make_dataset(env.dataset, 8, cfg.seed + 10_000)  # apart from the RL tasks
    schemas = ToolEnvironment.from_config(env, cfg.seed).toolbox.schemas()
    plan = SftPlan(steps=cfg.train.sft_steps, target_call_rate=cfg.train.sft_target_call_rate, seed=cfg.seed)

    def on_step(stats, ev) -> None:
        if ev is not None:
            say(f"warm-up step {stats.version}: loss {stats.policy_loss:.3f}, tool-call rate {ev.call_rate:.2f} "
                f"(with the prompt's numbers {ev.correct_call_rate:.2f})")

    result = run_sft(trainer, tasks, held_out, DEMONSTRATIONS[env.dataset], ChatFormat(trainer.tokenizer),
                     schemas, plan, on_step)
    trainer.version = 0  # the policy RL starts from
    trainer.save(out)
    say(f"warm-up: {result.steps} steps, tool-call rate {result.evals[0][1].call_rate:.2f} -> "
        f"{result.evals[-1][1].call_rate:.2f}")


async def warm_start(cfg: PipelineConfig, run_dir: Path, console: Console) -> PipelineConfig:
    if cfg.train is None or cfg.train.sft_steps == 0:
        return cfg
    base = await asyncio.to_thread(resolve_model_dir, cfg.engines)
    out = run_dir / WEIGHTS / "v0"
    if not (out / "config.json").exists():  # a resumed run keeps its warm-up
        await asyncio.to_thread(_warm_up, cfg, base, out, console.print)
    vllm = cfg.engines.vllm.model_copy(update={"model": str(out.resolve())})
    return cfg.model_copy(update={"engines": cfg.engines.model_copy(update={"vllm": vllm})})


async def open_trainer(cfg: PipelineConfig, client: Client, run_dir: Path) -> TrainerHandle:
    model_dir = await asyncio.to_thread(resolve_model_dir, cfg.engines)
    config = _trainer_config(cfg, cfg.train.lr)
    if cfg.train.placement == "worker":
        from prorsa.rl.remote_trainer import open_remote_trainer

        return await open_remote_trainer(client, model_dir, config, cfg.train.trainer, cfg.train)
    from prorsa.train.protocol import make_trainer
    from prorsa.train.trainer import Trainer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    region = shared_region(run_dir) if cfg.train.weight_sync == "memory" else None
    return LocalTrainer(await asyncio.to_thread(make_trainer, cfg.train.trainer, model_dir, cfg.train,
                                                lambda: Trainer(model_dir, config)), region)


def unfinished(journal: RunJournal, taken: set[str], fmt) -> list[Finished]:
    """In the order the journal holds them, which is the order they finished. `fmt`: the engines'
    ChatFormat, whose tokenizer rebuilds the observations' ids (train/samples.py)."""
    import pyarrow.parquet as pq

    from prorsa.metrics.outputs import TRAJECTORY_SCHEMA
    from prorsa.train.samples import samples_from_rows

    out = []
    for part in journal.parts:
        for row in pq.read_table(journal.run_dir / part["file"], schema=TRAJECTORY_SCHEMA).to_pylist():
            if row["traj_id"] not in taken:
                version = row.get("policy_version") or 0
                out.append(Finished(row["traj_id"], version, next(iter(samples_from_rows([row], fmt, version)), None)))
    return out


async def open_learner(cfg: PipelineConfig, run_dir: Path, client: Client, addresses: dict[str, str],
                       now: Callable[[], float], journal: RunJournal | None = None) -> Learner:
    """`journal`: the run's; its flush makes what an update took durable before the state names
    it, and what it holds untaken is restored. None: no state is saved (nothing to resume into)."""
    trainer = await open_trainer(cfg, client, run_dir)
    learner = Learner(cfg.train, trainer, run_dir / WEIGHTS, push_weights(client, addresses),
                      cfg.workload.prompts * cfg.workload.group_size, cfg.workload.mode, now,
                      LearnerFiles(run_dir / TRAIN_LOG, run_dir / BATCHES,
                                   run_dir / STATE_DIR if journal is not None else None,
                                   journal.flush if journal is not None else None))
    if journal is not None:
        taken = await learner.load_state()
        if journal.done_ids - taken:
            from prorsa.agent.live_episode import ChatFormat

            fmt = await asyncio.to_thread(ChatFormat.load, await asyncio.to_thread(resolve_model_dir, cfg.engines))
            learner.restore(await asyncio.to_thread(unfinished, journal, taken, fmt))
    return learner
