"""Where the Dask workers come from, and everything that runs inside their processes.
The cluster files themselves are config/cluster.py's.

Starting workers:
    launch.py            open_run_cluster / open_sweep_client: the one place a spec becomes a cluster
    local.py             start_local_cluster: one worker per engine, tool workers, the trainer worker
    jobs.py              dask-jobqueue job options and scripts: engine, tool and sweep jobs
    hosts.py             engine and tool plugins for workers that join by themselves
    security.py          Dask TLS from the file's certificates
    certs.py             test certificates for it (prorsa certs)
    launch_check.py      check_launch: whether the engines fit the nodes, asked before anything starts
    launch_plan.py       what --dry-run prints: every engine's command line and environment, per node

Inside worker and scheduler processes:
    engine_host.py       EngineHost: a worker plugin that owns its engine for the worker's lifetime
    tool_host.py         ToolHost: a tool worker's environment (tools, reward, tokenizer)
    lifecycle_plugin.py  the scheduler plugin that reads every trajectory's lifecycle off task transitions
    recovery.py          LegRescue: a leg bound to a dead or retagged worker goes back to its role
    worker_logs.py       faults the run survives, logged as one line each in every process
    worker_setup.py      what every worker process does as it starts (quiet logs, Ctrl-C left to the run)
"""
