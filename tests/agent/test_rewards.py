"""Rewards: answer extraction and normalisation, code test pass rates in the sandbox, user hooks."""

from __future__ import annotations

import asyncio
import math
import textwrap

import pytest

from prorsa.agent.datasets import Task
from prorsa.agent.rewards import (code_test_pass_rate, exact_match, extract_answer, extract_code,
                                  make_reward, normalize_answer, run_tests, score)
from prorsa.agent.tools import SandboxLimits

TESTS = ("assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4")


@pytest.mark.parametrize("response, answer", [
    ("so it is \\boxed{42}.", "42"), ("\\boxed{\\frac{1}{2}} and later \\boxed{7}", "7"),
    ("Answer: Paris\nthanks", "Paris"), ("line one\n\nfinal line", "final line"), ("", ""),
    ("\\boxed{unclosed", "\\boxed{unclosed"),
])
def test_extract_answer(response, answer):
    assert extract_answer(response) == answer


@pytest.mark.parametrize("a, b, same", [
    ("42", " 42 ", True), ("3.0", "3", True), ("1,000", "1000", True), ("$12$", "12", True),
    ("The Paris.", "paris", True), ("\\text{Meran}", "Meran", True), ("0.5", ".5", True),
    ("41", "42", False), ("Paris", "Lyon", False), ("3.5", "3", False), ("-7", "7", False),
])
def test_exact_match_normalises(a, b, same):
    assert exact_match(a, b) == float(same)
    assert (normalize_answer(a) == normalize_answer(b)) is same


def test_extract_code():
    assert extract_code("x\n```python\na = 1\n```\nthen\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("def f(): pass") == "def f(): pass"


def test_pass_rates():
    good = "def add(a, b):\n    return a + b\n"
    half = "def add(a, b):\n    return a + b if a > 0 else 99\n"
    assert asyncio.run(code_test_pass_rate(good, TESTS)) == 1.0
    assert asyncio.run(code_test_pass_rate(half, TESTS)) == pytest.approx(2 / 3)
    assert asyncio.run(code_test_pass_rate("def add(a, b) return", TESTS)) == 0.0
    assert asyncio.run(code_test_pass_rate(good, ())) == 0.0


def test_pass_rate_of_a_hanging_or_lying_solution():
    hang = "def add(a, b):\n    while True:\n        pass\n"
    report = asyncio.run(run_tests(hang, TESTS, SandboxLimits(wall_s=1.0)))
    assert report.kind == "timeout" and report.pass_rate == 0.0
    # Printing verdicts itself does not count twice, nor for tests that then fail.
    liar = "print('PASS 0'); print('PASS 0'); print('PASS 2')\ndef add(a, b):\n    return 0\n"
    assert asyncio.run(run_tests(liar, TESTS)).passed == 1  # only test 1 (-1 + 1 == 0) really passes


def test_builtin_rewards_on_tasks():
    task = Task("t", "math-tir", "?", "1,024")
    assert asyncio.run(score(make_reward("exact_match"), task, "2^10 = \\boxed{1024}")).value == 1.0
    assert asyncio.run(score(make_reward("exact_match"), task, "\\boxed{1023}")).value == 0.0
    code_task = Task("c", "swe-lite", "?", "", tests=TESTS)
    response = "Fixed:\n```python\ndef add(a, b):\n    return a + b\n```"
    assert asyncio.run(score(make_reward("code_tests"), code_task, response)).value == 1.0


USER = textwrap.dedent('''
    def length_reward(task, response):
        return min(1.0, len(response) / 10)

    async def async_reward(task, response):
        return 0.25

    def broken_reward(task, response):
        raise RuntimeError("reward bug")
''')


def test_user_rewards_by_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(USER)
    monkeypatch.syspath_prepend(str(tmp_path))
    task = Task("t", "x", "?", "a")
    assert asyncio.run(score(make_reward("my_rewards:length_reward"), task, "12345")).value == 0.5
    assert asyncio.run(score(make_reward("my_rewards:async_reward"), task, "")).value == 0.25
    broken = asyncio.run(score(make_reward("my_rewards:broken_reward"), task, ""))
    assert math.isnan(broken.value) and broken.error == "RuntimeError: reward bug"
    with pytest.raises(ValueError, match="unknown reward"):
        make_reward("nope")
