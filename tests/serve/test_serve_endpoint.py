"""The endpoint without engines: the HTTP app, the hub and the served driver over a scripted runner
(replies are fixed text, so every id and every error body can be checked exactly)."""

import asyncio
import json
import math
import time
from pathlib import Path

import httpx
import pytest

from prorsa.agent.loop import TurnRequest, TurnResult
from prorsa.engine.tiny_model import ensure_tiny_model
from prorsa.rollout.drivers import Hooks
from prorsa.sampling import Sampling
from prorsa.serve.app import Guards, make_app
from prorsa.serve.conversations import Hub
from prorsa.serve.episode import ServeDriver, Served
from prorsa.serve.samples import served_sample

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    cache = Path(".prorsa/models") if Path(".prorsa/models").is_dir() else tmp_path_factory.mktemp("models")
    return AutoTokenizer.from_pretrained(str(ensure_tiny_model(cache)))


class Scripted:
    """Replies 'reply <traj> <turn>' and the model's EOS; remembers every turn it was sent."""

    needs_token_ids, vocab_size = True, 2048

    def __init__(self, tok, reply=None) -> None:
        self.tok, self.sent = tok, []
        self.reply = reply or (lambda req: f"reply {req.traj_id} {req.turn}")

    async def run_turn(self, req: TurnRequest) -> TurnResult:
        self.sent.append(req)
        ids = tuple(self.tok.encode(self.reply(req), add_special_tokens=False)) + (self.tok.eos_token_id,)
        # asked for alternatives, it gives one more than asked, as vLLM does (the sampled token beside)
        top = tuple(tuple((t + j, -0.5 - j) for j in range(req.sampling.top_logprobs + 1)) for t in ids)
        return TurnResult(req.traj_id, req.turn, "engine-0", "engine-1", req.appended_tokens, 0, len(ids),
                          token_ids=ids, logprobs=(-0.5,) * len(ids), end_s=time.monotonic(),
                          top_logprobs=top if req.sampling.top_logprobs else ())


def serve(tok, requests, runner=None, max_context=2048, idle_s=30, sampling=Sampling(), max_request_bytes=2**24,
          weight_version=0, version=None, load_weights=None, parser=None, **app_options):
    """Run the app and driver; `requests(client)` is a coroutine making requests; -> (its value,
    the trajectories, the runner). `version`: a trainer's version hook; `load_weights`: the engines'
    (the RL loop's push); `parser`: the tool-call parser; app_options: make_app's Guards."""
    runner = runner or Scripted(tok)

    async def main():
        hub = Hub(idle_s=idle_s)
        done = []
        driver = ServeDriver(hub, tok, Served("swe", 0, max_context=max_context, max_tokens=64, sampling=sampling,
                                              weight_version=weight_version), parser=parser)
        hooks = Hooks(done.append, version=version, load_weights=load_weights)
        rollout = asyncio.create_task(driver(None, None, runner, time.monotonic, hooks))
        await asyncio.sleep(0)  # the driver under way, as before a real server listens
        transport = httpx.ASGITransport(app=make_app(hub, "tiny", tok, Guards(max_request_bytes, **app_options),
                                                     rl=driver.rl, parser=parser))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            value = await requests(client)
        hub.close()
        await rollout
        return value, sorted(done, key=lambda r: r.spec.traj_id), runner

    return asyncio.run(main())


def chat(messages, **extra):
    return {"model": "tiny", "messages": messages, **extra}


@pytest.mark.parametrize("body, param, words", [
    (b"{not json", None, "not valid JSON"),
    (b'{"model": "tiny"}', "messages", "'messages' is a required property"),
    (b'{"messages": []}', "messages", "messages"),
    (b'{"messages": [{"role": "robot", "content": "x"}]}', "messages.0.role", "messages.0.role"),
    (b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"7": 5}}', "logit_bias",
     "logit_bias is not supported"),
    (b'{"messages": [{"role": "user", "content": "x"}], "presence_penalty": 3}', "presence_penalty",
     "presence_penalty"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}}', "stream_options",
     "only allowed with stream=true"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', "n", "n"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens", "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": -1}', "temperature", "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": 99}', "temperature", "temperature"),
    (b'{"messages": [{"role": "user", "content": "x"}], "top_p": 7}', "top_p", "top_p"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}', "stop", "up to 4"),
    (b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}', "tool_choice",
     "tool_choice 'required' is not supported"),
    (b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function"}}', "tool_choice",
     "forced tool call is not supported"),
    (b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}',
     "response_format", "'json_object' is not supported"),
])
def test_bad_chat_requests_get_an_openai_400(tok, body, param, words):
    async def requests(client):
        return await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})

    r, done, runner = serve(tok, requests)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and words in err["message"], err
    assert done == [] and runner.sent == []  # nothing reached the engines


def test_top_logprobs_name_the_likeliest_tokens_beside_each_generated_one(tok):
    async def requests(client):
        user = [{"role": "user", "content": "hi"}]
        chat_r = await client.post("/v1/chat/completions", json=chat(user, logprobs=True, top_logprobs=2))
        text_r = await client.post("/v1/completions", json={"prompt": "2+3=", "logprobs": 2})
        refused = await client.post("/v1/chat/completions", json=chat(user, top_logprobs=2))
        return chat_r.json(), text_r.json(), refused

    (chat_r, text_r, refused), _, runner = serve(tok, requests)
    assert [r.sampling.top_logprobs for r in runner.sent] == [2, 2]
    content = chat_r["choices"][0]["logprobs"]["content"]
    for item in content:  # the two likeliest, as text, not the third the engine gave beside them
        assert [a["logprob"] for a in item["top_logprobs"]] == [-0.5, -1.5]
        assert item["top_logprobs"][0]["token"] == item["token"]  # here the sampled token is the likeliest
    lp = text_r["choices"][0]["logprobs"]
    assert len(lp["top_logprobs"]) == len(lp["tokens"]) and all(len(d) <= 2 for d in lp["top_logprobs"])
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "top_logprobs"


def test_text_no_context_can_hold_is_refused_before_it_is_tokenized(tok):
    from prorsa.serve.app import make_app
    from prorsa.serve.conversations import Hub

    longest = max(map(len, tok.get_vocab()))
    hub = Hub(30)
    app = make_app(hub, "tiny", tok, max_context=64)
    tokenized: list = []
    tok_encode, tok.encode = tok.encode, lambda *a, **k: tokenized.append(a) or tok_encode(*a, **k)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.post("/v1/chat/completions",
                                     json=chat([{"role": "user", "content": "x" * (64 * longest + 1)}]))

    try:
        r = asyncio.run(main())
    finally:
        tok.encode = tok_encode
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and err["param"] == "messages", err
    assert tokenized == []  # refused before any tokenizer saw it


def test_a_form_encoded_body_is_told_to_be_json(tok):
    async def requests(client):  # what `curl -d` sends without -H 'Content-Type: application/json'
        return await client.post("/v1/chat/completions", content=b'{"messages": []}',
                                 headers={"content-type": "application/x-www-form-urlencoded"})

    r, done, runner = serve(tok, requests)
    assert r.status_code == 400 and "must be JSON, sent with Content-Type: application/json" in r.json()["error"]["message"]
    assert done == [] and runner.sent == []


def test_a_request_s_sampling_reaches_the_engine_over_the_pipeline_s(tok):
    """What a request sets replaces the pipeline's field by field; the rest stays the pipeline's."""
    pipeline = Sampling(temperature=0.7, top_p=0.9)

    async def requests(client):
        user = [{"role": "user", "content": "hi"}]
        await client.post("/v1/chat/completions", json=chat(user, temperature=0, seed=5, stop="\n"),
                          headers={"X-Session-Id": "a"})
        await client.post("/v1/chat/completions", json=chat(user), headers={"X-Session-Id": "b"})
        await client.post("/v1/completions", json={"prompt": "2+3=", "top_p": 0.5, "top_k": 4, "min_p": 0.05,
                                                   "frequency_penalty": 0.5, "repetition_penalty": 1.1})

    _, _, runner = serve(tok, requests, sampling=pipeline)
    asked = {r.traj_id: r.sampling for r in runner.sent}
    assert sorted(asked.values(), key=repr) == sorted([
        Sampling(temperature=0.0, top_p=0.9, seed=5, stop=("\n",)), pipeline,
        Sampling(temperature=0.7, top_p=0.5, top_k=4, min_p=0.05, frequency_penalty=0.5, repetition_penalty=1.1)],
        key=repr)


def test_tool_choice_none_offers_no_tools(tok):
    async def requests(client):
        user = [{"role": "user", "content": "What is 2+3?"}]
        await client.post("/v1/chat/completions", json=chat(user, tools=TOOLS, tool_choice="none"),
                          headers={"X-Session-Id": "none"})
        await client.post("/v1/chat/completions", json=chat(user, tools=TOOLS), headers={"X-Session-Id": "auto"})

    _, done, _ = serve(tok, requests)
    prompts = {r.task_id: tok.decode(r.prompt_ids) for r in done}
    assert TOOLS[0]["function"]["name"] in prompts["auto"] and TOOLS[0]["function"]["name"] not in prompts["none"]


def test_a_body_past_the_limit_is_a_413_before_it_reaches_a_conversation(tok):
    big = json.dumps(chat([{"role": "user", "content": "x" * 5000}])).encode()

    async def requests(client):
        declared = await client.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})

        async def chunks():  # no content-length: counted as it arrives
            for i in range(0, len(big), 1000):
                yield big[i:i + 1000]

        streamed = await client.post("/v1/chat/completions", content=chunks(),
                                     headers={"content-type": "application/json"})
        small = await client.post("/v1/chat/completions", json=chat([{"role": "user", "content": "hi"}]))
        return declared, streamed, small

    (declared, streamed, small), done, runner = serve(tok, requests, max_request_bytes=4096)
    for r in (declared, streamed):
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    assert small.status_code == 200 and len(runner.sent) == 1 and len(done) == 1


def test_health_and_unknown_paths_speak_openai(tok):
    async def requests(client):
        return await client.get("/health"), await client.get("/v1/nothing"), await client.delete("/v1/models")

    (health, missing, wrong_method), _, _ = serve(tok, requests)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert "/v1/nothing" in missing.json()["error"]["message"]
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def test_a_client_ends_its_conversation_with_a_reward_and_it_is_saved_at_once(tok):
    async def requests(client):
        user = [{"role": "user", "content": "What is 2+3?"}]
        await client.post("/v1/chat/completions", json=chat(user), headers={"X-Session-Id": "s"})
        ended = await client.post("/v1/sessions/s/end", json={"reward": 1.5})
        again = await client.post("/v1/chat/completions", json=chat(user), headers={"X-Session-Id": "s"})
        unscored = await client.post("/v1/sessions/s/end")
        unknown = await client.post("/v1/sessions/nobody/end", json={"reward": 0})
        bad = await client.post("/v1/sessions/s/end", json={"reward": "high"})
        return ended, again, unscored, unknown, bad

    (ended, again, unscored, unknown, bad), done, _ = serve(tok, requests, idle_s=3600)
    assert ended.status_code == 200 and ended.json() == {"session": "s", "trajectory": "c0", "ended": True,
                                                          "reward": 1.5}
    assert again.status_code == 200 and unscored.json()["trajectory"] == "c1"  # a new conversation
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "session"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reward"
    assert [(r.spec.traj_id, r.task_id, len(r.turns)) for r in done] == [("c0", "s", 1), ("c1", "s", 1)]
    assert done[0].reward == 1.5 and math.isnan(done[1].reward)


def test_a_completion_without_prompt_is_a_400_naming_it(tok):
    async def requests(client):
        return await client.post("/v1/completions", json={"model": "tiny"})

    r, _, _ = serve(tok, requests)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_sessions_header_then_user_then_a_fresh_id(tok):
    async def requests(client):
        first = chat([{"role": "user", "content": "hi"}])
        a = await client.post("/v1/chat/completions", json=first | {"user": "u"}, headers={"X-Session-Id": "h"})
        b = await client.post("/v1/chat/completions", json=first | {"user": "u"})
        c = await client.post("/v1/chat/completions", json=first)
        return [r.headers["X-Session-Id"] for r in (a, b, c)]

    sessions, done, _ = serve(tok, requests)
    assert sessions[:2] == ["h", "u"] and sessions[2] not in ("h", "u")
    assert [r.task_id for r in done] == sessions  # one trajectory per session


def test_a_conversation_is_one_trajectory_whose_ids_are_its_text(tok):
    user = {"role": "user", "content": "What is 2+3?"}

    async def requests(client):
        messages, replies = [user], []
        for k in range(3):
            r = await client.post("/v1/chat/completions", json=chat(messages, tools=TOOLS, logprobs=True),
                                  headers={"X-Session-Id": "s"})
            body = r.json()
            reply = body["choices"][0]["message"]["content"]
            replies.append(body)
            messages = messages + [{"role": "assistant", "content": reply}, {"role": "tool", "content": f"{k}"}]
        return messages[:-1], replies

    (messages, replies), done, runner = serve(tok, requests)
    assert [b["choices"][0]["message"]["content"] for b in replies] == [f"reply c0 {k}" for k in range(3)]
    assert all(b["choices"][0]["finish_reason"] == "stop" for b in replies)
    assert len(replies[0]["choices"][0]["logprobs"]["content"]) == replies[0]["usage"]["completion_tokens"]
    [traj] = done
    assert [t.turn for t in traj.turns] == [0, 1, 2] and traj.status == "completed"
    # each turn's context is the last one's plus its reply and the text the next request added
    for before, after, t in zip(runner.sent, runner.sent[1:], traj.turns):
        assert after.token_ids[:len(before.token_ids)] == before.token_ids
        assert after.token_ids[len(before.token_ids):len(before.token_ids) + len(t.token_ids)] == t.token_ids
    # the whole trajectory decodes to the conversation as the chat template writes it
    ids = list(runner.sent[-1].token_ids) + list(traj.turns[-1].token_ids)
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert tok.decode(ids, skip_special_tokens=False) == text.rstrip("\n")
    # and a trainer gets the same ids back from what the run saves, the model's tokens masked 1
    from prorsa.metrics.outputs import trajectory_row

    sample = served_sample(trajectory_row(traj), tok)
    assert list(sample.token_ids) == ids
    assert [i for i, m in zip(sample.token_ids, sample.loss_mask) if m] == [i for t in traj.turns for i in t.token_ids]
    assert all(x == -0.5 for x, m in zip(sample.rollout_logprobs, sample.loss_mask) if m)


def test_a_request_that_does_not_continue_starts_a_new_trajectory(tok):
    async def requests(client):
        h = {"X-Session-Id": "s"}
        await client.post("/v1/chat/completions", json=chat([{"role": "user", "content": "a"}]), headers=h)
        await client.post("/v1/chat/completions", json=chat([{"role": "user", "content": "b"}]), headers=h)

    _, done, _ = serve(tok, requests)
    assert [(r.task_id, len(r.turns)) for r in done] == [("s", 1), ("s", 1)]


def test_completions_continue_by_text_and_a_reply_with_a_call_returns_tool_calls(tok):
    call = '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'

    async def requests(client):
        r = await client.post("/v1/chat/completions", json=chat([{"role": "user", "content": "x"}]))
        first = await client.post("/v1/completions", json={"prompt": "once", "user": "p", "max_tokens": 8})
        text = "once" + first.json()["choices"][0]["text"] + " then"
        second = await client.post("/v1/completions", json={"prompt": text, "user": "p", "ignore_eos": True})
        return r.json(), second

    runner = Scripted(tok, reply=lambda req: call if req.traj_id == "c0" else "go")
    (body, second), done, runner = serve(tok, requests, runner)
    msg = body["choices"][0]
    assert msg["finish_reason"] == "tool_calls"
    assert msg["message"]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2}'}
    assert second.status_code == 200
    assert [len(r.turns) for r in done] == [1, 2]
    assert runner.sent[-1].decode_tokens == 16  # OpenAI's default for completions
    assert [r.to_eos for r in runner.sent] == [True, True, False]  # vLLM's ignore_eos: exact lengths
    assert done[1].turns[0].observation == " then"


def test_a_conversation_past_the_context_is_refused(tok):
    async def requests(client):
        return await client.post("/v1/chat/completions", json=chat([{"role": "user", "content": "word " * 50}]))

    r, done, runner = serve(tok, requests, max_context=20)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert runner.sent == [] and done == []


def test_the_example_agent_runs_through_the_openai_client(tok):
    import importlib.util

    from openai import AsyncOpenAI

    spec = importlib.util.spec_from_file_location("openai_agent", Path(__file__).parents[2] / "examples" / "openai_agent.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    async def requests(client):
        openai = AsyncOpenAI(base_url="http://test/v1", api_key="none", http_client=client)
        return await asyncio.gather(*(example.converse(openai, f"agent-{i}", i, 1, 3) for i in range(2)))

    chats, done, _ = serve(tok, requests)
    assert [[m["role"] for m in c] for c in chats] == [["user", "assistant", "tool", "assistant", "tool", "assistant"]] * 2
    assert sorted((r.task_id, len(r.turns)) for r in done) == [("agent-0", 3), ("agent-1", 3)]
    assert all(t.tool_s >= 0.5 for r in done for t in r.turns[:-1])  # the example's tool time


def test_messages_the_template_cannot_write_are_a_400_and_the_conversation_goes_on(tok):
    user = {"role": "user", "content": "a"}

    async def requests(client):
        h = {"X-Session-Id": "s"}
        first = (await client.post("/v1/chat/completions", json=chat([user]), headers=h)).json()
        reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
        bad = await client.post("/v1/chat/completions", headers=h,
                                json=chat([user, reply | {"tool_calls": 5}, {"role": "tool", "content": "1"}]))
        good = await client.post("/v1/chat/completions", headers=h,
                                 json=chat([user, reply, {"role": "tool", "content": "1"}]))
        return bad, good

    (bad, good), done, _ = serve(tok, requests)
    assert bad.status_code == 400 and "chat template cannot write" in bad.json()["error"]["message"]
    assert good.status_code == 200 and [len(r.turns) for r in done] == [2]


def test_a_failed_turn_is_a_500_and_the_session_goes_on_in_a_new_trajectory(tok):
    class FailsFirst(Scripted):
        async def run_turn(self, req):
            if not self.sent:
                self.sent.append(req)
                raise OSError("engine gone")
            return await super().run_turn(req)

    async def requests(client):
        h, body = {"X-Session-Id": "s"}, chat([{"role": "user", "content": "a"}])
        first = await client.post("/v1/chat/completions", json=body, headers=h)
        # a guard against a session left stuck by the failed turn, not a speed bound
        second = await asyncio.wait_for(client.post("/v1/chat/completions", json=body, headers=h), 60)
        return first, second

    (first, second), done, _ = serve(tok, requests, FailsFirst(tok))
    assert first.status_code == 500 and "engine gone" in first.json()["error"]["message"]
    assert second.status_code == 200
    assert [(r.status, len(r.turns)) for r in done] == [("completed", 1)]  # a failed first turn saves nothing


def test_an_idle_conversation_ends_and_is_saved_while_the_server_goes_on(tok):
    async def requests(client):
        h, body = {"X-Session-Id": "s"}, chat([{"role": "user", "content": "a"}])
        await client.post("/v1/chat/completions", json=body, headers=h)
        await asyncio.sleep(0.5)  # past idle_s: the trajectory ends
        await client.post("/v1/chat/completions", json=body, headers=h)

    _, done, _ = serve(tok, requests, idle_s=0.2)
    assert [(r.task_id, len(r.turns)) for r in done] == [("s", 1), ("s", 1)]
    assert done[0].end_s < done[1].start_s  # the first was over before the second began
