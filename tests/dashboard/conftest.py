"""A live run with its dashboard on, and headless Chromium driven over the DevTools protocol."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

# As the machines' docs ask: without the background-networking switches Chromium keeps trying
# hosts a closed network refuses.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


# MoE engines as DP-attention groups and a low bar for switching: the roles move within seconds.
PIPELINE = """\
name: {name}
seed: 5
policy: prorsa:4:1:2:1:0.02
engines: {{backend: emulated, count: 4, slots: 128, time_scale: 0.1, model: qwen3-30b-a3b, ep: 8}}
workload: {{family: swe, mode: async, tool_time_scale: 0.1, max_turns: 3, {workload}}}
runtime: {{turn_shape: driver, metrics_interval_s: 0.2, control_interval_s: 0.2, dashboard_address: "127.0.0.1:0"}}
"""


class LiveRun:
    """`prorsa run` in a subprocess; its output read on a thread so the pipe never fills."""

    def __init__(self, pipeline: str, tmp_path: Path) -> None:
        f = tmp_path / "p.yaml"
        f.write_text(pipeline)
        self.out_dir = tmp_path / "runs"
        self.proc = subprocess.Popen([sys.executable, "-m", "prorsa.cli", "run", str(f), f"output_dir={self.out_dir}"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def urls(self, timeout: float = 120.0) -> tuple[str, str]:
        """(page, JSON) as the run prints them at start."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            for line in list(self.lines):
                if line.startswith("prorsa page:"):
                    words = line.split()
                    return words[2], words[4]
            assert self.proc.poll() is None, self.output()
            time.sleep(0.05)
        raise AssertionError("no dashboard address printed:\n" + self.output())

    def output(self) -> str:
        return "".join(self.lines)[-4000:]

    def wait(self, timeout: float = 300.0) -> Path:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the run did not end within {timeout:g} s:\n{self.output()}") from None
        assert rc == 0, self.output()
        (run_dir,) = self.out_dir.iterdir()
        return run_dir

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def live_run(tmp_path):
    runs: list[LiveRun] = []

    def start(name: str, workload: str) -> LiveRun:
        """A 4-engine async run with its dashboard on; `workload`: how many trajectories, how long."""
        runs.append(LiveRun(PIPELINE.format(name=name, workload=workload), tmp_path))
        return runs[-1]

    yield start
    for r in runs:
        r.kill()


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
            assert self.proc.poll() is None, "chromium exited at start"
            assert time.time() - t0 < 60, "chromium did not open its DevTools port"
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
            assert raw is not None, "the DevTools connection closed"
            msg = json.loads(raw)
            if msg.get("method") == "Runtime.exceptionThrown":
                self.errors.append(json.dumps(msg["params"]["exceptionDetails"])[:1000])
            if msg.get("id") == self.n:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return msg["result"]

    def eval(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r["exceptionDetails"]
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0):
        t0 = time.time()
        while time.time() - t0 < timeout:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {expression}; page errors: {self.errors}")

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


@pytest.fixture
def chromium():
    binary = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        if os.environ.get("CI"):  # .ci/run installs it: a CI without it must not pass by skipping
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("no chromium binary on PATH (Debian: apt-get install chromium)")
    browser = Chromium(binary)
    yield browser
    browser.close()
