"""`arith`: one- and two-digit arithmetic to be done with the calculator, a task small enough for
the tiny model to learn on a CPU.

    make_arith(n, seed) -> [Task]    "What is 17 + 25? Use the calculator." -> answer "42"; the
                                     reference call is calculator({"expression": "17 + 25"})
    make_arith_digits(n, seed)       `arith-digits`: the same with operands 1-9
    demonstration(task) -> (call_text, answer_text)   what a solver writes in its two turns

The reward meant for it is `tool_use` (agent/rewards.py): full marks for the right \\boxed{}
answer, partial credit for a well-formed call to the calculator with the prompt's numbers, so a
policy that only sometimes writes the call format gets a signal to climb.
"""

from __future__ import annotations

import json
import random

from prorsa.agent.datasets.base import Task, register
from prorsa.agent.tools.base import ToolCall

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
INSTRUCTION = "Use the calculator."


@register("arith")
def make_arith(n: int, seed: int = 0, digits: bool = False) -> list[Task]:
    name = "arith-digits" if digits else "arith"
    tasks = []
    for i in range(n):
        r = random.Random(f"{name}:{seed}:{i}")
        op = r.choice(sorted(OPS))
        if digits:
            a, b = r.randrange(1, 10), r.randrange(1, 10)
        else:
            a, b = r.randrange(1, 100), r.randrange(1, 100)
            if op == "*":  # keeps answers to at most three digits, so prompts and answers stay short
                b = r.randrange(2, 10)
        expression = f"{a} {op} {b}"
        tasks.append(Task(f"{name}-{seed}-{i}", name, f"What is {expression}? {INSTRUCTION}",
                          str(OPS[op](a, b)), (ToolCall("calculator", {"expression": expression}),),
                          meta={"a": a, "b": b, "op": op}))
    return tasks


@register("arith-digits")
def make_arith_digits(n: int, seed: int = 0) -> list[Task]:
    """Single-digit operands: 243 distinct problems, few enough for the tiny model to learn the
    prompt-to-call mapping it cannot yet copy in general."""
    return make_arith(n, seed, digits=True)


def demonstration(task: Task) -> tuple[str, str]:
    """The two assistant turns of a correct solution, in the Hermes form the chat template writes
    (the call) and the form the live episode stops on (the boxed answer); no end-of-turn token."""
    call = task.calls[0]
    body = json.dumps({"name": call.name, "arguments": dict(call.arguments)})
    return f"<tool_call>\n{body}\n</tool_call>", f"The answer is \\boxed{{{task.answer}}}."
