"""The RL surface an outside trainer drives (/v1/rl/...), over the scripted runner of
test_serve_endpoint.py: pause holds new turns and waits out the ones in flight, resume lets them
go, update_weights hands the engines a model folder and moves the weight_version of later
responses and saved turns."""

import asyncio
import json
import time

import httpx
import numpy as np
from safetensors.numpy import save_file

from prorsa.rollout.drivers import Hooks
from prorsa.serve.app import make_app
from prorsa.serve.conversations import Hub
from prorsa.serve.episode import ServeDriver, Served
from tests.serve.test_serve_endpoint import Scripted, chat, serve, tok  # noqa: F401 (tok: a fixture)
from tests.serve.test_serve_openai import ASK, client


class Gated(Scripted):
    """Holds every turn until `release` is set."""

    def __init__(self, tok) -> None:
        super().__init__(tok)
        self.release = asyncio.Event()

    async def run_turn(self, req):
        self.sent.append(req)
        await self.release.wait()
        self.sent.pop()
        return await super().run_turn(req)


async def until(predicate, what: str) -> None:
    """Polls, so the test does not race the server; the deadline only stops a hang."""
    deadline = time.monotonic() + 60
    while not await predicate():
        assert time.monotonic() < deadline, f"never {what}"
        await asyncio.sleep(0.01)


def test_a_paused_server_holds_new_turns_until_resumed(tok):
    runner = Scripted(tok)

    async def requests(http):
        paused = (await http.post("/v1/rl/pause")).json()
        ask = asyncio.create_task(client(http).chat.completions.create(model="tiny", messages=ASK))

        async def held():
            return (await http.get("/v1/rl/weight_version")).json()["waiting"] == 1

        await until(held, "held at the gate")
        sent_while_paused = len(runner.sent)
        resumed = (await http.post("/v1/rl/resume")).json()
        return paused, sent_while_paused, resumed, await ask

    (paused, sent_while_paused, resumed, reply), done, _ = serve(tok, requests, runner)
    assert paused == {"weight_version": 0, "paused": True, "waiting": 0}
    assert sent_while_paused == 0  # the request reached its conversation, not the engines
    assert resumed["paused"] is False
    assert reply.choices[0].message.content == "reply c0 0" and len(done) == 1


def test_a_stop_while_paused_refuses_the_held_turn_and_saves_nothing_of_it(tok):
    runner = Scripted(tok)

    async def main():
        hub, done = Hub(idle_s=30), []
        driver = ServeDriver(hub, tok, Served("swe", 0, max_context=2048, max_tokens=64))
        rollout = asyncio.create_task(driver(None, None, runner, time.monotonic, Hooks(done.append)))
        await asyncio.sleep(0)
        transport = httpx.ASGITransport(app=make_app(hub, "tiny", tok, rl=driver.rl))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            await http.post("/v1/rl/pause")
            ask = asyncio.create_task(http.post("/v1/chat/completions", json=chat(ASK)))

            async def held():
                return driver.rl.waiting == 1

            await until(held, "held at the gate")
            hub.close()  # what Ctrl-C does (Endpoint.stop)
            refused = await ask
        await rollout  # the driver ends: nothing waits on the gate for ever
        return refused, done

    refused, done = asyncio.run(main())
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    assert runner.sent == [] and done == []


def test_pause_answers_once_the_turn_in_flight_has_finished(tok):
    runner = Gated(tok)

    async def requests(http):
        ask = asyncio.create_task(client(http).chat.completions.create(model="tiny", messages=ASK))

        async def started():
            return len(runner.sent) == 1

        await until(started, "started on the engines")
        pause = asyncio.create_task(http.post("/v1/rl/pause"))
        await asyncio.sleep(0.2)
        waited = not pause.done()  # it cannot end while the turn is held
        runner.release.set()
        reply, paused = await ask, await pause
        await http.post("/v1/rl/resume")
        return waited, reply, paused

    waited, reply, paused = serve(tok, requests, runner)[0]
    assert waited and paused.status_code == 200 and paused.json()["paused"] is True
    assert reply.choices[0].message.content == "reply c0 0"  # the turn in flight finished, not cut


def test_update_weights_loads_a_folder_and_moves_the_version_of_later_turns(tok, tmp_path):
    weights = tmp_path / "step-1.safetensors"
    save_file({"w": np.ones((2, 2), dtype=np.float32)}, str(weights))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    loaded = []

    async def load(model_dir):
        loaded.append(model_dir)

    async def requests(http):
        oa, h = client(http), {"X-Session-Id": "s"}
        r1 = await oa.chat.completions.create(model="tiny", messages=ASK, extra_headers=h)
        by_file = await http.post("/v1/rl/update_weights", json={"model_path": str(weights)})
        messages = ASK + [{"role": "assistant", "content": r1.choices[0].message.content},
                          {"role": "user", "content": "and?"}]
        r2 = await oa.chat.completions.create(model="tiny", messages=messages, extra_headers=h)
        by_folder = await http.post("/v1/rl/update_weights", json={"model_path": str(model), "weight_version": 9})
        s = await oa.chat.completions.create(model="tiny", messages=ASK, stream=True)
        chunks = [c async for c in s]
        missing = await http.post("/v1/rl/update_weights", json={"model_path": str(tmp_path / "nothing")})
        untyped = await http.post("/v1/rl/update_weights", json={"model_path": str(model), "weight_version": "x"})
        now = (await http.get("/v1/rl/weight_version")).json()
        return r1, by_file, r2, by_folder, chunks, missing, untyped, now

    (r1, by_file, r2, by_folder, chunks, missing, untyped, now), done, _ = serve(
        tok, requests, weight_version=3, load_weights=load)
    assert by_file.status_code == 200 and by_file.json()["weight_version"] == 4 and by_file.json()["success"]
    assert by_folder.json()["weight_version"] == 9 and now["weight_version"] == 9
    assert [x.model_extra["weight_version"] for x in (r1, r2)] == [3, 4]
    assert {c.model_extra["weight_version"] for c in chunks} == {9}
    # a file becomes a folder the engines load whole; a folder is loaded as it is
    assert loaded[1] == model and (loaded[0] / "model.safetensors").read_bytes() == weights.read_bytes()
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model_path" and len(loaded) == 2
    assert untyped.status_code == 400 and untyped.json()["error"]["param"] == "weight_version"
    [s] = [t for t in done if t.task_id == "s"]
    assert [t.policy_version for t in s.turns] == [3, 4]  # the saved turns say which weights wrote them


def test_engines_that_fail_to_load_leave_the_version_and_open_the_gate(tok, tmp_path):
    (tmp_path / "config.json").write_text("{}")

    async def load(model_dir):
        raise RuntimeError("engine-0: reloading weights failed (500)")

    async def requests(http):
        failed = await http.post("/v1/rl/update_weights", json={"model_path": str(tmp_path)})
        after = await client(http).chat.completions.create(model="tiny", messages=ASK)
        return failed, after

    failed, after = serve(tok, requests, load_weights=load)[0]
    assert failed.status_code == 500 and "engine-0" in failed.json()["error"]["message"]
    assert after.model_extra["weight_version"] == 0


def test_the_rl_paths_want_the_api_key(tok):
    async def requests(http):
        bare = await http.post("/v1/rl/pause")
        keyed = await http.get("/v1/rl/weight_version", headers={"Authorization": "Bearer sesame"})
        return bare, keyed

    bare, keyed = serve(tok, requests, api_key="sesame")[0]
    assert bare.status_code == 401 and json.loads(bare.text)["error"]["code"] == "invalid_api_key"
    assert keyed.status_code == 200 and keyed.json()["paused"] is False
