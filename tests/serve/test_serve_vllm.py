"""`prorsa serve` on two real vLLM CPU engines, driven by an agent written against the `openai` client.

The agent below is not Prorsa's: a small tool-using loop as any harness would write it. It runs
three conversations of three turns at once; after each reply it calls its local `add` tool (the
one the model asked for, or, since a random tiny model asks for none, the one the harness would
run anyway) and sends the result back. Then Ctrl-C: the server must end every conversation,
save it and exit cleanly; the saved trajectories' ids must be the conversations' text, with each
prefill on the prefill engine and each decode on the decode engine.

The policy is prorsa, which may switch an engine's role; engine groups hold each engine to one role
(engines.groups: a prefill group and a decode group), so the legs stay split under it by design.

One server for the module (starting two engines is most of its time): before the agent, a streamed
chat with tools, an n=4 chat, a token-id completion against the same text's, and an outside
trainer's pause, weight update and resume run on it; the agent's test comes last, as it stops the
server."""

import asyncio
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.vllm  # slow, and skipped without vLLM (tests/conftest.py)
ROOT = Path(__file__).resolve().parents[2]
CONVERSATIONS, TURNS, TOOL_S = 3, 3, 0.3
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


def add(a: int, b: int) -> int:
    time.sleep(TOOL_S)  # a tool takes time: the gap the lifecycle sees as tool time
    return a + b


async def agent(client, session: str, a: int, b: int) -> tuple[list[dict], list[str]]:
    """-> the conversation's messages (its last reply included) and each reply's finish reason."""
    messages = [{"role": "user", "content": f"What is {a} + {b}? Use the add tool."}]
    finishes = []
    for turn in range(TURNS):
        r = await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=24,
                                                 logprobs=True, extra_headers={"X-Session-Id": session})
        choice = r.choices[0]
        finishes.append(choice.finish_reason)
        reply = {"role": "assistant", "content": choice.message.content}
        calls = [c.model_dump() for c in choice.message.tool_calls or []]
        messages.append(reply | ({"tool_calls": calls} if calls else {}))
        if turn == TURNS - 1:
            break
        for call in calls or [{"id": f"h{turn}", "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})}}]:
            try:
                result = str(await asyncio.to_thread(add, **json.loads(call["function"]["arguments"])))
            except Exception as e:  # a malformed call is an observation, as in any harness
                result = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return messages, finishes


def _started(proc, deadline: float) -> str:
    lines = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.split("] ", 1)[-1].startswith("serving "):  # after the console's clock
            return line.split(" on ")[1].split()[0]
    raise AssertionError("the server did not start:\n" + "".join(lines))


class Server:
    """One `prorsa serve` on two vLLM engines for the whole module; stop() sends Ctrl-C once."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.proc = subprocess.Popen([sys.executable, "-m", "prorsa.cli", "serve", "pipelines/serve.yaml", "--port", "0",
                                      "--output", str(run_dir), "runtime.dashboard_address=null", "policy=prorsa",
                                      "engines.groups=[{count: 1, roles: [prefill]}, {count: 1, roles: [decode]}]",
                                      "engines.vllm.start_timeout_s=900"],  # a loaded CI machine starts servers slowly
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.url = _started(self.proc, time.time() + 960)
        self.out: str | None = None

    def client(self):
        from openai import AsyncOpenAI

        return AsyncOpenAI(base_url=self.url, api_key="none", max_retries=0, timeout=120)

    def stop(self) -> str:
        if self.out is None:
            self.proc.send_signal(signal.SIGINT)
            self.out, _ = self.proc.communicate(timeout=120)
        return self.out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("serve") / "run")
    try:
        yield s
    finally:
        s.kill()


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ROOT / ".prorsa" / "models" / "tiny-llama-s0-v2048"))


def test_a_streamed_chat_with_tools_joins_to_the_reply_and_its_ids(server, tok):
    async def streamed():
        stream = await server.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "What is 2 + 3? Use the add tool."}], tools=TOOLS,
            max_tokens=24, stream=True, stream_options={"include_usage": True},
            extra_headers={"X-Session-Id": "streamed"}, extra_body={"return_token_ids": True})
        return [c async for c in stream]

    chunks = asyncio.run(streamed())
    usage = chunks[-1].usage
    deltas = [c.choices[0] for c in chunks if c.choices]
    ids = [i for d in deltas for i in d.model_extra.get("token_ids") or ()]
    text = "".join(d.delta.content or "" for d in deltas)
    calls = [call for d in deltas for call in d.delta.tool_calls or ()]
    assert len(ids) == usage.completion_tokens > 0 and chunks[-1].choices == []
    finish = deltas[-1].finish_reason
    ended = finish in ("stop", "tool_calls") and ids[-1] == tok.eos_token_id
    reply = tok.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
    if calls:  # the random tiny model seldom writes a whole call: when it does, it comes as deltas
        assert finish == "tool_calls" and all(c.function.name for c in calls)
    else:
        assert text == reply and finish in ("stop", "length")


def test_n_samples_share_the_prompt_and_a_token_id_prompt_is_the_text_s(server, tok):
    text = "Count: one, two,"
    prompt = tok.encode(text, add_special_tokens=False)

    async def ask():
        oa = server.client()
        n4 = await oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}], n=4,
                                              max_tokens=12, temperature=1.0, extra_headers={"X-Session-Id": "n4"},
                                              extra_body={"return_token_ids": True})
        by_text = await oa.completions.create(model="tiny", prompt=text, max_tokens=12, temperature=0, user="by-text",
                                              extra_body={"return_token_ids": True})
        by_ids = await oa.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, user="by-ids",
                                             extra_body={"return_token_ids": True})
        top = await oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": text}],
                                               max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, user="top")
        return n4, by_text, by_ids, top

    n4, by_text, by_ids, top = asyncio.run(ask())
    # greedy: each token is its position's likeliest, and vLLM's 3 alternatives come likeliest first
    for item in top.choices[0].logprobs.content:
        alternatives = [a.logprob for a in item.top_logprobs]
        assert len(alternatives) == 3 and alternatives == sorted(alternatives, reverse=True)
        assert item.top_logprobs[0].token == item.token and abs(alternatives[0] - item.logprob) < 1e-4
    assert [c.index for c in n4.choices] == [0, 1, 2, 3]
    assert n4.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in n4.choices)
    assert len({tuple(c.model_extra["token_ids"]) for c in n4.choices}) > 1  # four draws, not one four times
    assert by_ids.choices[0].model_extra["prompt_token_ids"] == prompt
    assert by_text.choices[0].model_extra["token_ids"] == by_ids.choices[0].model_extra["token_ids"]
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_a_trainer_s_weights_reach_both_engines_and_later_replies_carry_their_version(server, tmp_path):
    import httpx
    import torch
    from safetensors.torch import load_file, save_file

    model = ROOT / ".prorsa" / "models" / "tiny-llama-s0-v2048"
    noise = torch.Generator().manual_seed(0)
    moved = {k: v + 0.5 * torch.randn(v.shape, generator=noise, dtype=v.dtype)
             for k, v in load_file(str(model / "model.safetensors")).items()}
    step = tmp_path / "step-1.safetensors"
    save_file(moved, str(step))

    async def trainer():
        oa = server.client()

        async def greedy(session):
            r = await oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Count: one,"}],
                                                 max_tokens=16, temperature=0, extra_headers={"X-Session-Id": session})
            return r.choices[0].message.content, r.model_extra["weight_version"]

        async with httpx.AsyncClient(base_url=server.url, timeout=600) as http:
            before = await greedy("before")
            paused = (await http.post("/rl/pause")).json()
            updated = (await http.post("/rl/update_weights", json={"model_path": str(step)})).json()
            await http.post("/rl/resume")
            after = await greedy("after")
            # the served model's own weights back, as a folder: the agent's test below runs on them
            restored = (await http.post("/rl/update_weights", json={"model_path": str(model)})).json()
            again = await greedy("again")
        return before, paused, updated, after, restored, again

    before, paused, updated, after, restored, again = asyncio.run(trainer())
    assert paused["paused"] and updated["success"] and updated["weight_version"] == 1
    assert before[1] == 0 and after[1] == 1 and again[1] == restored["weight_version"] == 2
    assert after[0] != before[0]  # the engines decode with the new weights
    assert again[0] == before[0]  # and with the old ones once they are back


def test_an_openai_agent_runs_conversations_through_split_legs_and_they_are_saved(server, tok):
    """Last in the module: it stops the server and reads what the run folder kept."""
    from prorsa.serve.samples import served_samples

    run_dir = server.run_dir

    async def agents():
        client = server.client()
        return await asyncio.gather(*(agent(client, f"agent-{i}", i + 2, 3 * i + 1) for i in range(CONVERSATIONS)))

    async def greedy():  # the same request three times, greedy: the same reply, however it is batched
        client = server.client()
        ask = [{"role": "user", "content": "Count: one, two,"}]
        replies = await asyncio.gather(*(client.chat.completions.create(
            model="tiny", messages=ask, max_tokens=16, temperature=0, extra_headers={"X-Session-Id": f"greedy-{k}"})
            for k in range(3)))
        return [r.choices[0].message.content for r in replies]

    conversations = asyncio.run(agents())
    greedy_replies = asyncio.run(greedy())
    out = server.stop()
    assert server.proc.returncode == 2, out  # stopped by a signal: exit 2, with every conversation saved
    assert f"wrote {run_dir}" in out and "Traceback" not in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["policy"] == "prorsa" and summary["role_switches"] == 0  # the groups held each role

    assert len(set(greedy_replies)) == 1 and greedy_replies[0], greedy_replies
    rows = {r["task_id"]: r for r in pq.read_table(run_dir / "trajectories.parquet").to_pylist()
            if r["task_id"].startswith("agent-")}
    samples = {s.group: s for s in served_samples(run_dir, tok) if s.group.startswith("agent-")}
    assert sorted(rows) == sorted(samples) == [f"agent-{i}" for i in range(CONVERSATIONS)]
    for i, (messages, finishes) in enumerate(conversations):
        row, sample = rows[f"agent-{i}"], samples[f"agent-{i}"]
        turns = row["turns"]
        assert row["status"] == "completed" and len(turns) == TURNS
        # the legs ran split: every prefill on the prefill engine, every decode on the decode engine
        assert {t["prefill_engine"] for t in turns} == {"engine-0"}
        assert {t["decode_engine"] for t in turns} == {"engine-1"}
        # the gap between a reply and the next request is the conversation's tool time
        assert all(t["tool_s"] >= TOOL_S for t in turns[:-1])
        # the first prompt re-tokenizes to its ids; the whole trajectory decodes to the conversation
        first = tok.apply_chat_template(messages[:1], tools=TOOLS, tokenize=False, add_generation_prompt=True)
        assert row["prompt_ids"] == tok.encode(first, add_special_tokens=False)
        last = messages[-1]["content"] or ""
        text = tok.apply_chat_template(messages[:-1], tools=TOOLS, tokenize=False, add_generation_prompt=True) \
            + last + (tok.eos_token if finishes[-1] == "stop" else "")
        assert tok.decode(sample.token_ids, skip_special_tokens=False) == text
        # the model's tokens are masked 1 with their logprobs, the prompt and tool results 0
        generated = [i for t in turns for i in t["token_ids"]]
        assert [i for i, m in zip(sample.token_ids, sample.loss_mask) if m] == generated
        assert all(math.isfinite(x) and x <= 0 for x, m in zip(sample.rollout_logprobs, sample.loss_mask) if m)
        assert sample.loss_mask[0] == 0 and 0 < sum(sample.loss_mask) < len(sample.loss_mask)
    # an n=4 request's four replies (test above): four trajectories of one prompt, when it ran
    branches = [r for r in pq.read_table(run_dir / "trajectories.parquet").to_pylist() if r["task_id"] == "n4"]
    if branches:
        assert sorted(r["traj_id"] for r in branches) == sorted(f"{branches[0]['traj_id'].split('-')[0]}{s}"
                                                                for s in ("", "-1", "-2", "-3"))
        assert len({tuple(r["prompt_ids"]) for r in branches}) == 1
