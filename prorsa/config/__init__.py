"""The files a user writes, read and checked: pipelines, sweeps, cluster files and engine layouts."""
