"""Writing a run's Dataset does not depend on dask's global default scheduler."""

from __future__ import annotations

import dask
import numpy as np
import xarray as xr

from prorsa.metrics.outputs import write_dataset


def test_metrics_are_written_with_a_distributed_default_and_no_client(tmp_path):
    # what a Client set as default and gone leaves behind (a notebook, an earlier sweep)
    ds = xr.Dataset({"a": ("x", np.arange(3))})
    with dask.config.set(scheduler="dask.distributed"):
        write_dataset(tmp_path / "m.nc", ds)
    assert xr.load_dataset(tmp_path / "m.nc").a.values.tolist() == [0, 1, 2]
