"""`prorsa run --resume RUN_DIR`: what a stopped run was, and what of it is already saved.

    resume_config(run_dir) -> PipelineConfig   the resolved pipeline the run started with
                                               (RUN_DIR/pipeline.json); ConfigError
    open_journal(cfg, run_dir) -> RunJournal   the run directory's journal, locked; JournalError

The workload is a function of the seed, so the resumed session draws the same trajectories
and the drivers leave out those the journal holds: the output has each exactly once. A partial
rollout's steps are not (which groups a step started depends on when others ended): it goes on
from the state its journal kept with the last commit (rollout/partial.py).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from prorsa.config.load import ConfigError, config_hash, describe
from prorsa.config.pipeline import PipelineConfig
from prorsa.metrics.journal import RunJournal


def resume_config(run_dir: str | Path) -> PipelineConfig:
    run_dir = Path(run_dir)
    path = run_dir / "pipeline.json"
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run directory")
    try:
        cfg = PipelineConfig.model_validate_json(path.read_bytes())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValidationError as e:
        raise ConfigError(f"{path}: {describe(e.errors()[0])}") from None
    if cfg.workload.mode == "async" and cfg.workload.duration_s is not None:
        # which trajectories a duration admits depends on timing: no session could say "the rest"
        raise ConfigError(f"{path}: workload.duration_s: a run bounded by time cannot be resumed; "
                          "bound it by workload.trajectories")
    return cfg


def open_journal(cfg: PipelineConfig, run_dir: Path) -> RunJournal:
    return RunJournal.open(run_dir, config_hash(cfg), cfg.runtime.output_batch, cfg.runtime.output_flush_s)
