"""Errors a vLLM engine raises, so the runtime can tell "retry elsewhere" from "bad request".

    EngineError        the engine answered but the request failed (HTTP 4xx/5xx)
    KvTransferFailed   a decode could not pull its KV from the prefill engine; retry the turn
                       with kv=None (prefill locally) or prefill again elsewhere
    EngineUnavailable  the server is down, unreachable or did not start; the engine needs
                       `ensure_healthy()` and the turn must be retried on another engine
    PatchBroken        (an EngineUnavailable) the launcher refused a patch whose vLLM target changed
                       shape (patches.py); its message is the launcher's line
"""

from __future__ import annotations


class EngineError(RuntimeError):
    """A request the engine received and failed."""


class KvTransferFailed(EngineError):
    """The decode leg could not load the KV named by its kv_transfer_params."""


class EngineUnavailable(EngineError):
    """The engine's server is not serving (dead process, refused connection, failed start)."""


class PatchBroken(EngineUnavailable):
    """A patch of the launcher no longer fits the installed vLLM: a restart cannot help."""
