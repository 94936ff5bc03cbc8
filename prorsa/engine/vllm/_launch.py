"""Entry point of a vLLM server subprocess: `python -m prorsa.engine.vllm._launch <vllm args>`.

The same as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script of the
CPU wheel is broken), with one fix applied first:

    NIXL's Python API creates its agent with `pthrDelay = 0`, so the UCX progress thread polls
    with a zero timeout and burns a whole core per engine even when idle (measured: ~95% of a
    core per vLLM worker with nixl 1.5.1). On a 2-core machine that halves engine speed. With
    PRORSA_NIXL_PTHR_DELAY_US set, the progress thread sleeps in poll() up to that long between
    wake-ups instead; UCX still wakes it through its event fds, so transfers are not delayed.

The fix is applied at import time of this module, on purpose: vLLM starts its engine core and
workers with multiprocessing `spawn`, which re-imports the main module (this one) in every child,
and the NIXL agent lives in the worker.

The server also watches its parent (PRORSA_PARENT_PID): when the owner dies without stopping it
(SIGKILL, a crashed Dask worker), the server takes its whole process group down, so no engine is
left holding cores and memory.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time


def _patch_nixl_progress_delay() -> None:
    delay_us = int(os.environ.get("PRORSA_NIXL_PTHR_DELAY_US", "0") or 0)
    if delay_us <= 0:
        return
    # vLLM sets this before it imports NIXL (a UCX leak workaround); we import NIXL first
    os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")
    try:
        from nixl._api import nixl_agent
    except ImportError:  # no NIXL: nothing to fix
        return
    api = importlib.import_module(nixl_agent.__module__)
    real = api.nixlBind
    if getattr(real, "_prorsa_patched", False):
        return

    class _Bindings:
        """The bindings module, except that agents get a non-zero progress-thread delay."""

        _prorsa_patched = True

        def __getattr__(self, name):
            return getattr(real, name)

        def nixlAgent(self, name, config):  # noqa: N802 (NIXL's name)
            if config.useProgThread and config.pthrDelay == 0:
                config.pthrDelay = delay_us
            return real.nixlAgent(name, config)

    api.nixlBind = _Bindings()


def _watch_parent(parent: int, poll_s: float = 1.0, grace_s: float = 10.0) -> None:
    """Daemon thread: once the owner is gone (we are re-parented), stop the process group."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.killpg(0, signal.SIGTERM)  # vLLM shuts down its engine core and workers on SIGTERM
        time.sleep(grace_s)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="prorsa-parent-watch", daemon=True).start()


_patch_nixl_progress_delay()

if __name__ == "__main__":
    if os.environ.get("PRORSA_PARENT_PID"):
        _watch_parent(int(os.environ["PRORSA_PARENT_PID"]))
    from vllm.entrypoints.launchers.api_server.entry import main

    main()
