"""The endpoint's RL surface through the real `openai` client, over the scripted runner of
test_serve_endpoint.py: streaming, n > 1 as branches, token-id prompts, weight versions, the API key
and the request timeout."""

import asyncio
import json

import openai
import pytest
from openai import AsyncOpenAI

from prorsa.serve.server import beyond_loopback, exposure_warning, policy_version_of
from tests.serve.test_serve_endpoint import TOOLS, Scripted, chat, serve, tok  # noqa: F401 (tok: a fixture)

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
ASK = [{"role": "user", "content": "What is 2+3?"}]


def client(http, key="none"):
    return AsyncOpenAI(base_url="http://test/v1", api_key=key, http_client=http, max_retries=0)


def by_turn(req):
    """Turn 0 calls the tool (after a few words), later turns answer: the same text whatever the trajectory."""
    return "Let me add. " + CALL if req.turn == 0 else "It is 5, déjà vu."


def without_ids(message):
    """Call ids name their trajectory: the rest of a message must match."""
    return message | {"tool_calls": [c | {"id": None} for c in message.get("tool_calls", [])]}


async def streamed_chat(oa, session, messages, **extra):
    """-> (the message put together from the chunks, finish reason, usage, chunks)."""
    stream = await oa.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, stream=True,
                                              extra_headers={"X-Session-Id": session}, **extra)
    content, calls, finish, usage, chunks = "", {}, None, None, []
    async for chunk in stream:
        chunks.append(chunk)
        usage = chunk.usage or usage
        for c in chunk.choices:
            content += c.delta.content or ""
            for call in c.delta.tool_calls or ():
                calls.setdefault(call.index, {"id": call.id, "type": "function", "function": {
                    "name": call.function.name, "arguments": call.function.arguments}})
            finish = c.finish_reason or finish
    message = {"role": "assistant", "content": content or None} | ({"tool_calls": list(calls.values())} if calls else {})
    return message, finish, usage, chunks


def test_a_streamed_chat_with_a_tool_call_is_recorded_as_a_plain_one(tok):
    async def requests(http):
        oa = client(http)
        got = {}
        for session, stream in (("streamed", True), ("plain", False)):
            messages = list(ASK)
            for k in range(2):
                if stream:
                    message, finish, usage, chunks = await streamed_chat(
                        oa, session, messages, logprobs=True, stream_options={"include_usage": True})
                else:
                    r = await oa.chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                                         extra_headers={"X-Session-Id": session})
                    m = r.choices[0].message
                    message = {"role": "assistant", "content": m.content} | (
                        {"tool_calls": [c.model_dump() for c in m.tool_calls]} if m.tool_calls else {})
                    finish, usage, chunks = r.choices[0].finish_reason, r.usage, []
                got.setdefault(session, []).append((message, finish, usage, chunks))
                messages = messages + [message, {"role": "tool", "tool_call_id": "x", "content": "5"}]
        raw = await http.post("/v1/chat/completions", json=chat(ASK, stream=True), headers={"X-Session-Id": "raw"})
        return got, raw

    (got, raw), done, _ = serve(tok, requests, Scripted(tok, reply=by_turn))
    for (s_msg, s_finish, s_usage, chunks), (p_msg, p_finish, p_usage, _) in zip(got["streamed"], got["plain"]):
        assert without_ids(s_msg) == without_ids(p_msg) and s_finish == p_finish and s_usage == p_usage
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == p_usage.completion_tokens
    first, second = got["streamed"][0][0], got["streamed"][1]
    assert first["content"] == "Let me add." and first["tool_calls"][0]["function"] == {
        "name": "add", "arguments": json.dumps({"a": 2, "b": 3})}
    assert got["streamed"][0][1] == "tool_calls" and second[1] == "stop"
    assert second[0]["content"] == "It is 5, déjà vu."
    # the text came a token at a time, each chunk with its token's logprob
    pieces = [c.choices[0].delta.content for c in second[3] if c.choices and c.choices[0].logprobs]
    assert len(pieces) == second[2].completion_tokens and "".join(pieces) == "It is 5, déjà vu."
    assert sum(1 for p in pieces if p) > len(pieces) // 2  # not the whole text in one chunk
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]") and raw.text.count("data: ") > 3
    trajectories = {r.task_id: r for r in done}
    streamed, plain = trajectories["streamed"], trajectories["plain"]
    assert streamed.prompt_ids == plain.prompt_ids and len(streamed.turns) == 2
    assert [(t.token_ids, t.observation) for t in streamed.turns] == [(t.token_ids, t.observation) for t in plain.turns]


def test_a_streamed_completion_gives_each_token_its_id_and_logprob(tok):
    async def requests(http):
        stream = await client(http).completions.create(model="tiny", prompt="2+3=", max_tokens=8, stream=True,
                                                       logprobs=0, extra_body={"return_token_ids": True})
        return [c async for c in stream]

    chunks, done, runner = serve(tok, requests, Scripted(tok, reply=lambda req: "five, déjà"))
    texts = [c.choices[0] for c in chunks if c.choices[0].finish_reason is None]
    [traj] = done
    generated = traj.turns[0].token_ids
    assert "".join(c.text for c in texts) == "five, déjà" and sum(1 for c in texts if c.text) > 2
    assert [i for c in texts for i in c.model_extra["token_ids"]] == list(generated)
    assert [x for c in texts for x in c.logprobs.token_logprobs] == [-0.5] * len(generated)
    assert texts[0].model_extra["prompt_token_ids"] == list(runner.sent[0].token_ids)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_choices_are_branches_of_one_conversation_and_the_client_goes_on_with_one(tok):
    async def requests(http):
        oa = client(http)
        h = {"X-Session-Id": "s"}
        r = await oa.chat.completions.create(model="tiny", messages=ASK, n=4, seed=7, extra_headers=h)
        pick = r.choices[2].message
        messages = ASK + [{"role": "assistant", "content": pick.content}, {"role": "user", "content": "Sure?"}]
        after = await oa.chat.completions.create(model="tiny", messages=messages, extra_headers=h)
        return r, after

    (r, after), done, runner = serve(tok, requests)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    texts = [c.message.content for c in r.choices]
    assert texts == ["reply c0 0", "reply c0-1 0", "reply c0-2 0", "reply c0-3 0"]  # each its own trajectory
    assert r.usage.completion_tokens == sum(len(t.turns[0].token_ids) for t in done)  # the prompt counted once
    assert r.usage.prompt_tokens == len(runner.sent[0].token_ids)
    first = runner.sent[:4]
    assert len({s.token_ids for s in first}) == 1 and {s.group for s in first} == {"c0"}  # one prefix, one group
    assert len({s.sampling.seed for s in first}) == 4  # n seeded draws, not one draw n times
    assert after.choices[0].message.content == "reply c0-2 1"  # the branch the client went on with
    trajectories = {r.spec.traj_id: r for r in done}
    assert sorted(trajectories) == ["c0", "c0-1", "c0-2", "c0-3"]
    assert [len(trajectories[t].turns) for t in sorted(trajectories)] == [1, 1, 2, 1]
    assert [trajectories[t].spec.group_index for t in sorted(trajectories)] == [0, 1, 2, 3]  # samples of one group
    assert len({t.prompt_ids for t in done}) == 1 and all(t.task_id == "s" for t in done)
    assert runner.sent[-1].token_ids[:len(first[2].token_ids)] == first[2].token_ids
    assert trajectories["c0-2"].turns[0].token_ids == tuple(tok.encode("reply c0-2 0", add_special_tokens=False)) + (
        tok.eos_token_id,)


def test_n_completions_continue_the_branch_whose_text_the_prompt_starts_with(tok):
    async def requests(http):
        oa = client(http)
        r = await oa.completions.create(model="tiny", prompt="once", n=2, user="p")
        again = await oa.completions.create(model="tiny", prompt="once" + r.choices[1].text + " then", user="p")
        return r, again

    (r, again), done, _ = serve(tok, requests)
    assert [c.text for c in r.choices] == ["reply c0 0", "reply c0-1 0"]
    assert again.choices[0].text == "reply c0-1 1"
    assert sorted((t.spec.traj_id, len(t.turns)) for t in done) == [("c0", 1), ("c0-1", 2)]


def test_a_token_id_prompt_continues_by_ids_and_returns_ids(tok):
    prompt = tok.encode("2+3=", add_special_tokens=False)

    async def requests(http):
        oa = client(http)
        first = await oa.completions.create(model="tiny", prompt=prompt, max_tokens=8, user="ids",
                                            extra_body={"return_token_ids": True})
        choice = first.choices[0].model_extra
        more = choice["prompt_token_ids"] + choice["token_ids"] + [17, 18]
        second = await oa.completions.create(model="tiny", prompt=more, max_tokens=8, user="ids")
        past = await http.post("/v1/completions", json={"prompt": [1, 10**6]})
        nested = await http.post("/v1/completions", json={"prompt": [[5, 6, 7]], "user": "other"})
        return first, second, past, nested

    (first, second, past, nested), done, runner = serve(tok, requests)
    assert first.choices[0].model_extra["prompt_token_ids"] == prompt
    assert list(runner.sent[0].token_ids) == prompt
    assert runner.sent[1].token_ids[-2:] == (17, 18) and runner.sent[1].appended_tokens == 2
    assert second.choices[0].text == "reply c0 1"
    assert past.status_code == 400 and past.json()["error"]["param"] == "prompt"
    assert nested.status_code == 200 and runner.sent[-1].token_ids == (5, 6, 7)
    ids_traj = next(t for t in done if t.task_id == "ids")
    assert ids_traj.prompt_ids == tuple(prompt) and len(ids_traj.turns) == 2
    assert ids_traj.turns[0].observation_ids == (17, 18)


def test_every_response_carries_the_weight_version_its_turn_ran_on(tok):
    version = [3]

    async def requests(http):
        oa = client(http)
        h = {"X-Session-Id": "v"}
        r1 = await oa.chat.completions.create(model="tiny", messages=ASK, extra_headers=h)
        version[0] = 4  # a trainer pushed new weights
        messages = ASK + [{"role": "assistant", "content": r1.choices[0].message.content},
                          {"role": "user", "content": "and?"}]
        r2 = await oa.chat.completions.create(model="tiny", messages=messages, extra_headers=h)
        c = await oa.completions.create(model="tiny", prompt="x")
        s = await oa.chat.completions.create(model="tiny", messages=ASK, stream=True)
        return r1, r2, c, [chunk async for chunk in s]

    (r1, r2, c, chunks), done, _ = serve(tok, requests, version=lambda: version[0])
    assert [x.model_extra["weight_version"] for x in (r1, r2, c)] == [3, 4, 4]
    assert {chunk.model_extra["weight_version"] for chunk in chunks} == {4}
    v = next(t for t in done if t.task_id == "v")
    assert v.policy_version == 3 and [t.policy_version for t in v.turns] == [3, 4]

    (r, _), _, _ = serve(tok, lambda http: asyncio.gather(
        client(http).chat.completions.create(model="tiny", messages=ASK), asyncio.sleep(0)), weight_version=7)
    assert r.model_extra["weight_version"] == 7  # no trainer: the served model's own version


def test_an_api_key_guards_every_path_but_health(tok):
    async def requests(http):
        outcomes = []
        for key in ("wrong", "sesame"):
            try:
                r = await client(http, key).chat.completions.create(model="tiny", messages=ASK)
                outcomes.append(r.choices[0].message.content)
            except openai.AuthenticationError as e:
                outcomes.append((e.status_code, e.body))
        bare = await http.get("/v1/models")
        health = await http.get("/health")
        return outcomes, bare, health

    ((wrong, right), bare, health), done, runner = serve(tok, requests, api_key="sesame")
    assert wrong[0] == 401 and wrong[1]["code"] == "invalid_api_key" and wrong[1]["type"] == "invalid_request_error"
    assert right == "reply c0 0" and len(runner.sent) == 1
    assert bare.status_code == 401 and "error" in bare.json()
    assert health.status_code == 200


def test_a_request_past_its_timeout_is_a_504_and_its_conversation_ends(tok):
    released, finished = asyncio.Event(), asyncio.Event()

    class Slow(Scripted):
        async def run_turn(self, req):
            if req.traj_id == "c0" and req.turn == 1:
                await released.wait()  # held past the timeout, until the client has had its 504
                try:
                    return await super().run_turn(req)
                finally:
                    finished.set()
            return await super().run_turn(req)

    async def requests(http):
        oa = client(http)
        h = {"X-Session-Id": "t"}
        r = await oa.chat.completions.create(model="tiny", messages=ASK, extra_headers=h)
        messages = ASK + [{"role": "assistant", "content": r.choices[0].message.content},
                          {"role": "user", "content": "more"}]
        try:
            await oa.chat.completions.create(model="tiny", messages=messages, extra_headers=h)
            timed_out = None
        except openai.APIStatusError as e:
            timed_out = e
        released.set()
        await finished.wait()  # the slow turn ends on the engines meanwhile
        later = await oa.chat.completions.create(model="tiny", messages=messages, extra_headers=h)
        return timed_out, later

    (timed_out, later), done, _ = serve(tok, requests, Slow(tok), request_timeout_s=2.0)
    assert timed_out is not None and timed_out.status_code == 504
    assert timed_out.body["code"] == "request_timeout"
    # the reply the client never saw ends its trajectory; the retry starts a new one
    assert later.choices[0].message.content == "reply c1 0"
    assert sorted((t.spec.traj_id, len(t.turns)) for t in done) == [("c0", 2), ("c1", 1)]


@pytest.mark.parametrize("host, beyond", [("127.0.0.1", False), ("localhost", False), ("::1", False),
                                          ("0.0.0.0", True), ("192.168.1.5", True), ("myhost", True)])
def test_hosts_beyond_loopback_are_told_apart(host, beyond):
    assert beyond_loopback(host) is beyond


def test_a_server_beyond_loopback_without_a_key_is_warned_about():
    assert "no API key" in exposure_warning("0.0.0.0", None)
    assert exposure_warning("0.0.0.0", "sesame") is None and exposure_warning("127.0.0.1", None) is None


def test_a_trainer_s_saved_model_is_served_as_its_version(tmp_path):
    assert policy_version_of(tmp_path) == 0
    (tmp_path / "policy.json").write_text(json.dumps({"policy_version": 12}))
    assert policy_version_of(tmp_path) == 12
