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
"""

from __future__ import annotations

import importlib
import os


def _patch_nixl_progress_delay() -> None:
    delay_us = int(os.environ.get("PRORSA_NIXL_PTHR_DELAY_US", "0") or 0)
    if delay_us <= 0:
        return
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


_patch_nixl_progress_delay()

if __name__ == "__main__":
    from vllm.entrypoints.launchers.api_server.entry import main

    main()
