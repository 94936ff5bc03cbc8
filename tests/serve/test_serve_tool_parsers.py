"""Tool calls read by vLLM's own parsers (engines.vllm.tool_call_parser), from scripted replies in
each model family's format. The tiny model's tokenizer has none of the special tokens llama3_json
(<|python_tag|>) and mistral ([TOOL_CALLS]) look for: with it they are refused as vLLM refuses them,
and they are tested on a copy of it that has them."""

import json

import pytest
from click.testing import CliRunner
from transformers import AutoTokenizer

from prorsa.cli import main
from prorsa.config.load import ConfigError, load_pipeline
from prorsa.serve.tool_calls import ReplyParser
from tests.serve.test_serve_cli import PIPELINE
from tests.serve.test_serve_endpoint import Scripted, serve, tok  # noqa: F401 (tok: a fixture)
from tests.serve.test_serve_openai import ASK, client, streamed_chat

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
ADDED = json.dumps({"a": 2, "b": 3})
QWEN3_CODER = ("Let me add.\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n"
               "</parameter>\n</function>\n</tool_call>")


@pytest.fixture(scope="module")
def special_tok(tok):
    """The tiny tokenizer with the special tokens Llama 3's and Mistral's tool formats begin with."""
    t = AutoTokenizer.from_pretrained(tok.name_or_path)
    t.add_special_tokens({"additional_special_tokens": ["<|python_tag|>", "[TOOL_CALLS]"]})
    return t


@pytest.mark.parametrize("name, reply, content", [
    ("llama3_json", '{"name": "add", "parameters": {"a": 2, "b": 3}}', None),
    ("llama3_json", '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}', None),
    ("mistral", 'Sure.[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}]', "Sure."),
    ("qwen3_coder", QWEN3_CODER, "Let me add."),
    ("pythonic", "[add(a=2, b=3)]", None),
    ("hermes", 'Let me add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "Let me add."),
])
def test_each_family_s_reply_becomes_its_tool_calls(special_tok, name, reply, content):
    got_content, calls = ReplyParser(name, special_tok).split(reply, TOOLS)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 2, "b": 3})]


@pytest.mark.parametrize("name", ["llama3_json", "mistral", "qwen3_coder", "hermes"])
def test_a_reply_without_a_call_stays_text(special_tok, name):
    assert ReplyParser(name, special_tok).split("It is 5.", TOOLS) == ("It is 5.", ())


def test_a_malformed_call_stays_text_without_a_traceback(tok, capfd):
    # a random or early model writes <tool_call> with no JSON after it: vLLM's parser logs why,
    # traceback and all, on the server's console; it says so in a debug line instead
    reply = "hello <tool_call>{not json</tool_call>"
    assert ReplyParser("hermes", tok).split(reply, TOOLS) == (reply, ())
    assert "Traceback" not in "".join(capfd.readouterr())


@pytest.mark.parametrize("name, token", [("llama3_json", "<|python_tag|>"), ("mistral", "tool call token")])
def test_a_parser_whose_tokens_the_tokenizer_lacks_is_refused_at_once(tok, name, token):
    with pytest.raises(ValueError, match=f"{name}.*{token}".replace("|", r"\|")):
        ReplyParser(name, tok)


def test_qwen3_coder_calls_come_back_streamed_and_not_and_the_echo_continues_the_trajectory(tok):
    async def requests(http):
        oa = client(http)
        plain = await oa.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                                 extra_headers={"X-Session-Id": "plain"})
        m = plain.choices[0].message
        echoed = {"role": "assistant", "content": m.content, "tool_calls": [c.model_dump() for c in m.tool_calls]}
        after = ASK + [echoed, {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "5"}]
        await oa.chat.completions.create(model="tiny", messages=after, tools=TOOLS, extra_headers={"X-Session-Id": "plain"})
        streamed = await streamed_chat(oa, "streamed", ASK)  # its tools' schema gives no parameter types
        return plain, streamed

    runner = Scripted(tok, reply=lambda req: QWEN3_CODER if req.turn == 0 else "It is 5.")
    (plain, (message, finish, _, _)), done, _ = serve(tok, requests, runner, parser=ReplyParser("qwen3_coder", tok))
    call = plain.choices[0].message.tool_calls[0]
    assert plain.choices[0].finish_reason == "tool_calls" and plain.choices[0].message.content == "Let me add."
    assert (call.function.name, call.function.arguments) == ("add", ADDED)
    assert finish == "tool_calls" and message["content"] == "Let me add."
    # qwen3_coder writes values as text and types them by the request's schema: here none, so strings
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("add", {"a": "2", "b": "3"})]
    [conversation] = [t for t in done if t.task_id == "plain"]
    assert len(conversation.turns) == 2  # the echoed calls were read as the reply: one trajectory


def test_an_unknown_parser_is_one_config_line_naming_the_field_and_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"engines\.vllm\.tool_call_parser.*'nope'.*hermes.*qwen3_coder"):
        load_pipeline(PIPELINE, {"engines.vllm.tool_call_parser": "nope"})
    r = CliRunner().invoke(main, ["serve", PIPELINE, "--engine", "emulated", "engines.vllm.tool_call_parser=nope",
                                  "--output", str(tmp_path / "run")])
    assert r.exit_code == 2 and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert "engines.vllm.tool_call_parser" in r.output and "llama3_json" in r.output


def test_a_parser_the_model_cannot_use_stops_serve_before_anything_starts(tmp_path):
    r = CliRunner().invoke(main, ["serve", PIPELINE, "--engine", "emulated", "engines.vllm.tool_call_parser=mistral",
                                  "--output", str(tmp_path / "run")])
    assert r.exit_code == 2 and "engines.vllm.tool_call_parser" in r.output and "tool call token" in r.output, r.output
    assert not (tmp_path / "run").exists()
