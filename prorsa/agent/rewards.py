"""Rewards: how well a trajectory's final response solved its task.

    extract_answer(response) -> str           the last \\boxed{...}, else the text after the last
                                              "answer:", else the last non-empty line
    normalize_answer(text) -> str             case, spaces, articles, punctuation, $, thousands
                                              separators and number forms (3.0 == 3) made equal
    exact_match(prediction, answer) -> float  1.0 or 0.0 after both are normalised
    contains_answer(text, answer) -> float    1.0 when the normalised answer occurs in the
                                              normalised text as whole words
    extract_code(response) -> str             the last ```python block (else the whole response)
    await run_tests(source, tests, limits) -> TestReport    the tests run in the python sandbox
    await code_test_pass_rate(source, tests) -> float       passed / total (0.0 if none ran)

    tool_use_reward(task, response) -> float  1.0 for the right \\boxed{} answer, else for a
                                              well-formed call to the task's reference tool from
                                              TOOL_FORMAT_CREDIT up to TOOL_CALL_CREDIT as its
                                              numbers match the reference call's, else 0.0

    REWARDS, @register("name"), make_reward("exact_match" | "contains_answer" | "code_tests"
                                            (alias "pass_rate") | "tool_use" | "pkg.mod:fn")
    await score(reward, task, response) -> Score(value, error)   never raises

A reward function takes (task, response) and returns a float, sync or async; a user's is named
by dotted path. The tests run in the same sandbox process as the solution, so a pass rate measures
a solution that is not written to fool its harness: it is not a defence against one that is.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import string
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Union

from prorsa.agent.datasets.base import Task
from prorsa.agent.datasets.swe_lite import runner
from prorsa.agent.tools.parser import ToolCallParser
from prorsa.agent.tools.registry import load_object
from prorsa.agent.tools.sandbox import SandboxLimits, run_sandboxed

Reward = Callable[[Task, str], Union[float, Awaitable[float]]]
REWARDS: dict[str, Reward] = {}
TEST_LIMITS = SandboxLimits(wall_s=10.0, cpu_s=10)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")
_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)
_RESULT = re.compile(r"^(PASS|FAIL) (\d+)", re.M)
_DIGITS = re.compile(r"\d+")
# Partial credit for calling the tool right but answering wrong: enough for a policy that writes
# the call format only sometimes to learn it, small enough that the answer stays what pays.
TOOL_CALL_CREDIT = 0.3  # a call to the reference tool with exactly the reference call's numbers
TOOL_FORMAT_CREDIT = 0.1  # a call to the reference tool with none of them


@dataclass(frozen=True)
class Score:
    value: float  # the reward; NaN when the reward function failed
    error: str = ""  # why it failed, for the trajectory record


@dataclass(frozen=True)
class TestReport:
    passed: int  # tests that ran without an exception
    total: int
    output: str  # what the run printed (the sandbox's output)
    kind: str  # how the sandbox run ended (SandboxRun.kind)

    @property
    def pass_rate(self) -> float:
        return self.passed / self.total if self.total else 0.0


def register(name: str) -> Callable[[Reward], Reward]:
    def add(fn: Reward) -> Reward:
        REWARDS[name] = fn
        return fn

    return add


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unclosed: the response was cut off


def extract_answer(response: str) -> str:
    boxed = _last_boxed(response)
    if boxed is not None:
        return boxed
    lower = response.lower()
    at = lower.rfind("answer:")
    if at >= 0:
        rest = response[at + len("answer:"):].strip()
        return rest.splitlines()[0] if rest else ""
    lines = [line for line in response.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def normalize_answer(text: str) -> str:
    text = text.strip().strip("$").replace("\\text{", "").replace("}", "").replace("{", "")
    number = text.replace(",", "").replace(" ", "")
    if _NUMBER.match(number):
        value = float(number)
        if math.isfinite(value) and value == int(value) and abs(value) < 2**53:
            return str(int(value))
        return repr(value)
    text = text.lower()
    text = "".join(c for c in text if c not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, answer: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(answer))


def contains_answer(text: str, answer: str) -> float:
    needle = normalize_answer(answer)
    return float(bool(needle) and f" {needle} " in f" {normalize_answer(text)} ")


def extract_code(response: str) -> str:
    blocks = _CODE_BLOCK.findall(response)
    return blocks[-1] if blocks else response


async def run_tests(source: str, tests: Sequence[str], limits: SandboxLimits = TEST_LIMITS) -> TestReport:
    run = await run_sandboxed(runner(source, tuple(tests)), limits=limits)
    # Count each test once, by index: a solution that prints "PASS 0" itself cannot count twice.
    passed = {int(i) for verdict, i in _RESULT.findall(run.output) if verdict == "PASS"}
    failed = {int(i) for verdict, i in _RESULT.findall(run.output) if verdict == "FAIL"}
    return TestReport(len((passed - failed) & set(range(len(tests)))), len(tests), run.output, run.kind)


async def code_test_pass_rate(source: str, tests: Sequence[str], limits: SandboxLimits = TEST_LIMITS) -> float:
    return (await run_tests(source, tests, limits)).pass_rate


@register("exact_match")
def exact_match_reward(task: Task, response: str) -> float:
    return exact_match(extract_answer(response), task.answer)


@register("contains_answer")
def contains_answer_reward(task: Task, response: str) -> float:
    """Retrieval recall: whether the answer appears anywhere in the response (e.g. the documents
    a search returned), not whether the model stated it."""
    return contains_answer(response, task.answer)


@register("tool_use")
def tool_use_reward(task: Task, response: str) -> float:
    """Graded so a policy that writes the call format only sometimes can climb: TOOL_FORMAT_CREDIT
    for a parsed call to the reference tool, up to TOOL_CALL_CREDIT as its numbers match the
    reference call's. Numbers count as a multiset over the longer of the two lists, so stuffing
    a call with numbers lowers its credit."""
    boxed = _last_boxed(response)
    if boxed is not None and exact_match(boxed, task.answer):
        return 1.0
    if not task.calls:
        return 0.0
    ref = task.calls[0]
    want = Counter(_DIGITS.findall(json.dumps(dict(ref.arguments))))
    best = 0.0
    for call in ToolCallParser(formats=("hermes",)).parse(response).calls:
        if call.name != ref.name:
            continue
        got = Counter(_DIGITS.findall(json.dumps(dict(call.arguments))))
        matched = sum((want & got).values()) / max(sum(want.values()), sum(got.values()), 1)
        best = max(best, TOOL_FORMAT_CREDIT + (TOOL_CALL_CREDIT - TOOL_FORMAT_CREDIT) * matched)
    return best


@register("pass_rate")
@register("code_tests")
async def code_tests_reward(task: Task, response: str) -> float:
    return await code_test_pass_rate(extract_code(response), task.tests)


def make_reward(spec: str) -> Reward:
    if spec in REWARDS:
        return REWARDS[spec]
    if ":" in spec:
        fn = load_object(spec)
        if not callable(fn):
            raise ValueError(f"reward {spec!r} is not callable")
        return fn
    raise ValueError(f"unknown reward {spec!r}: expected one of {sorted(REWARDS)} or 'package.module:function'")


async def score(reward: Reward, task: Task, response: str) -> Score:
    try:
        value = reward(task, response)
        if inspect.isawaitable(value):
            value = await value
        return Score(float(value))
    except Exception as e:  # noqa: BLE001 - a broken reward is recorded, the rollout goes on
        return Score(float("nan"), f"{type(e).__name__}: {e}")
