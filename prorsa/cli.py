"""`prorsa`: the command line.

    prorsa run PIPELINE [KEY=VALUE...] [--engine B] [--policy P] [--seed S] [--output DIR]
               [--cluster FILE|ADDRESS]                             a live rollout
    prorsa run --resume RUN_DIR                                     finish a stopped run
    prorsa serve PIPELINE [KEY=VALUE...] [--host H] [--port N]      an OpenAI-compatible endpoint on
                                                                   the pipeline's engines
    prorsa sim PIPELINE [KEY=VALUE...] [--policy P,Q,...] [--gpus N] [--output DIR]  the same in virtual time
    prorsa sweep SWEEP [KEY=VALUE...] [--cluster FILE|ADDRESS] [--output DIR] [--workers N]  a grid of sims
    prorsa validate FILE... [--plan [--cluster FILE]]               check pipelines, sweeps, cluster files, traces
    prorsa report RUN_DIR... [SWEEP.nc...] [--output DIR] [--format png|svg|pdf] [--dpi N]
                                                                   plots and report.md of stored runs
    prorsa trace import SOURCE --output FILE [--format F]          recorded agent runs as a Prorsa trace
    prorsa model make-tiny DIR                                      a tiny random Llama for vLLM on CPU
    prorsa sft --model tiny|DIR --task arith --steps N --output DIR  supervised warm-up for RL
    prorsa calibrate PIPELINE [--output FILE]                       fit a hardware profile to one engine
    prorsa calibrate --from-measurements FILE --gpu NAME [--model M]  fit a GPU profile to timed steps

KEY=VALUE overrides any field of the pipeline (workload.prompts=64, engines.vllm.model=DIR), read as
YAML and checked by the same schema (on sweep: fixed for every point, as the file's overrides:).
--output is always exactly where the command writes: the run folder of run, the results folder of
sim and sweep, the report folder, the profile file of calibrate. -v logs more, before or after the
command. Bad input ends with one line on stderr and exit code 2; no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import shutil
import signal
import sys
from dataclasses import replace
from pathlib import Path

import click
from rich.console import Console

from prorsa.config.load import ConfigError
from prorsa.metrics.run_dirs import output_problem


def _fail(msg: str) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(2)


def _load(path: str, overrides: dict):
    """The pipeline resolved (rollout/context.py): schema and cross-checks, or one error line."""
    from prorsa.rollout.context import load_run

    try:
        return load_run(path, overrides)
    except ConfigError as e:
        _fail(str(e))


def _or_fail(fn, *args):
    try:
        return fn(*args)
    except ConfigError as e:
        _fail(str(e))


def _check_vllm(cfg, pipeline: str) -> None:
    import importlib.util

    from prorsa.engine.registry import resolve_model_dir

    if importlib.util.find_spec("vllm") is None:
        _fail(f"{pipeline}: engines.backend is vllm but vLLM is not installed "
              "(run ./setup.sh, or use --engine emulated)")
    try:
        resolve_model_dir(cfg.engines)
    except ValueError as e:
        _fail(f"{pipeline}: {e}")


def _check_devices(resolved, cluster, source: str, show: Console | None = None) -> None:
    """Refuse engines that do not fit the node's GPUs before anything starts (a local run: every
    engine on this machine; batch jobs are given theirs, and an engine larger than one job's
    `engines.gpus` is planned over several nodes); `show`: print the launch plan.
    ConfigError says why not."""
    from prorsa.cluster.devices import DevicePlanError
    from prorsa.cluster.launch_plan import launch_plan, print_plan
    from prorsa.cluster.nodes import spanning_engines
    from prorsa.config.cluster import AddressSpec, LocalSpec, PbsSpec, SlurmSpec
    from prorsa.engine.registry import hosted_engines

    local = cluster is None or isinstance(cluster, LocalSpec)
    node_gpus = cluster.job("engines").gpus if isinstance(cluster, SlurmSpec | PbsSpec) else None
    engines = hosted_engines(resolved.cfg)
    try:
        if show is None and not local:  # batch jobs: one per node of an engine spanning nodes
            spans = spanning_engines(engines, node_gpus)
            if spans and isinstance(cluster, AddressSpec):
                # a running scheduler's workers are engines, tools and the trainer: none is a further node
                i, span = next(iter(spans.items()))
                raise ConfigError(f"{source}: engine-{i} spans {span.nodes} nodes of "
                                  f"{engines.vllm.node_ranks} ranks (engines.vllm.node_ranks); engines spanning "
                                  "nodes are launched on a local cluster or batch jobs, not on a running scheduler")
            return
        if show is None and engines.backend != "vllm":
            return
        plans = launch_plan(engines, _initial_roles(resolved), local, node_gpus=node_gpus)
    except DevicePlanError as e:
        raise ConfigError(f"{source}: {e}") from None
    if show is not None:
        print_plan(plans, show)


def _initial_roles(resolved) -> list:
    from prorsa.control.policy import make_policy

    return make_policy(resolved.cfg.policy, resolved.policy).initial_roles(resolved.cfg.engines.count)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _as_sigint(signum, frame) -> None:
    os.kill(os.getpid(), signal.SIGINT)


FAILED = "failed.json"


def _failed_start(run_dir: Path, fresh: bool, msg: str) -> str:
    """A run whose cluster or engines never started leaves no half-made directory: a new one with
    nothing to read is removed; else it is marked failed (RUN_DIR/failed.json) beside the engine
    logs that say why, and the error line points at them."""
    logs = sorted((run_dir / "engines").glob("*.log"))
    if fresh and not logs:
        shutil.rmtree(run_dir, ignore_errors=True)
        return msg
    (run_dir / FAILED).write_text(json.dumps({"stage": "start", "error": msg}) + "\n")
    return msg + (f" (engine logs: {run_dir / 'engines'})" if logs else "")


def _run_dir_at(target: Path) -> Path:
    """--output: the run folder itself; a folder that holds anything already is refused, so no
    run is written over another."""
    if (problem := output_problem(target, "")) is not None:  # a file in the way, a place no folder can go
        _fail(f"--output: got '{target}'; {problem}")
    try:
        if target.exists() and any(target.iterdir()):
            _fail(f"--output: {target} exists and is not empty (it is the run folder itself; "
                  f"output_dir={target} makes a new run folder under it, --resume {target} finishes a stopped run)")
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _fail(f"--output: cannot make {target} ({e.strerror or e})")
    return target


def _interrupted(run_dir: Path, fresh: bool) -> str:
    """An interrupted run keeps what its journal committed; one interrupted before anything was
    committed is a start that did not finish (_failed_start)."""
    from prorsa.metrics.journal import MANIFEST

    if (run_dir / MANIFEST).exists():
        return f"interrupted; finished trajectories kept in {run_dir} (prorsa run --resume {run_dir})"
    return _failed_start(run_dir, fresh, "interrupted before any trajectory was saved")


def _new_run_dir(base: Path, name: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = base / f"{name}-{stamp}"
    suffix = 1
    try:
        while run_dir.exists():
            suffix += 1
            run_dir = base / f"{name}-{stamp}-{suffix}"
        run_dir.mkdir(parents=True)
    except OSError as e:  # a file where a directory goes, no permission, a name too long
        _fail(f"{base}: cannot make the run directory {run_dir.name} there ({e.strerror or e})")
    return run_dir


OVERRIDES = click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
PRIOR = click.option("--prior", metavar="RUN_DIR", type=click.Path(),
                     help="What prorsa may assume before it observes: an earlier run's directory (or a prorsa sim "
                          "--output folder); its trajectories' means pick the opening roles. Default: the "
                          "pipeline's prior:, else none (start all mixed and learn).")


def _prior(path: str | None) -> str | None:
    return None if path is None else str(Path(path).resolve())


def _overrides(items: tuple[str, ...], **options) -> dict:
    """KEY=VALUE arguments (hydra's form: workload.prompts=64), then the named options over them."""
    from prorsa.config.load import parse_overrides

    given = _or_fail(parse_overrides, items)
    return given | {k: v for k, v in options.items() if v is not None}


def _log_level(verbose: bool) -> None:
    import dask

    # distributed configures its own loggers on import; tell it before it is imported
    dask.config.set({"logging": {"distributed": "info" if verbose else "error",
                                 "tornado": "info" if verbose else "error",
                                 "bokeh": "info" if verbose else "error"}})
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger().setLevel(level)  # a second call (-v after the command) has a handler already


def _verbose_after(ctx: click.Context, param: click.Parameter, verbose: bool) -> None:
    if verbose:  # `prorsa run X -v`: the group has set the quiet level already
        _log_level(True)


VERBOSE_HELP = "Log what Dask and the engines do."


def _verbose_everywhere(group: click.Group) -> None:
    """-v after the command as well as before it (`prorsa run X -v`, `prorsa -v run X`)."""
    for cmd in group.commands.values():
        cmd.params.append(click.Option(["-v", "--verbose"], is_flag=True, expose_value=False,
                                       callback=_verbose_after, help=VERBOSE_HELP))
        if isinstance(cmd, click.Group):
            _verbose_everywhere(cmd)


@click.group()
@click.version_option(package_name="prorsa", message="prorsa %(version)s")
@click.option("-v", "--verbose", is_flag=True, help=VERBOSE_HELP)
def main(verbose: bool) -> None:
    """Prorsa: agentic RL rollout with prefill/decode disaggregation on Dask."""
    _log_level(verbose)


@main.command()
@click.argument("pipeline", required=False, type=click.Path(dir_okay=False))
@OVERRIDES
@click.option("--engine", type=click.Choice(["emulated", "vllm"]), help="Override engines.backend.")
@click.option("--policy", help="Override the policy, e.g. colocated or static:2:1.")
@click.option("--seed", type=int, help="Override the pipeline's seed (the workload is drawn from it).")
@click.option("--output", type=click.Path(),
              help="The run folder itself, new or empty (default: <output_dir>/<name>-<timestamp>/).")
@click.option("--cluster", "cluster_opt", metavar="FILE|ADDRESS",
              help="Where the workers run: a cluster file (cluster/slurm.yaml, pbs.yaml, local.yaml) or a "
                   "running scheduler, tcp://host:8786 (default: a LocalCluster).")
@click.option("--resume", "resume_dir", metavar="RUN_DIR", type=click.Path(),
              help="Finish a stopped run: its pipeline.json, the trajectories it has not saved yet.")
@PRIOR
@click.option("--dry-run", is_flag=True, help="Print the launch plan (every engine's GPUs or cores, role, "
                                              "layout and server command line) and start nothing.")
def run(pipeline: str | None, overrides: tuple[str, ...], engine: str | None, policy: str | None,
        seed: int | None, output: str | None, cluster_opt: str | None, resume_dir: str | None,
        prior: str | None, dry_run: bool) -> None:
    """Roll out PIPELINE on a local Dask cluster and write runs/<name>-<timestamp>/ (or --output).
    KEY=VALUE arguments override the pipeline's fields, e.g. workload.prompts=64."""
    from prorsa.metrics.journal import JournalError
    from prorsa.live.resume import open_journal, resume_config
    from prorsa.rollout.context import resolve

    if (pipeline is None) == (resume_dir is None):
        _fail("give a PIPELINE to start a run, or --resume RUN_DIR to finish one")
    if resume_dir is not None:
        if engine or policy or output or prior or seed is not None or overrides:
            _fail("--resume runs the pipeline the run started with; drop --engine, --policy, --seed, "
                  "--output, --prior and KEY=VALUE overrides")
        pipeline = f"{resume_dir}/pipeline.json"
        resolved = _or_fail(resolve, _or_fail(resume_config, resume_dir), pipeline)
        run_dir = Path(resume_dir)
    else:
        resolved = _load(pipeline, _overrides(overrides, **{"engines.backend": engine, "policy": policy,
                                                            "seed": seed, "prior": _prior(prior)}))
    cfg = resolved.cfg
    cells = cfg.runtime.cells > 1
    if cells and resume_dir:
        _fail(f"{resume_dir}: runtime.cells: a run over {cfg.runtime.cells} cells cannot be resumed yet; "
              "start it again without --resume")
    if cells and cluster_opt:
        _fail(f"{pipeline}: runtime.cells: each of the {cfg.runtime.cells} cells starts a local cluster of its own; "
              "drop --cluster")
    from prorsa.cluster.launch import ClusterError
    from prorsa.config.cluster import cluster_option
    from prorsa.metrics.progress import summary_table
    from prorsa.cluster.local import EngineStartFailed
    from prorsa.live.interrupt import Interrupted, run_interruptible
    from prorsa.live.cells import run_cells_dir
    from prorsa.live.run import run_live

    try:
        cluster = cluster_option(cluster_opt) if cluster_opt else None
    except ConfigError as e:
        _fail(str(e))

    console = Console(stderr=False)
    _or_fail(_check_devices, resolved, cluster, pipeline or resume_dir, console if dry_run else None)
    if dry_run:
        if cells:
            from prorsa.rollout.cells import plan_cells

            console.print(plan_cells(cfg, cfg.runtime.cells).describe())
        return
    if cfg.scheduling.oracle:
        _fail(f"{pipeline}: scheduling.oracle reads the workload's future: the simulator's alone (prorsa sim)")
    if cfg.engines.backend == "vllm":
        _check_vllm(cfg, pipeline)
    if resume_dir is None:
        run_dir = _run_dir_at(Path(output)) if output else _new_run_dir(Path(cfg.output_dir), cfg.name)
        (run_dir / "pipeline.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
    try:
        journal = open_journal(cfg, run_dir)
    except JournalError as e:
        _fail(str(e))
    (run_dir / FAILED).unlink(missing_ok=True)  # a start that failed before is this session's to retry
    if journal.complete:
        journal.close()
        console.print(f"{run_dir}: every trajectory is saved; nothing left to run")
        return
    console.print(f"run directory: {run_dir}" + (f" ({len(journal.done_ids)} trajectories saved earlier)"
                                                 if resume_dir else ""))
    # SIGTERM (a batch system, `timeout`) unwinds as Ctrl-C does, so engines, servers and jobs are
    # stopped: during the run both stop the rollout and let the cleanup finish (live/interrupt.py);
    # before the loop runs, SIGTERM is passed on as SIGINT
    signal.signal(signal.SIGTERM, _as_sigint)
    try:
        rollout = (run_cells_dir(resolved, run_dir, console, journal) if cells else
                   run_live(resolved, run_dir, console, journal=journal, cluster=cluster))
        summary = asyncio.run(run_interruptible(rollout,
                                                abandon=lambda: _interrupted(run_dir, resume_dir is None)))
    except ClusterError as e:
        _fail(_failed_start(run_dir, resume_dir is None, f"{cluster_opt}: {e}"))
    except EngineStartFailed as e:
        _fail(_failed_start(run_dir, resume_dir is None, f"{pipeline or resume_dir}: engines did not start: {e}"))
    except (Interrupted, KeyboardInterrupt, asyncio.CancelledError):
        _fail(_interrupted(run_dir, resume_dir is None))
    console.print(summary_table(summary))
    console.print(f"wrote {run_dir}")
    if summary["trajectories_failed"]:
        sys.exit(1)


@main.command()
@click.argument("pipeline", type=click.Path(dir_okay=False))
@OVERRIDES
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback only unless told otherwise).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port (0: any free one).")
@click.option("--engine", type=click.Choice(["emulated", "vllm"]), help="Override engines.backend.")
@click.option("--policy", help="Override the policy, e.g. colocated or static:1:1.")
@click.option("--output", type=click.Path(),
              help="The run folder itself, new or empty (default: <output_dir>/<name>-<timestamp>/).")
@click.option("--idle-s", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="A conversation with no request for this long ends (its trajectory is saved).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True,
              help="A reply's cap when a request sets no max_tokens.")
def serve(pipeline: str, overrides: tuple[str, ...], host: str, port: int, engine: str | None,
          policy: str | None, output: str | None, idle_s: float, max_tokens: int) -> None:
    """Serve PIPELINE's engines as an OpenAI-compatible endpoint (/v1/chat/completions, /v1/completions,
    /v1/models): each conversation is a trajectory, saved in the run folder when it ends or the
    server stops (Ctrl-C)."""
    from prorsa.cluster.local import EngineStartFailed
    from prorsa.live.interrupt import Interrupted, run_interruptible
    from prorsa.live.resume import open_journal
    from prorsa.live.run import run_live
    from prorsa.metrics.progress import summary_table
    from prorsa.serve.server import Endpoint, listen, load_tokenizer

    resolved = _load(pipeline, _overrides(overrides, **{"engines.backend": engine, "policy": policy}))
    cfg = resolved.cfg
    if cfg.runtime.cells > 1:
        _fail(f"{pipeline}: runtime.cells: prorsa serve serves one cell; set runtime.cells 1")
    if cfg.train is not None:
        _fail(f"{pipeline}: prorsa serve rolls out for the client's own trainer; drop the train: section")
    if cfg.partial_rollout is not None:
        _fail(f"{pipeline}: partial_rollout: prorsa serve has no steps, its clients' conversations are the "
              "trajectories; drop the partial_rollout: section")
    if cfg.engines.backend == "vllm":
        _check_vllm(cfg, pipeline)
    try:
        tokenizer = load_tokenizer(resolved)
    except (OSError, ValueError) as e:
        _fail(f"{pipeline}: engines.vllm.model: cannot load the model's tokenizer ({e})")
    try:
        sock = listen(host, port)
    except OSError as e:
        _fail(f"--host/--port: cannot listen on {host}:{port} ({e.strerror or e})")
    run_dir = _run_dir_at(Path(output)) if output else _new_run_dir(Path(cfg.output_dir), cfg.name)
    (run_dir / "pipeline.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
    console = Console(stderr=False)
    console.print(f"run directory: {run_dir}")
    endpoint = Endpoint(resolved, sock, tokenizer, idle_s, max_tokens,
                        say=lambda line: console.print(line, soft_wrap=True, markup=False, highlight=False))
    signal.signal(signal.SIGTERM, _as_sigint)
    try:
        summary = asyncio.run(run_interruptible(
            run_live(resolved, run_dir, console, journal=open_journal(cfg, run_dir), driver=endpoint.driver),
            abandon=lambda: _interrupted(run_dir, True), wind_down=endpoint.stop))
    except EngineStartFailed as e:
        _fail(_failed_start(run_dir, True, f"{pipeline}: engines did not start: {e}"))
    except (Interrupted, KeyboardInterrupt, asyncio.CancelledError):
        _fail(_interrupted(run_dir, True))
    console.print(summary_table(summary))
    console.print(f"wrote {run_dir}")


@main.command()
@click.argument("pipeline", type=click.Path(dir_okay=False))
@OVERRIDES
@click.option("--policy", "policies", default="colocated,static:*,reactive,prorsa,oracle", show_default=True,
              help="Comma-separated policies; static:* is every static:P:D split.")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs in all (engines = GPUs / (tp x ep)).")
@click.option("--gpu", help="Hardware profile, e.g. h200 (configs/hardware).")
@click.option("--model", help="Model profile, e.g. qwen3-30b-a3b (configs/models).")
@click.option("--tp", type=click.IntRange(min=1), help="Tensor parallelism per engine.")
@click.option("--ep", type=click.IntRange(min=1), help="Expert parallelism (MoE models).")
@click.option("--prefix-cache", type=click.Choice(["ideal", "lru"]), help="Override engines.prefix_cache.")
@click.option("--seed", type=int, help="Override the pipeline's seed (the workload is drawn from it).")
@click.option("--output", type=click.Path(),
              help="The results folder itself: results.nc and runs/<policy>/ (default: print only).")
@click.option("--model-error", metavar="FACTORS",
              help="The policies plan with a cost model wrong by these throughput factors while the engines "
                   "keep the true one, e.g. prefill=0.8,decode=1.25 (prefill: compute, decode: memory, "
                   "transfer: links).")
@PRIOR
def sim(pipeline: str, overrides: tuple[str, ...], policies: str, gpus: int | None, gpu: str | None,
        model: str | None, tp: int | None, ep: int | None, prefix_cache: str | None, seed: int | None,
        output: str | None, model_error: str | None, prior: str | None) -> None:
    """Simulate PIPELINE's rollout in virtual time under each policy and compare them.
    KEY=VALUE arguments override the pipeline's fields, e.g. workload.prompts=64."""
    overrides = _overrides(overrides, **{"engines.gpu": gpu, "engines.model": model, "engines.tp": tp,
                                         "engines.ep": ep, "engines.prefix_cache": prefix_cache, "seed": seed,
                                         "prior": _prior(prior)})
    if "engines.count" in overrides:  # --policy picks what runs; the pipeline's own need not fit the count
        overrides.setdefault("policy", "colocated")
    resolved = _load(pipeline, overrides)
    if gpus is not None and resolved.cfg.engines.groups is not None:
        _fail("--gpus: engines.groups size every engine; change the groups' counts instead")
    if gpus is not None:
        per_engine = resolved.cfg.engines.tp * resolved.cfg.engines.ep  # an EP engine is a DP-attention group of ep ranks
        if gpus % per_engine:
            _fail(f"--gpus {gpus} is not a multiple of engines.tp x engines.ep = {per_engine}")
        resolved = _load(pipeline, overrides | {"engines.count": gpus // per_engine, "policy": "colocated"})
    cfg = resolved.cfg
    if cfg.runtime.cells > 1:
        _fail(f"{pipeline}: runtime.cells: prorsa sim simulates one cell (benchmarks/cells.py --sim simulates "
              "cells); set runtime.cells 1")
    from prorsa.sim.compare import compare, comparison_table, expand_policies
    from prorsa.sim.run import write_run

    specs = expand_policies([p.strip() for p in policies.split(",") if p.strip()], cfg.engines.count)
    from prorsa.costmodel.misfit import ModelScale

    try:
        scale = ModelScale.parse(model_error) if model_error else None
    except ValueError as err:
        _fail(f"--model-error: {err}")
    from prorsa.control.policy import make_policy

    # only to check the specs: the oracle is given a future here that it never reads
    context = replace(resolved.policy, future=lambda traj_id: None)
    try:
        for spec in specs:
            make_policy(spec, context).initial_roles(cfg.engines.count)
    except ValueError as e:
        _fail(f"--policy: {e}")
    console = Console(stderr=False)
    e = cfg.engines
    sizes = (f"(tp={e.tp}, ep={e.ep})" if e.groups is None else
             "in groups " + ", ".join(f"{g.count} x tp{g.tp} ep{g.ep} {'/'.join(g.roles)}" for g in e.engine_groups))
    console.print(f"simulating {cfg.name}: {e.count} x {e.gpu} engines {sizes} serving "
                  f"{e.model}, {cfg.workload.mode} {cfg.workload.label}, {len(specs)} policies")
    out = Path(output) if output else None
    if out is not None and (problem := output_problem(out, "runs")):  # before minutes of simulation
        _fail(f"--output: got {output!r}; {problem}")

    def done(run) -> None:
        s = run.summary
        console.print(f"  {run.policy}: {s['makespan_s']:.2f} s, {s['role_switches']} switches "
                      f"({run.wall_s:.1f} s to simulate)")
        if out is not None:
            write_run(run, out / "runs" / run.policy.replace(":", "_"))

    ds, _ = compare(cfg, specs, done, scale)
    console.print(comparison_table(ds))
    if out is not None:
        from prorsa.metrics.outputs import write_dataset
        write_dataset(out / "results.nc", ds)
        console.print(f"wrote {out}")


INTERRUPTED_SWEEP = "interrupted; finished points are kept, run the same command to resume"


@main.command()
@click.argument("sweep_file", metavar="SWEEP", type=click.Path(dir_okay=False))
@OVERRIDES
@click.option("--cluster", "cluster_opt", metavar="FILE|ADDRESS",
              help="A cluster file (cluster/slurm.yaml, ...) or a running scheduler, tcp://host:8786 "
                   "(default: a LocalCluster).")
@click.option("--output", type=click.Path(),
              help="The results folder itself (default: <output_dir>/sweep-<name>/); running again resumes it.")
@click.option("--workers", type=click.IntRange(min=1), help="LocalCluster worker processes (default: one per core).")
def sweep(sweep_file: str, overrides: tuple[str, ...], cluster_opt: str | None, output: str | None,
          workers: int | None) -> None:
    """Simulate every point of SWEEP's grid as Dask tasks; write sweep.nc and speedup.png.
    KEY=VALUE arguments override the base pipeline's fields at every point, e.g. workload.prompts=64."""
    from prorsa.cluster.launch import ClusterError
    from prorsa.config.cluster import cluster_option
    from prorsa.live.interrupt import stops_hard
    from prorsa.sim.sweep import sweep_on_cluster

    try:
        cluster = cluster_option(cluster_opt) if cluster_opt else None
    except ConfigError as e:
        _fail(str(e))
    if workers and cluster is not None and cluster.kind != "local":
        _fail("--workers sizes the LocalCluster; a --cluster brings its own workers")
    console = Console(stderr=False)
    try:
        with stops_hard(lambda: INTERRUPTED_SWEEP):  # closing a cluster that does not answer ends anyway
            done = sweep_on_cluster(Path(sweep_file), cluster, Path(output) if output else None, workers, console,
                                    _overrides(overrides))
    except ConfigError as e:
        _fail(str(e))
    except ClusterError as e:
        _fail(f"{cluster_opt}: {e}")
    except KeyboardInterrupt:
        _fail(INTERRUPTED_SWEEP)
    console.print(f"{len(done.computed)} simulated, {done.skipped} already done, {len(done.failed)} failed; "
                  f"wrote {done.out / 'sweep.nc'}" + (f" and {done.plot}" if done.plot else ""), soft_wrap=True)
    if done.failed:
        sys.exit(1)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--plan", is_flag=True, help="Also print each pipeline's launch plan, as prorsa run --dry-run does.")
@click.option("--cluster", "cluster_opt", metavar="FILE",
              help="With --plan: the cluster file the pipelines would run on (its engines.gpus is a node's GPUs).")
def validate(files: tuple[str, ...], plan: bool, cluster_opt: str | None) -> None:
    """Check pipeline and sweep FILES (and the traces they name) without running them."""
    from prorsa.config.cluster import cluster_option
    from prorsa.validate import check_file, file_kind

    try:
        cluster = cluster_option(cluster_opt) if cluster_opt else None
    except ConfigError as e:
        _fail(str(e))
    bad = 0
    for f in files:
        try:
            click.echo(check_file(f))
        except ConfigError as e:
            click.echo(f"error: {e}", err=True)
            bad += 1
            continue
        if plan and file_kind(f) == "pipeline":
            try:
                _check_devices(_load(f, {}), cluster, f, show=Console())
            except ConfigError as e:
                click.echo(f"error: {e}", err=True)
                bad += 1
    sys.exit(2 if bad else 0)


@main.command()
@click.argument("pipeline", required=False, type=click.Path(dir_okay=False))
@click.option("--output", type=click.Path(dir_okay=False),
              help="The hardware profile file itself (default configs/hardware/cpu.yaml; with --from-measurements, "
                   "the --gpu profile itself); the model profile goes to models/<model>.yaml beside a "
                   "hardware/ directory, else next to it.")
@click.option("--quick", is_flag=True, help="A few points only: a smoke test, not a profile to keep.")
@click.option("--seed", type=int, help="Seed of the measured prompts' random tokens (default: the pipeline's seed).")
@click.option("--from-measurements", "measurements", type=click.Path(exists=True, dir_okay=False),
              help="Fit a step-time file of benchmarks/gpu_profile.py instead of measuring an engine.")
@click.option("--gpu", help="With --from-measurements: the base hardware profile (name or YAML) whose "
                            "datasheet values stay and whose efficiencies are fitted.")
@click.option("--model", "model_name", default="qwen3-8b", show_default=True,
              help="With --from-measurements: the model profile measured (its mfu_linear is fitted).")
@click.option("--from-run", "run_dirs", type=click.Path(file_okay=False), multiple=True,
              help="Correct a finished live run's hardware profile to that run: the engines' share of "
                   "their calibrated speed (vLLM CPU engines: their load on the shared host), the time "
                   "per leg outside them, a KV pull's fixed cost (default output: "
                   "configs/hardware/<profile>-live.yaml). Repeat it to pool runs of one pipeline.")
def calibrate(pipeline: str | None, output: str | None, quick: bool, seed: int | None, measurements: str | None,
              gpu: str | None, model_name: str, run_dirs: tuple[str, ...]) -> None:
    """Measure step times on one engine of PIPELINE's backend and fit the cost model to them; or fit
    a GPU profile to a step-time file (--from-measurements FILE --gpu NAME); or correct a profile
    to a live run (--from-run RUN_DIR)."""
    if measurements:
        _calibrate_from_file(measurements, gpu, model_name, output)
        return
    if run_dirs:
        _calibrate_from_runs([Path(d) for d in run_dirs], output)
        return
    if not pipeline:
        _fail("give a PIPELINE to measure, or --from-measurements FILE --gpu NAME")
    output = output or "configs/hardware/cpu.yaml"
    cfg = _load(pipeline, {}).cfg
    if cfg.engines.backend != "vllm":
        _fail(f"{pipeline}: engines.backend is {cfg.engines.backend}; calibrate measures vllm engines")
    _check_vllm(cfg, pipeline)
    from prorsa.engine.measure import DEFAULT_PLAN, QUICK_PLAN, calibrate_pipeline

    seed = cfg.seed if seed is None else seed
    command = f"prorsa calibrate {pipeline} --output {output} --seed {seed}" + (" --quick" if quick else "")
    signal.signal(signal.SIGTERM, _raise_interrupt)  # so the engine is stopped
    try:
        lines = calibrate_pipeline(cfg, QUICK_PLAN if quick else DEFAULT_PLAN, Path(output), command,
                                   _new_run_dir(Path(cfg.output_dir), "calibrate"), click.echo, seed=seed)
    except KeyboardInterrupt:
        _fail("interrupted")
    except ValueError as e:
        _fail(str(e))
    click.echo("\n".join(lines))


def _calibrate_from_file(measurements: str, gpu: str | None, model_name: str, output: str | None) -> None:
    from prorsa.costmodel.profile_writer import model_path_for
    from prorsa.costmodel.profiles import config_dir
    from prorsa.costmodel.step_times import calibrate_from_file

    if not gpu:
        _fail("--from-measurements needs --gpu NAME: the base hardware profile to fit")
    if not output:
        output = gpu if gpu.endswith((".yaml", ".yml")) else str(config_dir() / "hardware" / f"{gpu}.yaml")
    model_out = model_path_for(Path(output), Path(model_name).stem)
    command = (f"prorsa calibrate --from-measurements {measurements} --gpu {gpu} --model {model_name} "
               f"--output {output}")
    try:
        lines = calibrate_from_file(Path(measurements), gpu, Path(output), model_name, model_out, command)
    except ValueError as e:
        _fail(str(e))
    click.echo("\n".join(lines))


def _calibrate_from_runs(run_dirs: list[Path], output: str | None) -> None:
    import statistics
    import tempfile

    from prorsa.costmodel.profile_writer import write_texts
    from prorsa.costmodel.profiles import config_dir
    from prorsa.sim.live_calibration import describe, fit_to_run, fitted_profile, load_live_run, simulate_with

    runs = []
    for run_dir in run_dirs:
        try:
            runs.append(load_live_run(run_dir))
        except ValueError as e:
            _fail(str(e))
    cfg = runs[0][0]
    for run_dir, (other, _, _) in zip(run_dirs[1:], runs[1:]):
        if other.model_dump(exclude={"output_dir"}) != cfg.model_dump(exclude={"output_dir"}):
            _fail(f"{run_dir}: not a run of the same pipeline as {run_dirs[0]} (pooled runs must share "
                  "their pipeline, seed included)")
    base = cfg.engines.gpu
    target = Path(output) if output else fitted_profile(cfg, config_dir() / "hardware")
    live = statistics.median(summary["makespan_s"] for _, summary, _ in runs)
    names = ", ".join(d.name for d in run_dirs)
    header = (f"{base} corrected to the live run(s) {names} (median makespan {live:.1f} s) by "
              f"`prorsa calibrate --from-run`, {dt.date.today()}")
    rows = [row for _, _, run_rows in runs for row in run_rows]
    with tempfile.TemporaryDirectory() as tmp:
        click.echo(f"simulating {names} ({len(runs[0][2])} trajectories) with {base} and correcting it ...")
        before, _ = simulate_with(cfg, base, Path(tmp) / "base")
        try:
            fits = fit_to_run(cfg, rows, Path(tmp), header)
        except ValueError as e:
            _fail(f"{run_dirs[0]}: {e}")
        fitted = fitted_profile(cfg, Path(tmp))
        after, _ = simulate_with(cfg, str(fitted), Path(tmp) / "fitted")
        write_texts({target: fitted.read_text()})
    click.echo("\n".join(describe(fits)))
    click.echo(f"makespan: live {live:.2f} s{' (median)' if len(runs) > 1 else ''}; simulated with {base} "
               f"{before:.2f} s ({before / live:.3f}), corrected {after:.2f} s ({after / live:.3f})")
    click.echo(f"wrote {target} (use it as engines.gpu; check it on another run: benchmarks/fidelity_vllm.py)")


@main.group()
def trace() -> None:
    """Traces: recorded agent runs to replay as a workload (workload.trace)."""


_BIG = 8 << 20  # bytes: below this an import is done before a bar would draw


def _importer_formats() -> dict:
    from prorsa.agent.importers import FORMATS

    return FORMATS



@trace.command("import", epilog="Formats: " + "; ".join(f"{n}: {f.summary}" for n, f in _importer_formats().items()))
@click.argument("source", type=click.Path(exists=True))
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False), help="The trace file to write (JSONL).")
@click.option("--format", "fmt", type=click.Choice(["auto", *_importer_formats()]), default="auto", show_default=True,
              help="The recording's format; auto tells it by content (a folder by its files).")
@click.option("--family", default="trace", show_default=True, help="Task-family label of every trajectory.")
@click.option("--decode-tps", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Gaps stamped start to start (or end to end) hold the model's own time as well as the tool's: "
                   "with RATE > 0 subtract completion_tokens / RATE from each (floored at 0); 0 takes them as "
                   "they are. Gaps a format measures as the tool's own time are never changed.")
@click.option("--releases", type=click.Choice(["auto", "recorded", "none"]), default="auto", show_default=True,
              help="Trajectory start times (start_s, from the first): recorded; none (all at once); auto: "
                   "recorded unless they span over 30 days (unrelated clocks).")
def trace_import(source: str, output: str, fmt: str, family: str, decode_tps: float, releases: str) -> None:
    """Turn recorded agent runs (SOURCE: a file or a folder) into a Prorsa trace: per model call, the
    tokens it appended (its prompt less the previous call's prompt and completion; a context reset
    starts afresh), the tokens it decoded, and the gap to the next call as tool time."""
    from prorsa.agent.importers import ImportOptions, detect, import_trace, work
    from prorsa.agent.trace import TraceError, write_trace

    path = Path(source)
    options = ImportOptions(family=family, decode_tps=decode_tps, releases=releases)
    try:
        name = detect(path) if fmt == "auto" else fmt
        total = work(path, name)
        console = Console(stderr=True)
        show = console.is_terminal and (total or 0) > (_BIG if path.is_file() else 100)
        with _import_bar(console, total, show) as advance:
            name, specs = import_trace(path, name, options, advance)
    except TraceError as e:
        _fail(str(e))
    out = Path(output)
    try:
        write_trace(out, specs)
    except OSError as e:
        _fail(f"--output: cannot write {out} ({e.strerror or e})")
    click.echo(f"wrote {out}: {len(specs)} trajectories, {sum(len(s.turns) for s in specs)} turns (read as {name})")


@contextlib.contextmanager
def _import_bar(console: Console, total: int | None, show: bool):
    """A callback advancing a progress bar over the source, drawn only for long reads on a terminal."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("import"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                  console=console, disable=not show) as bar:
        job = bar.add_task("import", total=total)
        yield lambda n: bar.advance(job, n)


@main.group()
def model() -> None:
    """Models for the vLLM engines."""


@model.command("make-tiny")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--seed", default=0, show_default=True, help="Weights seed (the tokenizer is fixed).")
@click.option("--vocab-size", default=2048, show_default=True, help="Tokens in the model's vocabulary.")
def make_tiny(directory: str, seed: int, vocab_size: int) -> None:
    """Make a tiny Llama-style model with random weights in DIRECTORY (no model hub needed)."""
    from prorsa.engine.tiny_model import make_tiny_model, weights_digest

    target = Path(directory)
    if target.exists() and any(target.iterdir()):
        _fail(f"{target}: directory exists and is not empty")
    make_tiny_model(target, seed=seed, vocab_size=vocab_size)
    click.echo(f"made {target} (weights sha256 {weights_digest(target)[:16]})")


@main.command()
@click.option("--model", "model_spec", default="tiny", show_default=True,
              help="A model directory, or tiny (made under .prorsa/models on first use).")
@click.option("--task", default="arith", show_default=True, help="A dataset with demonstrations.")
@click.option("--steps", default=60, show_default=True, type=click.IntRange(min=1), help="At most this many updates.")
@click.option("--batch-size", default=8, show_default=True, type=click.IntRange(min=1),
              help="Demonstrations per update.")
@click.option("--lr", default=1e-3, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Learning rate.")
@click.option("--tasks", "n_tasks", default=256, show_default=True, type=click.IntRange(min=1),
              help="Demonstrations to draw batches from.")
@click.option("--target-rate", default=0.4, show_default=True, type=click.FloatRange(0, 1),
              help="Stop once this share of sampled first turns is a call to the tool (1: run every step).")
@click.option("--eval-every", default=5, show_default=True, type=click.IntRange(min=1),
              help="Updates between evaluations of the tool-call rate.")
@click.option("--seed", default=0, show_default=True, help="Seed of the tasks, the batches and the sampling.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(min=1),
              help="torch threads (a tiny model is fastest on one).")
@click.option("--output", required=True, type=click.Path(), help="The warmed-up model directory.")
def sft(model_spec: str, task: str, steps: int, batch_size: int, lr: float, n_tasks: int, target_rate: float,
        eval_every: int, seed: int, threads: int, output: str) -> None:
    """Supervised warm-up: teach a model the tool-call format of TASK from demonstrations, and stop
    while it uses the format only sometimes, so RL has something to learn from."""
    from prorsa.train.sft import DEMONSTRATIONS

    if task not in DEMONSTRATIONS:
        _fail(f"--task: {task!r} has no demonstrations; expected one of {sorted(DEMONSTRATIONS)}")
    target = Path(output)
    if (problem := output_problem(target, "")) is not None:
        _fail(f"--output: got '{target}'; {problem}")
    if target.exists() and any(target.iterdir()):
        _fail(f"--output: {target}: directory exists and is not empty")
    if model_spec == "tiny":
        from prorsa.engine.tiny_model import ensure_tiny_model

        model_dir = ensure_tiny_model(".prorsa/models")
    else:
        model_dir = Path(model_spec)
        if not (model_dir / "config.json").is_file():
            _fail(f"--model: {model_dir}: not a model directory (no config.json)")
    _sft(model_dir, task, steps, batch_size, lr, n_tasks, target_rate, eval_every, seed, threads, target)


def _sft(model_dir: Path, task: str, steps: int, batch_size: int, lr: float, n_tasks: int, target_rate: float,
         eval_every: int, seed: int, threads: int, target: Path) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from prorsa.agent.datasets import make_dataset
    from prorsa.agent.live_episode import ChatFormat
    from prorsa.agent.tools.registry import make_tool
    from prorsa.agent.tools.toolbox import Toolbox
    from prorsa.train.sft import DEMONSTRATIONS, SftPlan, run_sft
    from prorsa.train.trainer import Trainer, TrainerConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its bars for loading and saving would cut into ours
    console = Console(stderr=False)
    trainer = Trainer(model_dir, TrainerConfig(lr=lr, micro_batch=batch_size, seed=seed, threads=threads))
    fmt = ChatFormat(trainer.tokenizer)
    tasks = make_dataset(task, n_tasks, seed)
    held_out = make_dataset(task, 8, seed + 1)
    schemas = Toolbox([make_tool(t.calls[0].name) for t in tasks[:1]]).schemas()
    plan = SftPlan(steps=steps, batch_size=batch_size, eval_every=eval_every,
                   target_call_rate=target_rate if target_rate < 1 else None, seed=seed)
    with Progress(TextColumn("sft"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[line]}"),
                  TimeElapsedColumn(), console=console, disable=not console.is_terminal) as bar:
        job = bar.add_task("sft", total=steps, line="")

        def on_step(st, ev) -> None:
            line = f"loss {st.policy_loss:.3f}" + (f"  call rate {ev.call_rate:.2f}" if ev is not None else "")
            bar.update(job, advance=1, line=line)
            if not console.is_terminal and ev is not None:
                console.print(f"step {st.version}: {line}")

        result = run_sft(trainer, tasks, held_out, DEMONSTRATIONS[task], fmt, schemas, plan, on_step)
    trainer.save(target)
    first, last = result.evals[0][1], result.evals[-1][1]
    console.print(f"{result.steps} steps ({'target reached' if result.stopped_early else 'all steps'}): "
                  f"tool-call rate {first.call_rate:.2f} -> {last.call_rate:.2f}, "
                  f"correct calls {first.correct_call_rate:.2f} -> {last.correct_call_rate:.2f}")
    console.print(f"wrote {target} (policy version {trainer.version})")


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--output", type=click.Path(),
              help="Directory for report.md and the plots (default: RUN_DIR/report for one run, "
                   "else report/ beside the first input).")
@click.option("--format", "fig_format", type=click.Choice(["png", "svg", "pdf"]), default="png", show_default=True,
              help="Figure file format.")
@click.option("--dpi", type=click.IntRange(50, 1200), default=150, show_default=True, help="PNG resolution.")
def report(inputs: tuple[str, ...], output: str | None, fig_format: str, dpi: int) -> None:
    """Plots and a Markdown summary of stored runs (RUN_DIR...) and sweep Datasets (FILE.nc)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        _fail("prorsa report needs matplotlib (pip install -e \".[plots]\")")
    from prorsa.metrics.plots import Style
    from prorsa.metrics.report import ReportError, default_output, split_inputs, write_report

    paths = [Path(p) for p in inputs]
    run_dirs, sweeps = split_inputs(paths)
    try:
        written = write_report(run_dirs, sweeps, Path(output) if output else default_output(paths),
                               Style(fig_format, dpi))
    except ReportError as e:
        _fail(str(e))
    click.echo(f"wrote {written}")


_verbose_everywhere(main)

if __name__ == "__main__":
    main()
