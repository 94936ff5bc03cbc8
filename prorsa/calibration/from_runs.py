"""A hardware profile corrected to a live run, by simulating that run's workload until the
simulated turns spend their time as the live ones did (costmodel/live_fit.py says how).

    load_live_run(run_dir) -> (cfg, summary, rows)           a finished run's pipeline and records
    simulate_with(cfg, gpu, scratch) -> (makespan, rows)   cfg simulated with another profile
    fit_to_run(cfg, live_rows, workdir) -> list[LiveFit]     the corrections, last one = the fit
    fitted_profile(cfg, workdir) -> Path                     where fit_to_run leaves the fitted profile
    pool_runs(run_dirs) -> PooledRuns                        finished runs of one pipeline, read together
    correct_to_runs(pooled, target, header) -> Correction    fit_to_run on the pooled runs, the fitted
                                                             profile written to target, its effect

cfg must be the live run's own pipeline (same seed, policy and engines), so that both sides roll
out the same trajectories.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from prorsa.config.load import describe as describe_error
from prorsa.config.pipeline import PipelineConfig
from prorsa.costmodel import load_gpu
from prorsa.costmodel.live_fit import LiveFit, refit, turn_times
from prorsa.costmodel.profile_writer import write_texts
from prorsa.engine.registry import engine_name
from prorsa.rollout.context import resolve, time_unit
from prorsa.sim.run import host_cores, simulate, write_run

MAX_REFITS = 10


def load_live_run(run_dir: Path) -> tuple[PipelineConfig, dict, list[dict]]:
    """The pipeline a run started with, its summary and its trajectories; ValueError names the file."""
    try:
        cfg = PipelineConfig.model_validate_json((run_dir / "pipeline.json").read_bytes())
        summary = json.loads((run_dir / "summary.json").read_text())
        rows = pq.read_table(run_dir / "trajectories.parquet").to_pylist()
    except OSError as e:
        raise ValueError(f"{e.filename}: cannot read ({e.strerror or e}); is {run_dir} a finished run?") from None
    except ValidationError as e:
        raise ValueError(f"{run_dir / 'pipeline.json'}: {describe_error(e.errors()[0])}") from None
    except (ValueError, pa.ArrowException) as e:
        raise ValueError(f"{run_dir}: unreadable summary.json or trajectories.parquet ({e})") from None
    if summary.get("trajectories_completed", 0) < 1 or not rows:
        raise ValueError(f"{run_dir}: no completed trajectory to fit")
    return cfg, summary, rows


def simulate_with(cfg: PipelineConfig, gpu: str, scratch: Path) -> tuple[float, list[dict]]:
    """(makespan, trajectory rows) of cfg simulated with hardware profile `gpu` (a name or a YAML path)."""
    sim = simulate(resolve(cfg.model_copy(update={"engines": cfg.engines.model_copy(update={"gpu": gpu})})))
    write_run(sim, scratch)
    return sim.makespan_s, pq.read_table(scratch / "trajectories.parquet").to_pylist()


def fit_to_run(cfg: PipelineConfig, live_rows: list[dict], workdir: Path, header: str = "") -> list[LiveFit]:
    """Correct cfg's hardware profile towards the live run until a correction changes little; each
    step's profile is written to workdir/<profile>-live.yaml, which the last step leaves fitted."""
    live = turn_times(live_rows, time_unit(cfg))  # a time-scaled emulated run's wall seconds, in body seconds
    gpu = load_gpu(cfg.engines.gpu)
    host = host_cores(cfg, [engine_name(i) for i in range(cfg.engines.count)]) is not None
    profile = fitted_profile(cfg, workdir)
    sim = turn_times(simulate_with(cfg, cfg.engines.gpu, workdir / "sim-0")[1])
    fits: list[LiveFit] = []
    for i in range(1, MAX_REFITS + 1):
        fits.append(refit(gpu, live, sim, host))
        gpu = fits[-1].gpu
        profile.write_text(fits[-1].profile_yaml([header, *describe(fits)] if header else describe(fits)))
        if fits[-1].converged() or i == MAX_REFITS:
            break
        sim = turn_times(simulate_with(cfg, str(profile), workdir / f"sim-{i}")[1])
    return fits


def fitted_profile(cfg: PipelineConfig, workdir: Path) -> Path:
    return workdir / f"{Path(cfg.engines.gpu).stem}-live.yaml"


def describe(fits: list[LiveFit]) -> list[str]:
    return [f"correction {i}: engine time x{1 / f.share:.3f}, dispatch {f.dispatch_delta_s * 1e3:+.1f} ms, "
            f"KV pull {f.transfer_delta_s * 1e3:+.1f} ms" for i, f in enumerate(fits, 1)]


# A corrected profile must reproduce the runs it was fitted to within this: the fidelity goal on a
# held-out run (benchmarks/README.md, fidelity-vllm: fitted 0.983 on its own runs, 0.945 held out).
# Past it the fit has not explained the runs (a time-scaled run, a host that changed mid-run),
# and a profile written anyway would mislead every simulation that used it.
FIT_BOUND = 0.20


class LiveFitError(ValueError):
    """The fit itself failed (not the reading of a run); the message names the first run."""


@dataclass(frozen=True)
class PooledRuns:
    run_dirs: tuple[Path, ...]
    cfg: PipelineConfig  # the pipeline every run started with
    live_s: float  # their median makespan
    rows: tuple[dict, ...]  # every run's trajectories
    first_trajectories: int  # the first run's


@dataclass(frozen=True)
class Correction:
    fits: list[LiveFit]
    before_s: float  # the makespan simulated with the base profile
    after_s: float  # ... and with the corrected one


def pool_runs(run_dirs: list[Path]) -> PooledRuns:
    """ValueError naming the first run that cannot be read, or is not of the first one's pipeline."""
    runs = [load_live_run(run_dir) for run_dir in run_dirs]
    cfg = runs[0][0]
    for run_dir, (other, _, _) in zip(run_dirs[1:], runs[1:]):
        if other.model_dump(exclude={"output_dir"}) != cfg.model_dump(exclude={"output_dir"}):
            raise ValueError(f"{run_dir}: not a run of the same pipeline as {run_dirs[0]} (pooled runs must share "
                             "their pipeline, seed included)")
    live = statistics.median(summary["makespan_s"] for _, summary, _ in runs)
    rows = tuple(row for _, _, run_rows in runs for row in run_rows)
    return PooledRuns(tuple(run_dirs), cfg, live, rows, len(runs[0][2]))


def correct_to_runs(pooled: PooledRuns, target: Path, header: str) -> Correction:
    """LiveFitError when the correction does not fit; target is written only once it does."""
    cfg = pooled.cfg
    with tempfile.TemporaryDirectory() as tmp:
        before, _ = simulate_with(cfg, cfg.engines.gpu, Path(tmp) / "base")
        try:
            fits = fit_to_run(cfg, list(pooled.rows), Path(tmp), header)
        except ValueError as e:
            raise LiveFitError(f"{pooled.run_dirs[0]}: {e}") from None
        fitted = fitted_profile(cfg, Path(tmp))
        after, _ = simulate_with(cfg, str(fitted), Path(tmp) / "fitted")
        if (off := abs(after / pooled.live_s - 1)) > FIT_BOUND:
            raise LiveFitError(f"{pooled.run_dirs[0]}: the corrected profile simulates {after:.2f} s against the "
                               f"live {pooled.live_s:.2f} s ({off:.0%} off, beyond the {FIT_BOUND:.0%} a fit may "
                               "miss its own runs by); nothing written")
        write_texts({target: fitted.read_text()})
    return Correction(fits, before, after)
