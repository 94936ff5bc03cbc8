"""`prorsa`: the command line.

    prorsa run PIPELINE [KEY=VALUE...] [--engine B] [--policy P] [--seed S] [--output DIR]
               [--cluster FILE|ADDRESS]                             a live rollout
    prorsa run PIPELINE --dry-run [--gpus-per-node N | --devices 0,1,...]   its launch plan only
    prorsa run --resume RUN_DIR                                     finish a stopped run
    prorsa serve PIPELINE [KEY=VALUE...] [--host H] [--port N]      an OpenAI-compatible endpoint on
                                                                   the pipeline's engines
    prorsa sim PIPELINE [KEY=VALUE...] [--policy P,Q,...] [--gpus N] [--output DIR] [--format table|csv|json]
                                                                   the same in virtual time
    prorsa sweep SWEEP [KEY=VALUE...] [--cluster FILE|ADDRESS] [--output DIR] [--workers N]  a grid of sims
    prorsa validate FILE... [--plan [--cluster FILE] [--gpus-per-node N]]  check pipelines, sweeps, cluster
                                                                   files, traces
    prorsa certs DIR                                                test TLS certificates for a cluster file
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
sim and sweep, the report folder, the profile file of calibrate. -v logs Prorsa's own steps, -vv
Dask's and vLLM's too, before or after the command. Bad input ends with one line on stderr and
exit code 2; no traceback.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading


def _interrupted_while_loading(signum, frame) -> None:
    """Ctrl-C before a command runs (click and the command's imports loading): one line and exit
    2, as once _Prorsa.invoke handles it; the interrupt would otherwise land in an import as a
    KeyboardInterrupt traceback."""
    sys.stderr.write("error: interrupted\n")
    sys.stderr.flush()
    os._exit(2)


# only where this module is the program (`prorsa`, `python -m prorsa.cli`) and Ctrl-C is Python's
# default (a program that imports it, or a shell that started it ignoring SIGINT, keeps its own)
if (__name__ == "__main__" or os.path.basename(sys.argv[0]) == "prorsa") \
        and threading.current_thread() is threading.main_thread() \
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted_while_loading)

import click  # noqa: E402  (after the handler: loading click is most of a start's first half second)

# Each command's work is in prorsa/commands/, imported when the command runs: `prorsa --help`
# and a refused argument load no more than click.

OVERRIDES = click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")


def NODE(command):  # noqa: N802 (a decorator, like the constants above)
    """--gpus-per-node and --devices: the GPU node a plan is for, where this machine is not one."""
    command = click.option("--devices", metavar="0,1,...",
                           help="With --dry-run/--plan: plan for a node with these GPUs (as CUDA_VISIBLE_DEVICES "
                                "lists them), not this machine's.")(command)
    return click.option("--gpus-per-node", type=click.IntRange(min=1),
                        help="With --dry-run/--plan: plan for nodes of N GPUs (0..N-1), not this machine's; "
                             "the plan says how many such nodes the engines take.")(command)


PRIOR = click.option("--prior", metavar="RUN_DIR", type=click.Path(),
                     help="What prorsa may assume before it observes: an earlier run's directory (or a prorsa sim "
                          "--output folder); its trajectories' means pick the opening roles. Default: the "
                          "pipeline's prior:, else none (start all mixed and learn).")


def _log_level(verbosity: int) -> None:
    """0: warnings; -v: Prorsa's own log (INFO of the `prorsa` loggers, workers' too); -vv: Dask's,
    tornado's and vLLM's as well."""
    import dask

    libraries = "info" if verbosity >= 2 else "error"
    levels = {"distributed": libraries, "tornado": libraries, "bokeh": libraries,
              "prorsa": "info" if verbosity >= 1 else "warning"}
    # distributed configures its own loggers on import; tell it before it is imported
    dask.config.set({"logging": levels})  # the worker processes a local run spawns too (worker_setup.py)
    from prorsa.console.clocked import ClockFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(ClockFormatter())  # the console's clock, not the time of day
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger().setLevel(logging.INFO if verbosity >= 2 else logging.WARNING)
    logging.getLogger("vllm").setLevel(logging.INFO if verbosity >= 2 else logging.WARNING)
    logging.getLogger("prorsa").setLevel(logging.INFO if verbosity >= 1 else logging.WARNING)
    # the start-up is on the console already, on its clock (console/start_progress.py)
    logging.getLogger("prorsa.start").propagate = False


def _verbose_after(ctx: click.Context, param: click.Parameter, verbosity: int) -> None:
    if verbosity:  # `prorsa run X -v`: the group has set the quiet level already
        _log_level(verbosity + (ctx.find_root().params.get("verbose") or 0))


VERBOSE_HELP = "-v: Prorsa's own log; -vv: Dask's and vLLM's as well."


def _verbose_everywhere(group: click.Group) -> None:
    """-v after the command as well as before it (`prorsa run X -v`, `prorsa -v run X`)."""
    for cmd in group.commands.values():
        cmd.params.append(click.Option(["-v", "--verbose"], count=True, expose_value=False,
                                       callback=_verbose_after, help=VERBOSE_HELP))
        if isinstance(cmd, click.Group):
            _verbose_everywhere(cmd)


class _Prorsa(click.Group):
    """Ctrl-C or SIGTERM anywhere a command has no handling of its own (its imports, a plan, a
    report) ends as the commands' own stops do: one line and exit 2, not click's "Aborted!" and 1."""

    def invoke(self, ctx: click.Context):
        from prorsa.commands.stopping import sigterm_as_interrupt

        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
                signal.signal(signal.SIGINT, signal.default_int_handler)  # from here, KeyboardInterrupt below
            sigterm_as_interrupt()  # until a command that starts engines installs its own stop
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
        # at once: an interrupt that lands inside an import leaves modules half made, and the
        # interpreter's own shutdown of them then died of the interrupt now and then (exit -2)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)


@click.group(cls=_Prorsa)
@click.version_option(package_name="prorsa", message="prorsa %(version)s")
@click.option("-v", "--verbose", count=True, help=VERBOSE_HELP)
def main(verbose: int) -> None:
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
                                              "layout, server command line and environment) and start nothing.")
@NODE
def run(**given) -> None:
    """Roll out PIPELINE on a local Dask cluster and write runs/<name>-<timestamp>/ (or --output).
    KEY=VALUE arguments override the pipeline's fields, e.g. workload.prompts=64."""
    from prorsa.commands.live_run import RunRequest, start_run

    start_run(RunRequest(**given))


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
@click.option("--max-request-mb", type=click.FloatRange(min=0, min_open=True), default=16.0, show_default=True,
              help="A request body past this size is refused (413) before it is read.")
@click.option("--api-key", envvar="PRORSA_API_KEY", show_envvar=True,
              help="Requests must send Authorization: Bearer KEY (401 otherwise); /health stays open.")
@click.option("--request-timeout-s", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="A request not answered by then gets a 504 and its conversation ends.")
def serve(**given) -> None:
    """Serve PIPELINE's engines as an OpenAI-compatible endpoint (/v1/chat/completions, /v1/completions,
    /v1/models): each conversation is a trajectory, saved in the run folder when it ends or the
    server stops (Ctrl-C)."""
    from prorsa.commands.serve import ServeRequest, serve_pipeline

    serve_pipeline(ServeRequest(**given))


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
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
              help="The comparison as a table, or as CSV or JSON rows on stdout (the progress then on stderr).")
def sim(**given) -> None:
    """Simulate PIPELINE's rollout in virtual time under each policy and compare them.
    KEY=VALUE arguments override the pipeline's fields, e.g. workload.prompts=64."""
    from prorsa.commands.simulate import SimRequest, simulate_policies

    simulate_policies(SimRequest(**given))


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
    from prorsa.commands.sweep import run_sweep

    run_sweep(sweep_file, overrides, cluster_opt, output, workers)


@main.command()
@click.argument("files", nargs=-1, required=True, metavar="FILES... [KEY=VALUE]...")
@click.option("--plan", is_flag=True, help="Also print each pipeline's launch plan, as prorsa run --dry-run does.")
@click.option("--cluster", "cluster_opt", metavar="FILE",
              help="With --plan: the cluster file the pipelines would run on (its engines.gpus is a node's GPUs).")
@NODE
def validate(files: tuple[str, ...], plan: bool, cluster_opt: str | None, gpus_per_node: int | None,
             devices: str | None) -> None:
    """Check FILES, each a pipeline, sweep, cluster file or trace (told apart by their contents), without
    running them; KEY=VALUE arguments override the pipelines' fields, as for prorsa run."""
    from prorsa.commands.validate import validate_files

    validate_files(files, plan, cluster_opt, gpus_per_node, devices)


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--days", type=click.IntRange(min=1), default=30, show_default=True, help="How long they are valid.")
def certs(directory: str, days: int) -> None:
    """Make test TLS certificates in DIRECTORY for a cluster file's tls: section: ca.pem, node.pem and
    node-key.pem (as cluster/slurm-tls.yaml names them; prorsa certs cluster/certs). For testing:
    a shared cluster's certificates come from its site's CA."""
    from prorsa.commands.certs import make_test_certs

    make_test_certs(directory, days)


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
@click.option("--max-fit-miss", type=click.FloatRange(min=0, min_open=True), default=15.0, show_default=True,
              metavar="PERCENT", help="Write the fitted profiles only if they predict the measured step times "
                                      "within this median error; a loaded machine may need more.")
def calibrate(**given) -> None:
    """Measure step times on one engine of PIPELINE's backend and fit the cost model to them; or fit
    a GPU profile to a step-time file (--from-measurements FILE --gpu NAME); or correct a profile
    to a live run (--from-run RUN_DIR)."""
    from prorsa.commands.calibrate import CalibrateRequest, calibrate_any

    calibrate_any(CalibrateRequest(**given))


@main.group()
def trace() -> None:
    """Traces: recorded agent runs to replay as a workload (workload.trace)."""


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
    from prorsa.agent.importers import ImportOptions
    from prorsa.commands.trace_import import import_recording

    import_recording(source, output, fmt, ImportOptions(family=family, decode_tps=decode_tps, releases=releases))


@main.group()
def model() -> None:
    """Models for the vLLM engines."""


@model.command("make-tiny")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--seed", default=0, show_default=True, help="Weights seed (the tokenizer is fixed).")
@click.option("--vocab-size", default=2048, show_default=True, help="Tokens in the model's vocabulary.")
def make_tiny(directory: str, seed: int, vocab_size: int) -> None:
    """Make a tiny Llama-style model with random weights in DIRECTORY (no model hub needed)."""
    from prorsa.commands.models import make_tiny as make

    make(directory, seed, vocab_size)


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
def sft(model_spec: str, output: str, **settings) -> None:
    """Supervised warm-up: teach a model the tool-call format of TASK from demonstrations, and stop
    while it uses the format only sometimes, so RL has something to learn from."""
    from prorsa.commands.sft import warm_up
    from prorsa.train.warmup import WarmupSettings

    warm_up(model_spec, output, WarmupSettings(**settings))


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--output", type=click.Path(),
              help="Directory for report.md and the plots (default: RUN_DIR/report for one run, "
                   "else report/ beside the first input).")
@click.option("--format", "fig_format", type=click.Choice(["png", "svg", "pdf"]), default="png", show_default=True,
              help="The figures' format report.md links; each is written as PNG, SVG and PDF.")
@click.option("--dpi", type=click.IntRange(50, 1200), default=150, show_default=True, help="PNG resolution.")
def report(inputs: tuple[str, ...], output: str | None, fig_format: str, dpi: int) -> None:
    """Plots and a Markdown summary of stored runs (RUN_DIR...) and sweep Datasets (FILE.nc)."""
    from prorsa.commands.report import write_run_report

    write_run_report(inputs, output, fig_format, dpi)


_verbose_everywhere(main)

if __name__ == "__main__":
    main()

