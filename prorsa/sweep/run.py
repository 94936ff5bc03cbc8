"""`prorsa sweep`: every point of a sweep's grid as one Dask task; one Dataset at the end.

    sweep_on_cluster(path, cluster, out, workers, console) -> Outcome
                                        check the file, then run it where the cluster file says
                                        (cluster/launch.py: batch jobs, a running scheduler), or
                                        on a LocalCluster of `workers` single-threaded processes
    run_sweep(grid, out, client, console, on_point) -> Outcome
                                        run what OUT/points/ lacks, merge into OUT/sweep.nc, plot;
                                        on_point(point, summary or None) as each one lands
    simulate_point(cfg, spec) -> dict   the task: one simulation's summary (runs on a worker)

simulate() is pure Python, so a worker process runs one at a time (threads would share a GIL).
OUT/points/<key>.json is written atomically by the client as each point lands, named by a hash of
the point's pipeline and policy, so a re-run skips whatever a killed sweep finished. A worker lost
mid-task has its task re-run elsewhere by the scheduler (up to distributed's allowed-failures); a
task that raised is retried RETRIES times, then reported and left NaN in the Dataset.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed import Client, as_completed
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prorsa.cluster.launch import open_sweep_client
from prorsa.config.cluster import ClusterSpec
from prorsa.config.load import ConfigError
from prorsa.config.pipeline import PipelineConfig
from prorsa.metrics.outputs import write_dataset
from prorsa.metrics.run_dirs import output_problem
from prorsa.sweep.grid import Grid, Point, load_grid
from prorsa.sweep.merge import merge

RETRIES = 2


@dataclass
class Outcome:
    out: Path
    points: int  # distinct simulations in the grid
    computed: list[str] = field(default_factory=list)  # keys simulated by this run
    skipped: int = 0  # found in OUT/points/ from an earlier run
    failed: dict[str, str] = field(default_factory=dict)  # key -> error
    plot: Path | None = None


def simulate_point(cfg: PipelineConfig, spec: str) -> dict:
    from prorsa.sim.run import simulate  # imported on the worker; the client never simulates
    from prorsa.rollout.context import resolve

    return simulate(resolve(cfg), spec).summary


def sweep_on_cluster(path: Path, cluster: ClusterSpec | None, out: Path | None, workers: int | None,
                     console: Console, overrides: dict[str, Any] | None = None) -> Outcome:
    grid = load_grid(path, overrides)  # a bad file fails before any cluster starts
    where = out or Path(grid.points[0].cfg.output_dir)
    if problem := output_problem(where, f"sweep-{grid.spec.name}"):  # and a place results cannot go
        raise ConfigError(f"{'--output' if out else f'{path}: output_dir'}: got {str(where)!r}; {problem}")
    with open_sweep_client(cluster, workers, console) as client:
        return run_sweep(grid, out, client, console)


def run_sweep(grid: Grid, out: Path | None, client: Client, console: Console,
              on_point: Callable[[Point, dict | None], None] | None = None) -> Outcome:
    out = out or Path(grid.points[0].cfg.output_dir) / f"sweep-{grid.spec.name}"
    (out / "points").mkdir(parents=True, exist_ok=True)
    _atomic_json(out / "sweep.json", grid.spec.model_dump(mode="json"))
    unique = list({p.key: p for p in grid.points}.values())
    results = {p.key: r for p in unique if (r := _read_point(out, p)) is not None}
    outcome = Outcome(out, len(unique), skipped=len(results))
    console.print(f"sweep {grid.spec.name}: {len(unique)} simulations, {len(results)} already in "
                  f"{out / 'points'}; dashboard {client.dashboard_link}", soft_wrap=True)
    with _Progress(console, len(unique), len(results)) as progress:
        for p, summary, error in _run(client, [p for p in unique if p.key not in results]):
            if error is None:
                _atomic_json(out / "points" / f"{p.key}.json", {"key": p.key, "coords": p.coords(), "summary": summary})
                results[p.key] = summary
                outcome.computed.append(p.key)
            else:
                outcome.failed[p.key] = error
            progress.point(p, summary, error)
            if on_point is not None:
                on_point(p, summary)
    ds = merge(grid, results)
    write_dataset(out / "sweep.nc", ds)
    outcome.plot = _plot(ds, out / "speedup.png", console)
    return outcome


def _run(client: Client, todo: list[Point]):
    """(point, summary, None) or (point, None, error) for every point, in the order they finish."""
    futures = {client.submit(simulate_point, p.cfg, p.spec, key=f"sim-{p.key}", retries=RETRIES): p
               for p in todo}
    for fut in as_completed(futures):
        p = futures.pop(fut)
        if fut.status == "error":
            e = fut.exception()
            yield p, None, f"{type(e).__name__}: {e}"
        else:
            yield p, fut.result(), None
        fut.release()


def _read_point(out: Path, p: Point) -> dict | None:
    try:
        data = json.loads((out / "points" / f"{p.key}.json").read_text())
    except (OSError, ValueError):
        return None  # absent or unreadable: simulate it (again)
    return data.get("summary") if isinstance(data, dict) and data.get("key") == p.key else None


def _atomic_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=_plain) + "\n")
    os.replace(tmp, path)


def _plain(x):
    return x.item() if hasattr(x, "item") else str(x)


def _plot(ds, path: Path, console: Console) -> Path | None:
    try:
        from prorsa.sweep.plots import speedup_plot
    except ImportError:
        console.print('speedup.png skipped: it needs matplotlib (pip install -e ".[plots]")')
        return None
    return speedup_plot(ds, path)


class _Progress:
    """A bar on a terminal; one line per point otherwise (logs, batch jobs)."""

    def __init__(self, console: Console, total: int, done: int) -> None:
        self.console, self.total, self.done = console, total, done
        self.bar = None
        if console.is_terminal:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=console)
            self.task = self.bar.add_task("simulating", total=total, completed=done)

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def point(self, p: Point, summary: dict | None, error: str | None) -> None:
        self.done += 1
        if error is not None:
            line = f"failed {p.describe()}: {error}"
        else:
            line = (f"{p.describe()}: makespan {summary['makespan_s']:.1f} s, "
                    f"{summary.get('sim_wall_s', 0):.1f} s to simulate")
        if self.bar is None:
            self.console.print(f"[{self.done}/{self.total}] {line}", markup=False, highlight=False, soft_wrap=True)
            return
        self.bar.update(self.task, completed=self.done, description=f"simulating ({p.spec})")
        if error is not None:
            self.console.print(line, markup=False)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
