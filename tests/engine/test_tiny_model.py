"""The locally made tiny model: deterministic from its seed, loadable by transformers."""

from __future__ import annotations

import hashlib
import json

import pytest

from prorsa.engine.tiny_model import ensure_tiny_model, make_tiny_model, weights_digest

pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("tokenizers", reason="tokenizers is not installed")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        "a": make_tiny_model(root / "a", seed=0),
        "b": make_tiny_model(root / "b", seed=0),
        "c": make_tiny_model(root / "c", seed=1),
    }


def test_same_seed_same_weights_other_seed_other_weights(models):
    assert weights_digest(models["a"]) == weights_digest(models["b"])
    assert weights_digest(models["a"]) != weights_digest(models["c"])


def test_tokenizer_is_shared_by_every_seed(models):
    digests = {hashlib.sha256((m / "tokenizer.json").read_bytes()).hexdigest() for m in models.values()}
    assert len(digests) == 1


def test_shape_fits_the_cpu_attention_backend(models):
    config = json.loads((models["a"] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (128, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 32)
    assert config["vocab_size"] == 2048


def test_loads_with_transformers_and_generates(models):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models["a"])
    model = AutoModelForCausalLM.from_pretrained(models["a"])
    ids = tok("def search(query):\n    return query", return_tensors="pt").input_ids
    assert 0 < ids.shape[1] < 20  # BPE merged the text into far fewer tokens than bytes
    assert tok.decode(ids[0]) == "def search(query):\n    return query"  # byte-level: lossless
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4


def test_chat_template_renders_tool_calls(models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models["a"])
    messages = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Find the failing test."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "run_tests", "arguments": {"k": "io"}}}]},
        {"role": "tool", "content": "1 failed"},
    ]  # fmt: skip
    tools = [{"type": "function", "function": {"name": "run_tests", "parameters": {}}}]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou fix bugs.")
    assert '<tool_call>\n{"name": "run_tests", "arguments": {"k": "io"}}\n</tool_call>' in text
    assert "<tool_response>\n1 failed\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok(text).input_ids
    assert tok.convert_tokens_to_ids("<tool_call>") in ids  # special: never split by BPE
    # OpenAI clients send arguments as a JSON string: rendered as is, not quoted again
    messages[2]["tool_calls"][0]["function"]["arguments"] = '{"k": "io"}'
    assert '"arguments": {"k": "io"}}' in tok.apply_chat_template(messages, tokenize=False)


def test_ensure_makes_once_and_reuses(tmp_path):
    first = ensure_tiny_model(tmp_path, seed=3)
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    again = ensure_tiny_model(tmp_path, seed=3)
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary directory left
