"""A live run with its dashboard on, and headless Chromium driven over the DevTools protocol."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from prorsa.devtools.browser import Chromium

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
                line = line.split("] ", 1)[-1]  # after the console's clock
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
