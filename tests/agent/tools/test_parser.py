"""Tool-call parsing: well-formed, malformed and partial calls in both conventions; never raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prorsa.agent.tools import ToolCall, ToolCallParser

P = ToolCallParser()


def tag(obj) -> str:
    return f"<tool_call>\n{obj if isinstance(obj, str) else json.dumps(obj)}\n</tool_call>"


def test_hermes_single_call_and_content():
    text = "Let me compute.\n" + tag({"name": "python", "arguments": {"code": "print(1)"}}) + "\nWaiting."
    out = P.parse(text)
    assert out.calls == (ToolCall("python", {"code": "print(1)"}),)
    assert out.errors == () and out.content == "Let me compute.\n\nWaiting."


def test_hermes_several_calls_fenced_body_list_body_and_string_arguments():
    text = (tag({"name": "search", "arguments": {"query": "a"}})
            + tag('```json\n{"name": "search", "arguments": {"query": "b"}}\n```')
            + tag([{"name": "calculator", "arguments": {"expression": "1+1"}}, {"name": "noargs"}])
            + tag({"name": "python", "arguments": json.dumps({"code": "x = '<tool_call>'"}), "id": "c7"}))
    out = P.parse(text)
    assert out.errors == ()
    assert [c.name for c in out.calls] == ["search", "search", "calculator", "noargs", "python"]
    assert out.calls[1].arguments == {"query": "b"} and out.calls[3].arguments == {}
    assert out.calls[4] == ToolCall("python", {"code": "x = '<tool_call>'"}, "c7")
    assert out.content == ""


@pytest.mark.parametrize("body, message", [
    ('{"name": "python", "arguments": {"code": "1"}', "not valid JSON"),
    ("{'name': 'python'}", "not valid JSON"),
    ('{"arguments": {"code": "1"}}', 'non-empty string "name"'),
    ('{"name": "", "arguments": {}}', 'non-empty string "name"'),
    ('{"name": "python", "arguments": [1, 2]}', "must be an object"),
    ('{"name": "python", "arguments": "{not json"}', "string that is not JSON"),
    ('"just a string"', "must be a JSON object"),
])
def test_hermes_malformed_bodies_are_errors(body, message):
    out = P.parse("before " + tag(body) + " after")
    assert out.calls == ()
    assert len(out.errors) == 1 and message in out.errors[0].message
    assert out.errors[0].snippet.startswith(body[:20])
    assert out.content == "before  after"


def test_hermes_good_call_survives_a_bad_neighbour():
    out = P.parse(tag('{"name": broken}') + tag({"name": "ok", "arguments": {}}))
    assert out.calls == (ToolCall("ok", {}),) and len(out.errors) == 1


@pytest.mark.parametrize("text", [
    'I will run it. <tool_call>\n{"name": "python", "arguments": {"code": "for i in',  # cut mid-call
    "<tool_call>",
    '<tool_call>{"name": "python", "arguments": {}}',  # complete JSON, closing tag missing
])
def test_partial_hermes_call_is_an_error(text):
    out = P.parse(text)
    assert out.calls == ()
    assert len(out.errors) == 1 and "partial call" in out.errors[0].message


def test_bare_json_calls():
    out = P.parse('Calling now: {"name": "calculator", "arguments": {"expression": "2*3"}} ok')
    assert out.calls == (ToolCall("calculator", {"expression": "2*3"}),) and out.content == "Calling now:  ok"
    openai = P.parse('[{"id": "call_1", "type": "function", "function": '
                     '{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}}]')
    assert openai.calls == (ToolCall("search", {"query": "x"}, "call_1"),)
    params = P.parse('{"name": "f", "parameters": {"a": 1}}')
    assert params.calls == (ToolCall("f", {"a": 1}),)


def test_bare_json_that_is_not_a_call_is_left_alone():
    text = 'The config is {"name": "Ada", "age": 36} and the list [1, 2] and {broken'
    out = P.parse(text)
    assert out.calls == () and out.errors == () and out.content == text


def test_partial_bare_json_call_is_an_error():
    out = P.parse('Sure. {"name": "python", "arguments": {"code": "print(')
    assert out.calls == () and len(out.errors) == 1
    assert "does not decode" in out.errors[0].message and out.content == "Sure."


def test_formats_are_configurable_and_tags_win_over_bare_json():
    text = tag({"name": "a", "arguments": {}}) + ' {"name": "b", "arguments": {}}'
    assert [c.name for c in P.parse(text).calls] == ["a"]  # hermes found something: json not tried
    hermes_only = ToolCallParser(formats=("hermes",))
    assert hermes_only.parse('{"name": "b", "arguments": {}}').calls == ()
    json_only = ToolCallParser(formats=("json",))
    assert [c.name for c in json_only.parse(text).calls] == ["a", "b"]
    custom = ToolCallParser(open_tag="<call>", close_tag="</call>", formats=("hermes",))
    assert custom.parse('<call>{"name": "c", "arguments": {}}</call>').calls == (ToolCall("c", {}),)
    with pytest.raises(ValueError, match="formats"):
        ToolCallParser(formats=("xml",))


def test_max_calls():
    text = "".join(tag({"name": f"t{i}", "arguments": {}}) for i in range(5))
    out = ToolCallParser(max_calls=3).parse(text)
    assert [c.name for c in out.calls] == ["t0", "t1", "t2"]
    assert len(out.errors) == 1 and "only the first 3" in out.errors[0].message


def test_no_calls():
    out = P.parse("  The answer is \\boxed{4}.  ")
    assert out.calls == () and out.errors == () and out.content == "The answer is \\boxed{4}."


PIECES = st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"name"', ":", ",",
                          '"arguments"', '"python"', "```json", "```", " ", "\n", "1", "null", '"'])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(PIECES, max_size=40).map("".join)))
def test_parse_never_raises(text):
    out = P.parse(text)
    for c in out.calls:
        assert isinstance(c.name, str) and c.name and isinstance(c.arguments, dict)
