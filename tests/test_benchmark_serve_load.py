"""benchmarks/serve_load.py's clients against the endpoint served on a real socket (a scripted
model): its sessions are whole conversations ended with a reward, and its oversized bodies, with a
length and chunked without one, come back as the 413 it times."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.benchmark_scripts import load_script
from tests.serve.served_app import ServedApp
from tests.serve.test_serve_endpoint import Scripted, tok  # noqa: F401 (tok: a fixture)

serve_load = load_script("serve_load.py")


def test_sessions_are_conversations_of_their_turns_ended_with_a_reward(tok):  # noqa: F811
    tally = serve_load.Tally()

    async def clients(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            until = time.perf_counter() + 0.5
            await asyncio.gather(*(serve_load.session_worker(client, w, until, 3, 8, tally) for w in range(4)))

    with ServedApp(tok, Scripted(tok)) as served:
        asyncio.run(clients(served.url))
        done = list(served.done)
    assert tally.failures == {} and {a[2] for a in tally.answers} == {200}
    assert sorted(a[3] for a in tally.answers) == sorted(list(range(3)) * (len(tally.answers) // 3))
    assert sum(tally.ends.values()) == tally.ends[200] == len(done) >= 4  # each session ended, saved at once
    assert all(len(r.turns) == 3 and r.reward == 1.0 for r in done)


def test_an_oversized_body_is_a_413_with_or_without_its_length(tok):  # noqa: F811
    body = serve_load.payload(8)  # the served app's limit: 1 MiB

    async def both(host: str, port: int) -> list:
        return [await serve_load.big_post(host, port, body, chunked) for chunked in (False, True)]

    with ServedApp(tok, Scripted(tok)) as served:
        host, port = served.sock.getsockname()[:2]
        answers = asyncio.run(both(host, port))
        done = list(served.done)
    assert [(status, error["code"]) for _, status, error in answers] == [(413, "request_too_large")] * 2
    assert len(body) == 8 * 2**20 and done == []
