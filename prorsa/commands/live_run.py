"""`prorsa run`: a live rollout of a pipeline on Dask, new or resumed, or its launch plan.

    RunRequest                 the command's arguments as given
    start_run(request)         refuse what cannot run, make or reopen the run folder, roll out,
                               print the summary; exit 1 when a trajectory failed
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from prorsa.commands.errors import fail, or_fail
from prorsa.commands.inputs import check_engines, cluster_from, load_pipeline, node_shape, prior_path, with_options
from prorsa.commands.run_folder import FAILED, RunFolder, failed_start, new_run_folder, run_folder_at, write_pipeline
from prorsa.commands.stopping import roll_out
from prorsa.console.clocked import command_console
from prorsa.console.progress import summary_table

if TYPE_CHECKING:
    from prorsa.config.cluster import ClusterSpec
    from prorsa.config.pipeline import PipelineConfig
    from prorsa.metrics.journal import RunJournal
    from prorsa.rollout.context import RunContext


@dataclass(frozen=True)
class RunRequest:
    pipeline: str | None
    overrides: tuple[str, ...]
    engine: str | None
    policy: str | None
    seed: int | None
    output: str | None
    cluster_opt: str | None
    resume_dir: str | None
    prior: str | None
    dry_run: bool
    gpus_per_node: int | None = None  # --dry-run: plan for nodes of this many GPUs
    devices: str | None = None  # --dry-run: plan for a node of these GPUs

    @property
    def source(self) -> str:
        """What error lines name: the pipeline, or the one the resumed run started with."""
        return self.pipeline or f"{self.resume_dir}/pipeline.json"


def start_run(request: RunRequest) -> None:
    resolved = _resolve(request)
    cfg = resolved.cfg
    cells = cfg.runtime.cells > 1
    if cells and request.resume_dir:
        fail(f"{request.resume_dir}: runtime.cells: a run over {cfg.runtime.cells} cells cannot be resumed yet; "
             "start it again without --resume")
    if cells and request.cluster_opt:
        fail(f"{request.source}: runtime.cells: each of the {cfg.runtime.cells} cells starts a local cluster of "
             "its own; drop --cluster")
    cluster = cluster_from(request.cluster_opt)
    if _planned_only(request, resolved, cluster):
        return
    if cfg.scheduling.oracle:
        fail(f"{request.source}: scheduling.oracle reads the workload's future: the simulator's alone (prorsa sim)")
    check_engines(cfg, request.source)
    _import_the_live_body()
    folder = _run_folder(request, cfg)
    journal = _open_journal(cfg, folder)
    console = command_console()
    if journal.complete:
        journal.close()
        console.print(f"{folder.path}: every trajectory is saved; nothing left to run")
        return
    if journal.rolled_out:  # stopped during its write-out: no cluster needed to finish it
        summary = _written_out(resolved, folder, journal)
        console.print(f"{folder.path}: every trajectory was saved; wrote its outputs", soft_wrap=True)
        console.print(summary_table(summary))
        return
    console.print(f"run directory: {folder.path}" + (f" ({len(journal.done_ids)} trajectories saved earlier)"
                                                     if request.resume_dir else ""))
    summary = _roll_out(request, resolved, folder, journal, cluster, console)
    console.print(summary_table(summary))
    console.print(f"wrote {folder.path}")
    if _loud_failures(summary, console) or summary["trajectories_failed"]:
        sys.exit(1)


def _loud_failures(summary: dict, console: Console) -> bool:
    """A reward or a tool that failed throughout said on the console (the summary counts them);
    True when nothing was scored, which ends the command non-zero."""
    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    calls = summary.get("tool_calls") or {}
    if calls and not calls.get("ok"):
        said = ", ".join(f"{status} {n}" for status, n in calls.items())
        say(f"warning: every tool call failed ({said}); the model saw each error as its observation")
    if errors := summary.get("reward_errors"):
        every = summary.get("reward_mean") is None
        say(f"{'error' if every else 'warning'}: the reward raised on {errors} trajectories"
            f"{' (every one)' if every else ''}, their reward NaN; the first: {summary['reward_error_first']}")
        return every
    return False


def _written_out(resolved: RunContext, folder: RunFolder, journal: RunJournal) -> dict:
    from prorsa.live.resume import write_out

    try:
        return write_out(resolved, folder.path, journal)
    except OSError as e:
        fail(f"{folder.path}: cannot write the run's outputs ({e.strerror or e})")
    finally:
        journal.close()


def _import_the_live_body() -> None:
    """Dask and the live body take seconds to import: done before the run folder exists, so that
    a Ctrl-C then ends as a start interrupted (stopping.roll_out), not in click's "Aborted!"."""
    import prorsa.cluster.launch  # noqa: F401
    import prorsa.cluster.local  # noqa: F401
    import prorsa.live.cells  # noqa: F401
    import prorsa.live.interrupt  # noqa: F401
    import prorsa.live.run  # noqa: F401


def _resolve(request: RunRequest) -> RunContext:
    from prorsa.live.resume import resume_config
    from prorsa.rollout.context import resolve

    if (request.pipeline is None) == (request.resume_dir is None):
        fail("give a PIPELINE to start a run, or --resume RUN_DIR to finish one")
    if request.resume_dir is None:
        return load_pipeline(request.pipeline, with_options(
            request.overrides, **{"engines.backend": request.engine, "policy": request.policy,
                                  "seed": request.seed, "prior": prior_path(request.prior)}))
    if (request.engine or request.policy or request.output or request.prior or request.seed is not None
            or request.overrides):
        fail("--resume runs the pipeline the run started with; drop --engine, --policy, --seed, "
             "--output, --prior and KEY=VALUE overrides")
    return or_fail(resolve, or_fail(resume_config, request.resume_dir), request.source)


def _planned_only(request: RunRequest, resolved: RunContext, cluster: ClusterSpec | None) -> bool:
    """Refuse engines that do not fit before anything starts; --dry-run: print the plan, and stop."""
    from prorsa.cluster.launch_check import check_launch
    from prorsa.cluster.launch_plan import print_plan

    if not request.dry_run and (request.gpus_per_node is not None or request.devices is not None):
        fail("--gpus-per-node and --devices say which node a plan is for: give --dry-run too (a run's own GPUs: "
             "engines.devices or CUDA_VISIBLE_DEVICES)")
    shape = node_shape(request.gpus_per_node, request.devices)
    plans = or_fail(check_launch, resolved, cluster, request.source, request.dry_run, shape)
    if not request.dry_run:
        return False
    console = command_console(clocked=False)  # a plan's commands, to paste: no clock
    print_plan(plans, console, shape)
    if resolved.cfg.runtime.cells > 1:
        from prorsa.rollout.cells import plan_cells

        console.print(plan_cells(resolved.cfg, resolved.cfg.runtime.cells).describe())
    return True


def _run_folder(request: RunRequest, cfg: PipelineConfig) -> RunFolder:
    if request.resume_dir is not None:
        return RunFolder(Path(request.resume_dir), fresh=False)
    folder = run_folder_at(Path(request.output)) if request.output else new_run_folder(Path(cfg.output_dir), cfg.name)
    write_pipeline(folder, cfg)
    return folder


def _open_journal(cfg: PipelineConfig, folder: RunFolder) -> RunJournal:
    from prorsa.live.resume import open_journal
    from prorsa.metrics.journal import JournalError

    try:
        journal = open_journal(cfg, folder.path)
    except JournalError as e:
        fail(str(e))
    (folder.path / FAILED).unlink(missing_ok=True)  # a start that failed before is this run's to retry
    return journal


def _roll_out(request: RunRequest, resolved: RunContext, folder: RunFolder, journal: RunJournal,
              cluster: ClusterSpec | None, console: Console) -> dict:
    from prorsa.cluster.launch import ClusterError
    from prorsa.live.cells import run_cells_dir
    from prorsa.live.run import run_live
    from prorsa.sim.run import lend

    rollout = (run_cells_dir(resolved, folder.path, console, journal) if resolved.cfg.runtime.cells > 1 else
               run_live(resolved, folder.path, console, journal=journal, cluster=cluster, lend=lend))
    try:
        return roll_out(rollout, folder, request.source)
    except ClusterError as e:
        fail(failed_start(folder, f"{request.cluster_opt}: {e}"))
