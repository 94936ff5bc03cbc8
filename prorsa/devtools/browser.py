"""Headless Chromium driven over the DevTools protocol (a websocket): to look at the Prorsa page
as a browser draws it, for tests/dashboard and docs/moe_step_figures.py. Not used by a run.

    Chromium(binary, size)       start a browser with one page; close() ends it
    .call(method, **params)      one DevTools command; exceptions the page throws land in .errors
    .eval(expression)            evaluate JavaScript in the page, its value returned
    .wait_for(expression)        evaluate until truthy (or fail after a timeout)
    .screenshot(clip=None)       PNG bytes of the page, or of a clip {x, y, width, height}
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

# Without the background-networking switches Chromium keeps trying hosts a closed network refuses.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


class BrowserError(RuntimeError):
    """Chromium did not start, the page threw, or what was waited for never came."""


class Chromium:
    """One headless Chromium page, driven over the DevTools protocol (a websocket)."""

    def __init__(self, binary: str, size: tuple[int, int] = (1400, 1500)) -> None:
        from tornado.websocket import websocket_connect  # noqa: PLC0415

        self.profile = tempfile.mkdtemp(prefix="prorsa-chromium-")
        self.proc = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                                      "--remote-debugging-port=0", f"--window-size={size[0]},{size[1]}",
                                      "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        t0 = time.time()
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise BrowserError("chromium exited at start")
            if time.time() - t0 >= 60:
                raise BrowserError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.loads(r.read()) if t["type"] == "page")
        self.loop = asyncio.new_event_loop()

        async def connect():
            return await websocket_connect(page["webSocketDebuggerUrl"], max_message_size=256 * 2**20)

        self.ws = self.loop.run_until_complete(connect())
        self.n = 0
        self.errors: list[str] = []  # exceptions the page threw

    def call(self, method: str, **params) -> dict:
        return self.loop.run_until_complete(self._call(method, params))

    async def _call(self, method: str, params: dict) -> dict:
        self.n += 1
        await self.ws.write_message(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            raw = await asyncio.wait_for(self.ws.read_message(), 60)
            if raw is None:
                raise BrowserError("the DevTools connection closed")
            msg = json.loads(raw)
            if msg.get("method") == "Runtime.exceptionThrown":
                self.errors.append(json.dumps(msg["params"]["exceptionDetails"])[:1000])
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg["result"]

    def eval(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise BrowserError(r["exceptionDetails"])
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0):
        t0 = time.time()
        while time.time() - t0 < timeout:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.2)
        raise BrowserError(f"timed out waiting for {expression}; page errors: {self.errors}")

    def screenshot(self, clip: dict | None = None) -> bytes:
        params = {"format": "png", "captureBeyondViewport": True}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        return base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])

    def close(self) -> None:
        async def close_ws() -> None:  # inside our loop: no current loop is needed or assumed
            self.ws.close()

        try:
            self.loop.run_until_complete(close_ws())
            self.loop.close()
        finally:  # the browser goes even if the socket would not close
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)
