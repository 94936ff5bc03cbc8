"""`prorsa run --resume RUN_DIR`: what a stopped run was, and what of it is already saved.

    resume_config(run_dir) -> PipelineConfig   the resolved pipeline the run started with
                                               (RUN_DIR/pipeline.json); ConfigError
    open_journal(cfg, run_dir) -> RunJournal   the run directory's journal, locked; JournalError
    write_out(run, run_dir, journal) -> dict   a run stopped during its write-out, its outputs
                                               written from what it saved, no cluster started

The workload is a function of the seed, so the resumed session draws the same trajectories
and the drivers leave out those the journal holds: the output has each exactly once. A partial
rollout's steps are not (which groups a step started depends on when others ended): it goes on
from the state its journal kept with the last commit (rollout/partial.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from prorsa.config.load import ConfigError, config_hash, describe
from prorsa.config.pipeline import PipelineConfig
from prorsa.metrics.journal import RunJournal

if TYPE_CHECKING:
    from prorsa.rollout.context import RunContext


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


def write_out(run: RunContext, run_dir: Path, journal: RunJournal) -> dict:
    """The journal says the rollout ended (journal.rolled_out) but not that the outputs were
    written: the driver died between the two. summary.json and metrics.nc are written after
    trajectories.parquet, each whole or not at all, so both there means only the seal was missed;
    else they are written as a resumed session that ran nothing would write them (figures over
    every saved trajectory; no engine samples, which went with the driver)."""
    from prorsa.live.run import ControlPlane, write_live_run
    from prorsa.metrics.outputs import resumed_figures
    from prorsa.metrics.recorder import RunRecorder

    summary, metrics = run_dir / "summary.json", run_dir / "metrics.nc"
    written = summary.exists() and metrics.exists()
    saved = journal.finish()
    if not written:
        cfg = run.cfg
        rec = RunRecorder(engines=[e.name for e in run.engines], slots=cfg.engines.slots,
                          expected=run.expected, completed=journal.completed_before,
                          failed=journal.failed_before, dropped=journal.dropped_before)
        write_live_run(run_dir, run, rec, 0.0, cfg.policy, ControlPlane(0, 0, 0, [], [], 0.0, 0),
                       journal.saved_before, resumed_figures(saved, journal.elapsed_before))
    journal.seal()
    return json.loads(summary.read_text())
