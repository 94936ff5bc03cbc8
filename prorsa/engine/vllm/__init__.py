"""vLLM engines behind the Engine protocol: an OpenAI-compatible server subprocess per engine,
driven over HTTP with token ids in and token ids and logprobs out; KV moves engine to engine
through vLLM's NixlConnector (host memory on CPU)."""

from prorsa.engine.vllm.engine import Placement, VllmEngine
from prorsa.engine.vllm.errors import EngineError, EngineUnavailable, KvTransferFailed
from prorsa.engine.vllm.server import ServerSpec, VllmServer

__all__ = [
    "EngineError",
    "EngineUnavailable",
    "KvTransferFailed",
    "Placement",
    "ServerSpec",
    "VllmEngine",
    "VllmServer",
]
