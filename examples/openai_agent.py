"""A tool-using agent written against the `openai` client, rolled out by Prorsa.

    prorsa serve pipelines/serve.yaml --port 8000          # in one terminal; wait for "serving ..."
    python examples/openai_agent.py --conversations 4       # in another; then Ctrl-C the server

Nothing here is Prorsa's: any agent that speaks the OpenAI API works the same way. Each
conversation is one Prorsa trajectory (the X-Session-Id header names it); every request is a turn
whose prefill and decode run on Prorsa's role-tagged engines; the time the agent spends in its
tool between two requests is the trajectory's tool time. When the server stops, the run folder's
trajectories.parquet holds every conversation's token ids and logprobs
(`prorsa.serve.samples.served_samples(run_dir, tokenizer)` gives them with their loss masks).

The tiny random model asks for no tool; like a training harness, this agent then runs its tool on
the task's own numbers and sends the result back, so every conversation has its tool turns.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from openai import AsyncOpenAI

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


async def add(a: int, b: int) -> int:
    await asyncio.sleep(0.5)  # a tool takes time
    return a + b


async def converse(client: AsyncOpenAI, session: str, a: int, b: int, turns: int) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": f"What is {a} + {b}? Use the add tool."}]
    for turn in range(turns):
        r = await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=32,
                                                 extra_headers={"X-Session-Id": session})
        msg = r.choices[0].message
        calls = [c.model_dump() for c in msg.tool_calls or []]
        messages.append({"role": "assistant", "content": msg.content} | ({"tool_calls": calls} if calls else {}))
        if turn == turns - 1:
            break
        own = {"id": f"{session}-{turn}", "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})}}
        for call in calls or [own]:
            try:
                result = str(await add(**json.loads(call["function"]["arguments"])))
            except (TypeError, ValueError) as e:  # a malformed call is the model's mistake: tell it
                result = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return messages


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--turns", type=int, default=3)
    args = p.parse_args()
    client = AsyncOpenAI(base_url=args.base_url, api_key="unused")
    chats = await asyncio.gather(*(converse(client, f"agent-{i}", i, i + 1, args.turns)
                                   for i in range(args.conversations)))
    for i, messages in enumerate(chats):
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        print(f"agent-{i}: {len(replies)} replies, the last: {(replies[-1] or '')[:60]!r}")


if __name__ == "__main__":
    asyncio.run(main())
