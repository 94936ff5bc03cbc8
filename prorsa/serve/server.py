"""`prorsa serve`: a live run whose trajectories are the conversations an OpenAI client holds with it.

    listen(host, port) -> socket            bound before anything starts (a taken port is one error
                                            line, not a cluster started for nothing)
    beyond_loopback(host) -> bool           whether clients of other machines can reach it
    exposure_warning(host, api_key)         the console's warning when they can and need no key
    served_version(run) -> int              the served model's policy version (weight_version):
                                            its policy.json's when a trainer saved it, else 0
    Endpoint(run, sock, tokenizer, limits, ..., run_dir)   the pieces of one served run; an outside
                                            trainer's weight files become model folders under
                                            run_dir/weights (serve/rl.py)
    Endpoint.driver -> ServeDriver          what roll_out drives instead of the workload: the
                                            HTTP server starts once the engines are up, and stops
                                            when the hub closes and every conversation has ended
    Endpoint.stop()                         close the hub (a signal: live/interrupt.py wind_down)

The run itself is `prorsa run`'s (live/run.py run_live: cluster, engines, router, policy,
lifecycle plugin, journal); only what starts its trajectories differs. trajectories.parquet gets
one row per conversation as it ends (serve/samples.py reads back its token ids, loss mask and
logprobs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from prorsa.rollout.context import RunContext, sampling_of
from prorsa.serve.app import Guards, make_app
from prorsa.serve.conversations import Hub
from prorsa.serve.episode import ServeDriver, Served
from prorsa.serve.rl import RlControl
from prorsa.serve.tool_calls import ReplyParser

DEFAULT_MAX_TOKENS = 256  # a reply's cap when a request sets none


def listen(host: str, port: int) -> socket.socket:
    """Raises OSError (a taken port, an address not on this machine)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The console's warning for a server other machines can reach with no key; None when it is fine."""
    if api_key or not beyond_loopback(host):
        return None
    return (f"warning: serving on {host}, beyond this machine, with no API key: anyone who reaches the port can "
            "use the engines (--api-key or PRORSA_API_KEY)")


def beyond_loopback(host: str) -> bool:
    from prorsa.cluster.security import is_loopback

    return not is_loopback(host)


def load_tokenizer(run: RunContext) -> Any:
    from transformers import AutoTokenizer

    from prorsa.engine.registry import resolve_model_dir

    return AutoTokenizer.from_pretrained(str(resolve_model_dir(run.cfg.engines)))


def served_version(run: RunContext) -> int:
    from prorsa.engine.registry import resolve_model_dir

    return policy_version_of(resolve_model_dir(run.cfg.engines))


def policy_version_of(model_dir: Path) -> int:
    """A trainer's saved model says its version in policy.json (train/trainer.py); any other is 0."""
    from prorsa.train.trainer import POLICY_FILE

    try:
        return int(json.loads((model_dir / POLICY_FILE).read_text())["policy_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


class _Server(uvicorn.Server):
    def capture_signals(self):  # the run's own handlers stop it (live/interrupt.py)
        return contextlib.nullcontext()


@dataclass(frozen=True)
class Limits:
    """What one endpoint holds its clients to (prorsa serve's options)."""

    idle_s: float  # a conversation with no request for this long ends
    max_tokens: int = DEFAULT_MAX_TOKENS  # a reply's cap when a request sets none
    guards: Guards = Guards()


class Endpoint:
    def __init__(self, run: RunContext, sock: socket.socket, tokenizer: Any, limits: Limits, say=print,
                 run_dir: Path | None = None, parser: ReplyParser | None = None) -> None:
        from prorsa.engine.registry import backend_of

        cfg = run.cfg
        self.sock, self.say = sock, say
        self.hub = Hub(limits.idle_s)
        self.model = Path(cfg.engines.vllm.model).name  # "tiny", or the model folder's name
        self.rl = RlControl(served_version(run), backend_of(cfg.engines).model_dir(),
                            run_dir / "weights" if run_dir is not None else None)
        parser = parser or ReplyParser(cfg.engines.vllm.tool_call_parser, tokenizer)
        app = make_app(self.hub, self.model, tokenizer, limits.guards, self.rl, parser,
                       max_context=cfg.engines.vllm.max_model_len)
        self._server = _Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2))
        self._task: asyncio.Task | None = None
        bounds = Served(cfg.workload.family or "trace", cfg.seed, cfg.engines.vllm.max_model_len, limits.max_tokens,
                        sampling_of(cfg), served_version(run))
        self.driver = ServeDriver(self.hub, tokenizer, bounds, on_ready=self._start, on_end=self._stop_server,
                                  rl=self.rl, parser=parser)

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    async def _start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self.sock]))
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # its error
        self.say(f"serving {self.model} on {self.url} (Ctrl-C ends every conversation and saves them)")

    async def _stop_server(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def stop(self) -> None:
        self.hub.close()

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (not every conversation ending on its own)."""
        return self.hub.closed
