"""Calculator, search, user tools by dotted path, command tools, call_tool's guarantees, Toolbox."""

from __future__ import annotations

import asyncio
import math
import textwrap

import pytest

from prorsa.agent.datasets.search import make_corpus
from prorsa.agent.tools import (CommandSpec, SandboxLimits, ToolCall, ToolLoadError,
                                ToolStatus, Toolbox, Truncation, call_tool, make_tool)
from prorsa.agent.tools.calculator import CalcError, evaluate
from prorsa.agent.tools.search import Document, SearchTool


def call(tool, args, timeout_s=None) -> ToolResult:
    return asyncio.run(call_tool(tool, args, timeout_s=timeout_s))


# --- calculator ---------------------------------------------------------------------------------

@pytest.mark.parametrize("expr, value", [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 / 2", 3.5), ("7 // 2", 3), ("-7 % 3", 2),
    ("2 ** 10", 1024), ("2^10", 1024), ("sqrt(16) + abs(-2)", 6.0), ("factorial(5)", 120),
    ("gcd(12, 18)", 6), ("round(pi, 3)", 3.142), ("max(1, 5, 3)", 5), ("comb(10, 3)", 120),
])
def test_calculator_evaluates(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize("expr, message", [
    ("__import__('os').system('true')", "not allowed"), ("x + 1", "not allowed"),
    ("(1).__class__", "not allowed"), ("'a' * 3", "not allowed"), ("[1, 2]", "not allowed"),
    ("1 / 0", "ZeroDivisionError"), ("sqrt(-1)", "ValueError"), ("9 ** 9 ** 9", "too large"),
    ("factorial(10**6)", "factorial takes"), ("1 +", "syntax error"), ("1" * 2000, "longer than"),
    ("10.0 ** 400", "OverflowError"), ("True + 1", "not allowed"),
])
def test_calculator_refuses(expr, message):
    with pytest.raises(CalcError, match=message):
        evaluate(expr)


def test_calculator_tool_statuses():
    calc = make_tool("calculator")
    ok = call(calc, {"expression": "6 * 7"})
    assert (ok.observation, ok.status) == ("42", ToolStatus.OK)
    bad = call(calc, {"expression": "open('x')"})
    assert bad.status is ToolStatus.ERROR and bad.observation.startswith("Error:")
    missing = call(calc, {"expr": "1"})
    assert missing.status is ToolStatus.ERROR and "missing argument 'expression'" in missing.observation


# --- search -------------------------------------------------------------------------------------

def test_search_ranks_the_matching_document_first():
    docs = [Document("a", "Cats", "Cats purr and chase mice."),
            Document("b", "Paris", "Paris is the capital of France."),
            Document("c", "Rivers", "The Seine flows through Paris.")]
    tool = SearchTool(docs, k=2)
    hits = tool.search("capital of France")
    assert [d.doc_id for d, _ in hits] == ["b"]  # zero-score documents are not returned
    res = call(tool, {"query": "Paris", "k": 5})
    assert res.status is ToolStatus.OK
    assert res.observation.count("\n") == 1 and "(b)" in res.observation and "(c)" in res.observation
    assert call(tool, {"query": "zebra"}).observation == "No documents matched."


def test_search_default_corpus_and_truncation():
    tool = make_tool("search", k=3, truncation=Truncation(120))
    first = make_corpus(0)[30]
    res = call(tool, {"query": first.title})
    assert res.status is ToolStatus.TRUNCATED and first.title in res.observation
    bad = call(tool, {"query": 3})
    assert bad.status is ToolStatus.ERROR and "must be string" in bad.observation


# --- user tools by dotted path ------------------------------------------------------------------

USER_MODULE = textwrap.dedent('''
    import asyncio
    from prorsa.agent.tools import CommandSpec, SandboxLimits

    def word_count(text: str, unique: bool = False) -> int:
        """Count the words of a text."""
        words = text.split()
        return len(set(words)) if unique else len(words)

    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "woke"

    def broken(x: int) -> str:
        raise KeyError("no such thing")

    reverse = CommandSpec("reverse", ("python", "-c", "import sys; print(sys.argv[1][::-1])", "{text}"),
                          description="Reverse a text.", limits=SandboxLimits(wall_s=5))
    not_a_tool = 42

    class Echo:
        name, description = "echo", "Say it back."
        parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

        def __init__(self, prefix=""):
            self.prefix = prefix

        async def call(self, arguments, *, timeout_s=None):
            from prorsa.agent.tools import ToolResult, ToolStatus
            return ToolResult(self.prefix + arguments["text"], ToolStatus.OK, 0.0)

    echo = Echo("> ")
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_tools.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_tools"


def test_user_function_tool(user_module):
    tool = make_tool(f"{user_module}:word_count")
    assert tool.name == "word_count" and tool.description == "Count the words of a text."
    assert tool.parameters["required"] == ["text"]
    assert tool.parameters["properties"]["unique"] == {"type": "boolean"}
    assert call(tool, {"text": "a b a"}).observation == "3"
    assert call(tool, {"text": "a b a", "unique": True}).observation == "2"
    assert call(tool, {"text": 5}).status is ToolStatus.ERROR
    err = call(make_tool(f"{user_module}:broken"), {"x": 1})
    assert err.status is ToolStatus.ERROR and "KeyError" in err.observation
    # an hour's sleep: a call that waited for it would never come back (pytest's timeout fails it)
    slow = call(make_tool(f"{user_module}:slow"), {"seconds": 3600}, timeout_s=0.2)
    assert slow.status is ToolStatus.TIMEOUT and "timed out after 0.2 s" in slow.observation


def test_user_tool_objects_and_classes(user_module):
    instance = make_tool(f"{user_module}:echo")
    assert call(instance, {"text": "hi"}).observation == "> hi"
    built = make_tool(f"{user_module}:Echo", prefix="# ")  # a tool class gets the options
    assert built.name == "echo" and call(built, {"text": "hi"}).observation == "# hi"


def test_user_command_tool_takes_arguments_as_single_words(user_module):
    tool = make_tool(f"{user_module}:reverse")
    assert tool.name == "reverse" and tool.parameters["required"] == ["text"]
    res = call(tool, {"text": "abc; rm -rf ~"})
    assert res.status is ToolStatus.OK and res.observation == "~ fr- mr ;cba"


def test_command_tool_errors():
    from prorsa.agent.tools.command import CommandTool

    no_such = CommandTool(CommandSpec("x", ("no-such-program-here",), limits=SandboxLimits(wall_s=5)))
    res = call(no_such, {})
    assert res.status is ToolStatus.ERROR and "cannot run 'no-such-program-here'" in res.observation
    failing = CommandTool(CommandSpec("f", ("python", "-c", "import sys; sys.exit(3)")))
    assert call(failing, {}).observation == "[exit code 3]"


@pytest.mark.parametrize("spec, message", [
    ("no_colon_here", "unknown tool"), ("nope.nothing:x", "cannot import"),
    ("prorsa.agent.tools.calculator:missing", "has no attribute"),
])
def test_load_errors_name_the_problem(spec, message):
    with pytest.raises(ToolLoadError, match=message):
        make_tool(spec)


def test_load_refuses_non_callables(user_module):
    with pytest.raises(ToolLoadError, match="is not a tool"):
        make_tool(f"{user_module}:not_a_tool")


# --- call_tool and Toolbox ----------------------------------------------------------------------

class Exploding:
    name, description = "exploding", "raises from call"
    parameters = {"type": "object", "properties": {}, "additionalProperties": False}

    async def call(self, arguments, *, timeout_s=None):
        raise RuntimeError("tool bug")


class Hanging:
    name, description, parameters = "hanging", "ignores its timeout", {"type": "object"}

    async def call(self, arguments, *, timeout_s=None):
        await asyncio.sleep(60)


def test_call_tool_never_raises():
    crash = call(Exploding(), {})
    assert crash.status is ToolStatus.CRASH and "RuntimeError: tool bug" in crash.observation
    extra = call(Exploding(), {"surprise": 1})
    assert extra.status is ToolStatus.ERROR and "unknown argument 'surprise'" in extra.observation
    assert call(Exploding(), ["not", "an", "object"]).status is ToolStatus.ERROR
    hung = call(Hanging(), {}, timeout_s=0.1)  # it would return None after its 60 s sleep
    assert hung.status is ToolStatus.TIMEOUT and hung.detail == "wall timeout (caller)"


def test_toolbox_runs_by_name_and_lists_schemas():
    box = Toolbox([make_tool("calculator"), Exploding()], timeout_s=5)
    assert asyncio.run(box.run(ToolCall("calculator", {"expression": "2+2"}))).observation == "4"
    unknown = asyncio.run(box.run(ToolCall("python", {"code": "1"})))
    assert unknown.status is ToolStatus.ERROR and "['calculator', 'exploding']" in unknown.observation
    schemas = box.schemas()
    assert [s["function"]["name"] for s in schemas] == ["calculator", "exploding"]
    assert schemas[0]["function"]["parameters"]["required"] == ["expression"]
    with pytest.raises(ValueError, match="two tools"):
        Toolbox([make_tool("calculator"), make_tool("calculator")])


# --- truncation ---------------------------------------------------------------------------------

class CharTokenizer:
    """Two characters per token: enough to tell a token budget from a character budget."""

    def encode(self, text):
        return [text[i:i + 2] for i in range(0, len(text), 2)]

    def decode(self, ids):
        return "".join(ids)


def test_truncation_by_characters_and_tokens():
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    assert Truncation(2000).apply(text) == (text, False)
    cut, was_cut = Truncation(100).apply(text)
    assert was_cut and cut.startswith(text[:70]) and cut.endswith(text[-30:]) and "900 chars cut" in cut
    by_tokens, was_cut = Truncation(100, "tokens", CharTokenizer()).apply(text)
    assert was_cut and by_tokens.startswith(text[:140]) and by_tokens.endswith(text[-60:])
    assert "400 tokens cut" in by_tokens
    with pytest.raises(ValueError):
        Truncation(10, "tokens")
    assert math.isclose(len(Truncation(10).apply("x" * 50)[0].replace("\n[... 40 chars cut ...]\n", "")), 10)
