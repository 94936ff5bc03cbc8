"""`prorsa serve` as a user starts it, on emulated engines (a real Dask run, no model): the key from
the environment, n > 1 branches, a stream and a token-id prompt through the real `openai` client,
an outside trainer's pause, weight update (pushed to every engine worker) and resume, and what the
run folder keeps of them. Emulated engines write token counts, not text, so replies
are empty here; their text is tested over a scripted runner (test_serve_openai.py)."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pyarrow.parquet as pq
from openai import AsyncOpenAI
from safetensors.numpy import save_file

from prorsa.serve.client import end_session
from tests.serve.test_serve_vllm import _started

ROOT = Path(__file__).resolve().parents[2]
ASK = [{"role": "user", "content": "What is 2+3?"}]


async def _trainer(url: str, weights: Path, oa: AsyncOpenAI):
    """Pause, update, resume as an RL trainer does between steps; then a turn on the new weights."""
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer sesame"}, timeout=120) as http:
        paused = (await http.post("/rl/pause")).json()
        updated = (await http.post("/rl/update_weights", json={"model_path": str(weights)})).json()
        resumed = (await http.post("/rl/resume")).json()
    after = await oa.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, user="after")
    return paused, updated, resumed, after


async def _drive(url: str, weights: Path):
    wrong = AsyncOpenAI(base_url=url, api_key="wrong", max_retries=0, timeout=120)
    try:
        await wrong.models.list()
        refused = None
    except openai.AuthenticationError as e:
        refused = e.status_code
    oa = AsyncOpenAI(base_url=url, api_key="sesame", max_retries=0, timeout=120)
    n4 = await oa.chat.completions.create(model="tiny", messages=ASK, n=4, max_tokens=8,
                                          extra_headers={"X-Session-Id": "n4"})
    stream = await oa.chat.completions.create(model="tiny", messages=ASK, max_tokens=6, stream=True,
                                              temperature=0.5,
                                              stream_options={"include_usage": True},
                                              extra_headers={"X-Session-Id": "streamed"})
    chunks = [c async for c in stream]
    ids = await oa.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=4, user="ids",
                                      extra_body={"return_token_ids": True})
    trainer = await _trainer(url, weights, oa)
    bad = None
    try:
        await oa.chat.completions.create(model="tiny", messages=ASK, temperature=-1, user="bad")
    except openai.BadRequestError as e:
        bad = e.body
    return refused, n4, chunks, ids, trainer, bad


async def _ended_and_saved(url: str, run_dir: Path) -> tuple[dict, float]:
    """The client ends a conversation with a reward and metadata (the small client helper): how long
    until the run folder holds it."""
    ended = await asyncio.to_thread(end_session, url, "ids", reward=0.5, metadata={"tests_passed": 3},
                                    api_key="sesame")
    t0 = time.monotonic()
    while not any(r["task_id"] == "ids" and r["reward"] == 0.5 for part in sorted((run_dir / "parts").glob("*.parquet"))
                  for r in pq.read_table(part, columns=["task_id", "reward"]).to_pylist()):
        assert time.monotonic() - t0 < 60, "the ended conversation was never saved"
        await asyncio.sleep(0.05)
    return ended, time.monotonic() - t0


def test_a_served_run_keeps_n_branches_streams_and_token_id_prompts(tmp_path):
    run_dir = tmp_path / "run"
    weights = tmp_path / "step-1.safetensors"
    save_file({"w": np.ones((2, 2), dtype=np.float32)}, str(weights))
    proc = subprocess.Popen([sys.executable, "-m", "prorsa.cli", "serve", "pipelines/serve.yaml", "--engine", "emulated",
                             "--port", "0", "--output", str(run_dir), "runtime.dashboard_address=null"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | {"PRORSA_API_KEY": "sesame"})
    try:
        url = _started(proc, time.time() + 300)
        refused, n4, chunks, ids, (paused, updated, resumed, after), bad = asyncio.run(_drive(url, weights))
        ended, saved_after_s = asyncio.run(_ended_and_saved(url, run_dir))
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert refused == 401
    assert bad is not None and bad.get("error", bad)["param"] == "temperature"  # refused by name
    assert ended["session"] == "ids" and ended["ended"] and ended["reward"] == 0.5, ended
    print(f"an ended conversation was on disk {saved_after_s:.2f} s after its end")
    assert len(n4.choices) == 4 and n4.usage.completion_tokens == 4 * 8 and n4.model_extra["weight_version"] == 0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks[:-1] if c.choices[0].finish_reason] == ["length"]
    assert ids.choices[0].model_extra["prompt_token_ids"] == [5, 6, 7, 8]
    assert paused["paused"] and updated["weight_version"] == 1 and not resumed["paused"]
    assert after.model_extra["weight_version"] == 1
    assert (run_dir / "weights" / "v1" / "model.safetensors").read_bytes() == weights.read_bytes()
    assert proc.returncode == 2, out  # a stop by a signal exits 2, here with every conversation saved

    rows = pq.read_table(run_dir / "trajectories.parquet").to_pylist()
    branches = [r for r in rows if r["task_id"] == "n4"]
    assert sorted((r["traj_id"], r["group_index"]) for r in branches) == [("c0", 0), ("c0-1", 1), ("c0-2", 2),
                                                                          ("c0-3", 3)]
    assert len({tuple(r["prompt_ids"]) for r in branches}) == 1 and all(len(r["turns"]) == 1 for r in branches)
    assert all(r["turns"][0]["decode_tokens"] == 8 for r in branches)
    [streamed] = [r for r in rows if r["task_id"] == "streamed"]
    assert streamed["turns"][0]["decode_tokens"] == 6
    # each turn keeps how it was drawn: the request's temperature, else the pipeline's sampling:
    assert streamed["turns"][0]["sampling"]["temperature"] == 0.5
    assert {r["turns"][0]["sampling"]["temperature"] for r in branches} == {1.0}
    [by_ids] = [r for r in rows if r["task_id"] == "ids"]
    assert by_ids["prompt_ids"] == [5, 6, 7, 8]
    assert (by_ids["reward"], json.loads(by_ids["metadata"])) == (0.5, {"tests_passed": 3})
    assert by_ids["policy_version"] == 0
    [later] = [r for r in rows if r["task_id"] == "after"]
    assert later["policy_version"] == 1 and [t["policy_version"] for t in later["turns"]] == [1]
