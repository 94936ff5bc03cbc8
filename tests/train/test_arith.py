import pytest

from prorsa.agent.datasets import make_dataset
from prorsa.agent.datasets.arith import demonstration
from prorsa.agent.datasets.base import Task
from prorsa.agent.tools.base import ToolCall
from prorsa.agent.rewards import TOOL_CALL_CREDIT, TOOL_FORMAT_CREDIT, make_reward
from prorsa.agent.tools.calculator import evaluate


def test_tasks_are_seeded_small_and_their_reference_call_computes_the_answer():
    tasks = make_dataset("arith", 40, seed=3)
    assert tasks == make_dataset("arith", 40, seed=3) and tasks != make_dataset("arith", 40, seed=4)
    assert {t.meta["op"] for t in tasks} == {"+", "-", "*"}
    for t in tasks:
        assert t.prompt == f"What is {t.calls[0].arguments['expression']}? Use the calculator."
        assert 1 <= t.meta["a"] <= 99 and 1 <= t.meta["b"] <= 99
        assert str(evaluate(t.calls[0].arguments["expression"])) == t.answer


@pytest.mark.parametrize("text,expected", [
    ("The answer is \\boxed{42}.", 1.0),
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 + 25"}}\n</tool_call>', TOOL_CALL_CREDIT),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "25+17"}}</tool_call>', TOOL_CALL_CREDIT),
    # one of two numbers right
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "17 + 9"}}</tool_call>',
     TOOL_FORMAT_CREDIT + (TOOL_CALL_CREDIT - TOOL_FORMAT_CREDIT) / 2),
    # stuffed with numbers: 2 of 4 match
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "17 + 25 + 1 + 2"}}</tool_call>',
     TOOL_FORMAT_CREDIT + (TOOL_CALL_CREDIT - TOOL_FORMAT_CREDIT) / 2),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "zebra"}}</tool_call>', TOOL_FORMAT_CREDIT),
    ('<tool_call>{"name": "python", "arguments": {"code": "print(17 + 25)"}}</tool_call>', 0.0),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "17 + 25"}', 0.0),  # not closed
    ("17 + 25 = 42", 0.0),  # no tool call and no boxed answer
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "17 + 25"}}</tool_call>\n\\boxed{41}',
     TOOL_CALL_CREDIT),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "17 + 25"}}</tool_call>\n\\boxed{42}', 1.0),
])
def test_tool_use_reward_scores_known_texts(text, expected):
    task = Task("arith-0-0", "arith", "What is 17 + 25? Use the calculator.", "42",
                (ToolCall("calculator", {"expression": "17 + 25"}),))
    assert make_reward("tool_use")(task, text) == pytest.approx(expected)


def test_a_demonstration_earns_full_marks_and_its_call_alone_the_call_credit():
    reward = make_reward("tool_use")
    for t in make_dataset("arith", 10):
        call, answer = demonstration(t)
        assert reward(t, call) == TOOL_CALL_CREDIT and reward(t, call + "\n" + answer) == 1.0
