"""`prorsa sft`: the supervised warm-up before RL, with a progress bar and the call rate it reached.

    warm_up(model_spec, output, settings)   refuse an unknown task or a used --output, make the tiny
                                            model on first use, train (train/warmup.py), save
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from prorsa.commands.errors import fail
from prorsa.metrics.run_dirs import holds_anything, output_problem
from prorsa.train.warmup import WarmupSettings


def warm_up(model_spec: str, output: str, settings: WarmupSettings) -> None:
    """`model_spec`: a model directory, or tiny (made under .prorsa/models on first use)."""
    from prorsa.train.sft import DEMONSTRATIONS

    if settings.task not in DEMONSTRATIONS:
        fail(f"--task: {settings.task!r} has no demonstrations; expected one of {sorted(DEMONSTRATIONS)}")
    target = Path(output)
    if (problem := output_problem(target, "")) is not None:
        fail(f"--output: got '{target}'; {problem}")
    if holds_anything(target):
        fail(f"--output: {target}: directory exists and is not empty")
    _train(_model_dir(model_spec), settings, target)


def _model_dir(model_spec: str) -> Path:
    if model_spec == "tiny":
        from prorsa.engine.tiny_model import ensure_tiny_model

        return ensure_tiny_model(".prorsa/models")
    model_dir = Path(model_spec)
    if not (model_dir / "config.json").is_file():
        fail(f"--model: {model_dir}: not a model directory (no config.json)")
    return model_dir


def _train(model_dir: Path, settings: WarmupSettings, target: Path) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers.utils import logging as hf_logging

    from prorsa.train.warmup import warmup_job

    hf_logging.disable_progress_bar()  # its bars for loading and saving would cut into ours
    console = Console(stderr=False)
    job = warmup_job(model_dir, settings)
    with Progress(TextColumn("sft"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[line]}"),
                  TimeElapsedColumn(), console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task("sft", total=settings.steps, line="")

        def on_step(st, ev) -> None:
            line = f"loss {st.policy_loss:.3f}" + (f"  call rate {ev.call_rate:.2f}" if ev is not None else "")
            bar.update(task, advance=1, line=line)
            if not console.is_terminal and ev is not None:
                console.print(f"step {st.version}: {line}")

        result = job.run(on_step)
    job.trainer.save(target)
    first, last = result.evals[0][1], result.evals[-1][1]
    console.print(f"{result.steps} steps ({'target reached' if result.stopped_early else 'all steps'}): "
                  f"tool-call rate {first.call_rate:.2f} -> {last.call_rate:.2f}, "
                  f"correct calls {first.correct_call_rate:.2f} -> {last.correct_call_rate:.2f}")
    # a path is never wrapped: a long one (a test's or a job's temporary folder) stays one copyable line
    console.print(f"wrote {target} (policy version {job.trainer.version})", soft_wrap=True, markup=False,
                  highlight=False)
