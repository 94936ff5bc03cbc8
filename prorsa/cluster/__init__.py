"""Where the Dask workers come from: a LocalCluster, SLURM or PBS jobs, or a running scheduler.
The cluster files themselves are config/cluster.py's.

    launch.py    open_run_cluster / open_sweep_client: the one place a spec becomes a cluster
    jobs.py      dask-jobqueue job options and scripts: engine, tool and sweep jobs
    hosts.py     engine and tool plugins for workers that join by themselves
    security.py  Dask TLS from the file's certificates
"""
