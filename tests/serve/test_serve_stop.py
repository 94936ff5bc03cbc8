"""Ctrl-C while a served run has requests in flight: refused requests get an OpenAI 503, every
turn that finished is saved with its conversation, trajectories.parquet and summary.json are
written, the command exits 2 as every stop does, and no process prints a traceback."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
IN_FLIGHT = 50


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _ask_then_stop(base: str, pid: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        def ask(i: int):
            return client.post("/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": f"count to {i}"}],
                "max_tokens": 200, "user": f"u{i}"})

        assert (await ask(-1)).status_code == 200  # a finished conversation before the stop
        flying = [asyncio.create_task(ask(i)) for i in range(IN_FLIGHT)]
        await asyncio.sleep(0.5)  # decoding, 200 tokens at the emulated engines' pace
        os.killpg(pid, signal.SIGINT)
        return await asyncio.gather(*flying)


def test_ctrl_c_with_fifty_requests_in_flight_saves_every_finished_turn(tmp_path):
    port, out = _port(), tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "prorsa.cli", "serve", str(REPO / "pipelines" / "serve.yaml"),
                             "--engine", "emulated", "--port", str(port), "--output", str(out),
                             "engines.time_scale=1.0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.split("] ", 1)[-1].startswith("serving "):  # after the console's clock
                break
        assert proc.poll() is None, "".join(lines)
        answers = asyncio.run(_ask_then_stop(f"http://127.0.0.1:{port}", proc.pid))
        text = "".join(lines) + proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, text
    assert "Traceback" not in text, text
    assert [line for line in text.splitlines() if line.startswith("error: ")] == [
        f"error: interrupted; every conversation is saved in {out}"]
    codes = Counter(r.status_code for r in answers)
    assert set(codes) <= {200, 503}, codes
    for r in answers:
        if r.status_code == 503:
            assert r.json()["error"]["code"] == "shutting_down"
    rows = pq.read_table(out / "trajectories.parquet").to_pylist()
    # each answered request is a finished turn of its own conversation (one user, one turn each)
    assert sum(len(r["turns"]) for r in rows) == codes[200] + 1
    assert {r["status"] for r in rows} == {"completed"}
    assert (out / "summary.json").exists()
