"""`prorsa calibrate`: a cost-model profile fitted to measurements, in one of three ways.

    calibrate_engine(request)       measure one vLLM engine of the pipeline
    calibrate_from_file(request)    a GPU profile fitted to a step-time file (--from-measurements)
    calibrate_from_runs(run_dirs, output)
                                    a profile corrected to finished live runs (--from-run)

Each writes where --output says, else beside what it fitted to (the calibration's run folder, the
measurements file, the first run), never over a profile Prorsa ships.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import click

from prorsa.commands.errors import fail
from prorsa.commands.inputs import check_engines, load_pipeline
from prorsa.commands.run_folder import new_run_folder
from prorsa.commands.stopping import sigterm_as_interrupt


@dataclass(frozen=True)
class CalibrateRequest:
    pipeline: str | None
    output: str | None
    quick: bool
    seed: int | None
    measurements: str | None  # --from-measurements
    gpu: str | None
    model_name: str
    run_dirs: tuple[str, ...]  # --from-run
    max_fit_miss: float  # percent

    @property
    def max_miss(self) -> float:
        return self.max_fit_miss / 100

    def miss_flag(self) -> str:
        """The option as the provenance repeats it, where it is not the default."""
        from prorsa.costmodel.profile_writer import FIT_MEDIAN_BOUND

        return "" if self.max_miss == FIT_MEDIAN_BOUND else f" --max-fit-miss {self.max_fit_miss:g}"


def calibrate_any(request: CalibrateRequest) -> None:
    if request.measurements:
        calibrate_from_file(request)
    elif request.run_dirs:
        calibrate_from_runs([Path(d) for d in request.run_dirs], request.output)
    else:
        calibrate_engine(request)


def calibrate_engine(request: CalibrateRequest) -> None:
    pipeline, quick = request.pipeline, request.quick
    if not pipeline:
        fail("give a PIPELINE to measure, or --from-measurements FILE --gpu NAME")
    cfg = load_pipeline(pipeline, {}).cfg
    from prorsa.engine.registry import backend_of

    if not backend_of(cfg.engines).measurable:
        fail(f"{pipeline}: engines.backend is {cfg.engines.backend}; calibrate measures vllm engines")
    check_engines(cfg, pipeline)
    from prorsa.engine.measure import DEFAULT_PLAN, QUICK_PLAN, calibrate_pipeline

    seed = cfg.seed if request.seed is None else request.seed
    folder = new_run_folder(Path(cfg.output_dir), "calibrate").path
    output = request.output or str(folder / "cpu.yaml")  # the model's profile goes beside it
    command = (f"prorsa calibrate {pipeline} --output {output} --seed {seed}" + (" --quick" if quick else "")
               + request.miss_flag())
    sigterm_as_interrupt()  # so the engine is stopped
    try:
        lines = calibrate_pipeline(cfg, QUICK_PLAN if quick else DEFAULT_PLAN, Path(output), command, folder,
                                   click.echo, seed=seed, max_miss=request.max_miss)
    except KeyboardInterrupt:
        fail("interrupted")
    except ValueError as e:
        fail(str(e))
    click.echo("\n".join(lines))


def calibrate_from_file(request: CalibrateRequest) -> None:
    from prorsa.costmodel.profile_writer import model_path_for
    from prorsa.costmodel.step_times import calibrate_from_file as fit_step_times

    measurements, gpu, model_name, output = request.measurements, request.gpu, request.model_name, request.output
    if not gpu:
        fail("--from-measurements needs --gpu NAME: the base hardware profile to fit")
    if not output:  # beside the measurements, the model's profile too
        output = str(Path(measurements).parent / f"{Path(gpu).stem}-fitted.yaml")
    model_out = model_path_for(Path(output), Path(model_name).stem)
    command = (f"prorsa calibrate --from-measurements {measurements} --gpu {gpu} --model {model_name} "
               f"--output {output}" + request.miss_flag())
    try:
        lines = fit_step_times(Path(measurements), gpu, Path(output), model_name, model_out, command,
                               request.max_miss)
    except ValueError as e:
        fail(str(e))
    click.echo("\n".join(lines))


def calibrate_from_runs(run_dirs: list[Path], output: str | None) -> None:
    from prorsa.calibration.from_runs import LiveFitError, correct_to_runs, describe, fitted_profile, pool_runs

    try:
        pooled = pool_runs(run_dirs)
    except ValueError as e:
        fail(str(e))
    base, live = pooled.cfg.engines.gpu, pooled.live_s
    target = Path(output) if output else fitted_profile(pooled.cfg, run_dirs[0])
    names = ", ".join(d.name for d in run_dirs)
    header = (f"{base} corrected to the live run(s) {names} (median makespan {live:.1f} s) by "
              f"`prorsa calibrate --from-run`, {dt.date.today()}")
    click.echo(f"simulating {names} ({pooled.first_trajectories} trajectories) with {base} and correcting it ...")
    try:
        fix = correct_to_runs(pooled, target, header)
    except LiveFitError as e:
        fail(str(e))
    click.echo("\n".join(describe(fix.fits)))
    click.echo(f"makespan: live {live:.2f} s{' (median)' if len(run_dirs) > 1 else ''}; simulated with {base} "
               f"{fix.before_s:.2f} s ({fix.before_s / live:.3f}), corrected {fix.after_s:.2f} s "
               f"({fix.after_s / live:.3f})")
    click.echo(f"wrote {target} (use it as engines.gpu; check it on another run: benchmarks/fidelity_vllm.py)")
