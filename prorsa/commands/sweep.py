"""`prorsa sweep`: every point of a sweep file's grid simulated as a Dask task.

    run_sweep(sweep_file, overrides, cluster_opt, output, workers)
                      on --cluster or a LocalCluster; finished points are kept, so running the
                      same command again resumes; exit 1 when a point failed
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from prorsa.commands.errors import fail
from prorsa.commands.inputs import cluster_from, with_options
from prorsa.config.load import ConfigError

INTERRUPTED_SWEEP = "interrupted; finished points are kept, run the same command to resume"


def run_sweep(sweep_file: str, overrides: tuple[str, ...], cluster_opt: str | None, output: str | None,
              workers: int | None) -> None:
    from prorsa.cluster.launch import ClusterError
    from prorsa.live.interrupt import stops_hard
    from prorsa.sweep.run import sweep_on_cluster

    cluster = cluster_from(cluster_opt)
    if workers and cluster is not None and cluster.kind != "local":
        fail("--workers sizes the LocalCluster; a --cluster brings its own workers")
    console = Console(stderr=False)
    try:
        with stops_hard(lambda: INTERRUPTED_SWEEP):  # closing a cluster that does not answer ends anyway
            done = sweep_on_cluster(Path(sweep_file), cluster, Path(output) if output else None, workers, console,
                                    with_options(overrides))
    except ConfigError as e:
        fail(str(e))
    except ClusterError as e:
        fail(f"{cluster_opt}: {e}")
    except KeyboardInterrupt:
        fail(INTERRUPTED_SWEEP)
    console.print(f"{len(done.computed)} simulated, {done.skipped} already done, {len(done.failed)} failed; "
                  f"wrote {done.out / 'sweep.nc'}" + (f" and {done.plot}" if done.plot else ""), soft_wrap=True)
    if done.failed:
        sys.exit(1)
