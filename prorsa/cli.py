"""`prorsa`: the command line.

    prorsa run PIPELINE [--engine B] [--policy P] [--output DIR]   a live rollout on a LocalCluster
    prorsa validate FILE...                                         check pipeline files, run nothing
    prorsa model make-tiny DIR                                      a tiny random Llama for vLLM on CPU

Bad input ends with one line on stderr and exit code 2; no traceback.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import signal
import sys
from pathlib import Path

import click
from rich.console import Console

from prorsa.config.load import ConfigError, load_pipeline


def _fail(msg: str) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(2)


def _load(path: str, overrides: dict) -> object:
    try:
        return load_pipeline(path, overrides)
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


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _new_run_dir(base: Path, name: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = base / f"{name}-{stamp}"
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = base / f"{name}-{stamp}-{suffix}"
    run_dir.mkdir(parents=True)
    return run_dir


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log what Dask and the engines do.")
def main(verbose: bool) -> None:
    """Prorsa: agentic RL rollout with prefill/decode disaggregation on Dask."""
    import dask

    # distributed configures its own loggers on import; tell it before it is imported
    dask.config.set({"logging": {"distributed": "info" if verbose else "error",
                                 "tornado": "info" if verbose else "error",
                                 "bokeh": "info" if verbose else "error"}})
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


@main.command()
@click.argument("pipeline", type=click.Path(dir_okay=False))
@click.option("--engine", type=click.Choice(["emulated", "vllm"]), help="Override engines.backend.")
@click.option("--policy", help="Override the policy, e.g. colocated or static:2:1.")
@click.option("--output", type=click.Path(file_okay=False), help="Directory for runs (default: the pipeline's output_dir).")
def run(pipeline: str, engine: str | None, policy: str | None, output: str | None) -> None:
    """Roll out PIPELINE on a local Dask cluster and write runs/<name>-<timestamp>/."""
    overrides = {k: v for k, v in {"engines.backend": engine, "policy": policy}.items() if v is not None}
    cfg = _load(pipeline, overrides)
    from prorsa.metrics.progress import summary_table
    from prorsa.rollout.live import run_live

    console = Console(stderr=False)
    if cfg.engines.backend == "vllm":
        _check_vllm(cfg, pipeline)
    run_dir = _new_run_dir(Path(output or cfg.output_dir), cfg.name)
    (run_dir / "pipeline.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
    console.print(f"run directory: {run_dir}")
    # SIGTERM (a batch system, `timeout`) unwinds like Ctrl-C, so engines and servers are stopped
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        summary = asyncio.run(run_live(cfg, run_dir, console))
    except KeyboardInterrupt:
        _fail(f"interrupted; partial run left in {run_dir}")
    console.print(summary_table(summary))
    console.print(f"wrote {run_dir}")
    if summary["trajectories_failed"]:
        sys.exit(1)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def validate(files: tuple[str, ...]) -> None:
    """Check pipeline FILES without running them."""
    bad = 0
    for f in files:
        try:
            cfg = load_pipeline(f)
        except ConfigError as e:
            click.echo(f"error: {e}", err=True)
            bad += 1
        else:
            click.echo(f"ok: {f} ({cfg.name}: {cfg.engines.count} {cfg.engines.backend} engines, "
                       f"policy {cfg.policy}, {cfg.workload.mode} {cfg.workload.family or 'trace'})")
    sys.exit(2 if bad else 0)


@main.group()
def model() -> None:
    """Models for the vLLM engines."""


@model.command("make-tiny")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--seed", default=0, show_default=True, help="Weights seed (the tokenizer is fixed).")
@click.option("--vocab-size", default=2048, show_default=True)
def make_tiny(directory: str, seed: int, vocab_size: int) -> None:
    """Make a tiny Llama-style model with random weights in DIRECTORY (no model hub needed)."""
    from prorsa.engine.tiny_model import make_tiny_model, weights_digest

    target = Path(directory)
    if target.exists() and any(target.iterdir()):
        _fail(f"{target}: directory exists and is not empty")
    make_tiny_model(target, seed=seed, vocab_size=vocab_size)
    click.echo(f"made {target} (weights sha256 {weights_digest(target)[:16]})")


if __name__ == "__main__":
    main()
