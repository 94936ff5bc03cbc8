"""The endpoint served for real in a test: the app, hub and served driver on an event loop of a
thread of their own, uvicorn on a free port of 127.0.0.1, the turns on a given runner (a test's
scripted one). A client in the test's own thread reaches it as any outside client would.

    with ServedApp(tokenizer, runner) as served:
        served.url       http://127.0.0.1:PORT (the OpenAI base URL is served.url + "/v1")
        served.app       the FastAPI app (its OpenAPI schema: served.app.openapi())
        served.done      the trajectories ended so far, as the run's writer gets them
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn

from prorsa.rollout.drivers import Hooks
from prorsa.sampling import Sampling
from prorsa.serve.app import Guards, make_app
from prorsa.serve.conversations import Hub
from prorsa.serve.episode import ServeDriver, Served


class ServedApp:
    def __init__(self, tok, runner, max_tokens: int = 64) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.tok, self.runner, self.max_tokens, self.done = tok, runner, max_tokens, []
        self.hub = Hub(idle_s=60)
        self.app = make_app(self.hub, "tiny", tok, Guards(max_request_bytes=2**20))
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    async def _main(self) -> None:
        driver = ServeDriver(self.hub, self.tok, Served("swe", 0, max_context=2048, max_tokens=self.max_tokens,
                                                        sampling=Sampling(), weight_version=0))
        rollout = asyncio.create_task(driver(None, None, self.runner, time.monotonic, Hooks(self.done.append)))
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        serving = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started:
            await asyncio.sleep(0.01)
        self._ready.set()
        while not self.server.should_exit:
            await asyncio.sleep(0.05)
        self.hub.close()
        await rollout
        await serving

    def __enter__(self) -> ServedApp:
        self._thread.start()
        assert self._ready.wait(60), "the app did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(60)
        assert not self._thread.is_alive(), "the app did not stop"
