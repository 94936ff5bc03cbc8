"""`prorsa sweep`: a grid of simulations as Dask tasks, merged into one xarray Dataset and plotted."""
