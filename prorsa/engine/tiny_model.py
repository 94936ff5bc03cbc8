"""A tiny Llama model and tokenizer made locally, so real vLLM engines run offline and fast.

    make_tiny_model(out_dir, seed[, shape])   write a model directory (config, weights, tokenizer)
    ensure_tiny_model(cache_dir, seed)  make it once under cache_dir and reuse it afterwards
    make_tiny_moe(out_dir, seed)      the same for a tiny Qwen3-MoE (8 experts, top-2): what DP
                                      attention and expert parallelism run on
    ensure_tiny_moe(cache_dir, seed)  make it once under cache_dir and reuse it afterwards

The weights are random, deterministic from `seed`: two engines with different seeds compute
different outputs from the same context, which is how a test proves that a decode used the KV
shipped from another engine. The tokenizer does not depend on the seed (every tiny model shares
one vocabulary), and is trained on text generated here, so nothing is read from the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Qwen/Hermes-style chat and tool-call markers; special, so BPE never splits them.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

# Hermes/Qwen style: tools listed in the system turn, calls as JSON inside <tool_call> tags,
# tool results fed back as a user turn inside <tool_response> tags.
CHAT_TEMPLATE = (
    "{% set sys = messages[0].content if messages and messages[0].role == 'system' else none %}"
    "{% if tools %}<|im_start|>system\n{% if sys %}{{ sys }}\n\n{% endif %}# Tools\n<tools>\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    "Call a function with a JSON object inside <tool_call></tool_call> tags.<|im_end|>\n"
    "{% elif sys %}<|im_start|>system\n{{ sys }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'user' or (m.role == 'assistant' and not m.tool_calls) %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{% for c in m.tool_calls %}{% set f = c.function or c %}"
    '<tool_call>\n{"name": "{{ f.name }}", "arguments": '
    "{% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}"
    "}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WEIGHTS_FILE = "model.safetensors"


def _corpus(lines: int = 6000) -> list[str]:
    """Deterministic training text: made-up words, code-like and tool-call-like lines.

    Fixed seed, independent of the model seed, so every tiny model shares one vocabulary."""
    rng = random.Random(20261129)
    syllables = [a + b for a in "bcdfghklmnprstvwz" for b in "aeiou"] + ["th", "sh", "ch", "st", "nd"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(900)]
    words += "the of and to in is that for it as with was on be by at this from def return".split()
    tools = ["search", "read_file", "run_tests", "edit", "bash", "python", "calculator"]
    out = []
    for i in range(lines):
        kind = i % 4
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 16)))
        if kind == 0:
            out.append(sentence.capitalize() + ".")
        elif kind == 1:
            name, arg = rng.choice(words), rng.choice(words)
            out.append(f"def {name}_{i % 97}({arg}, n={rng.randint(0, 999)}):\n    return {arg} * {i}")
        elif kind == 2:
            args = json.dumps({"query": sentence[:40], "k": rng.randint(1, 20)})
            out.append(f'<tool_call>\n{{"name": "{rng.choice(tools)}", "arguments": {args}}}\n</tool_call>')
        else:
            out.append(f"<tool_response>\n{sentence} = {rng.random():.6f}\n</tool_response>")
    return out


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


@dataclass(frozen=True)
class TinyShape:
    """The tiny Llama's shape."""

    vocab_size: int = 2048
    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    max_positions: int = 4096
    init_std: float = 0.2


def make_tiny_model(out_dir: Path, seed: int = 0, shape: TinyShape = TinyShape()) -> Path:
    """Write a LlamaForCausalLM with random weights (deterministic from `seed`) into `out_dir`.

    head_dim = hidden_size / heads = 32 (the CPU attention backend accepts 32). `init_std` is
    larger than Llama's 0.02 so the logits are peaked: greedy outputs are then stable against
    the float noise of batching, which tests comparing outputs across engines rely on."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a progress bar for one small file, on stderr, in every first run

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(shape.vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.hidden_size * 4,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden_size // shape.heads,
        max_position_embeddings=shape.max_positions,
        initializer_range=shape.init_std,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    return _save(LlamaForCausalLM, config, tokenizer, seed, out_dir)


def _save(model_cls, config, tokenizer, seed: int, out_dir: Path) -> Path:
    import torch

    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)  # weight init draws from the global generator
        model = model_cls(config).to(torch.float32).eval()
    finally:
        torch.random.set_rng_state(generator_state)  # leave the caller's random stream alone
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def make_tiny_moe(out_dir: Path, seed: int = 0, vocab_size: int = 2048, experts: int = 8, top_k: int = 2) -> Path:
    """Write a Qwen3MoeForCausalLM with random weights into `out_dir`: the tiny Llama's shape
    (hidden 128, 2 layers, 4 heads / 2 KV heads, head_dim 32) with every layer's MLP made of
    `experts` experts of which each token takes `top_k`. Peaked logits as in make_tiny_model."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(vocab_size)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=512,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=experts,
        num_experts_per_tok=top_k,
        decoder_sparse_step=1,  # every layer's MLP is a mixture of experts
        max_position_embeddings=4096,
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    return _save(Qwen3MoeForCausalLM, config, tokenizer, seed, out_dir)


def tiny_model_dir(cache_dir: Path | str, seed: int = 0, vocab_size: int = 2048) -> Path:
    """Where ensure_tiny_model keeps the tiny model for `seed` (made or not)."""
    return Path(cache_dir) / f"tiny-llama-s{seed}-v{vocab_size}"


def ensure_tiny_model(cache_dir: Path | str, seed: int = 0, vocab_size: int = 2048) -> Path:
    """The tiny model for `seed` under `cache_dir`, made on first use."""
    return _ensure(Path(cache_dir), tiny_model_dir(cache_dir, seed, vocab_size),
                   lambda out: make_tiny_model(out, seed, TinyShape(vocab_size=vocab_size)))


def tiny_moe_dir(cache_dir: Path | str, seed: int = 0, vocab_size: int = 2048) -> Path:
    """Where ensure_tiny_moe keeps the tiny MoE for `seed` (made or not)."""
    return Path(cache_dir) / f"tiny-qwen3moe-s{seed}-v{vocab_size}"


def ensure_tiny_moe(cache_dir: Path | str, seed: int = 0, vocab_size: int = 2048) -> Path:
    """The tiny MoE for `seed` under `cache_dir`, made on first use."""
    return _ensure(Path(cache_dir), tiny_moe_dir(cache_dir, seed, vocab_size),
                   lambda out: make_tiny_moe(out, seed, vocab_size))


def _ensure(cache_dir: Path, target: Path, make: Callable[[Path], Path]) -> Path:
    """Built in a temporary sibling directory and renamed into place, so a concurrent or crashed
    maker never leaves a half-written model where another process would load it."""
    if (target / WEIGHTS_FILE).exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache_dir))
    try:
        make(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / WEIGHTS_FILE).exists():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def weights_digest(model_dir: Path) -> str:
    """sha256 of the weights file: equal digests mean identical models."""
    return hashlib.sha256((Path(model_dir) / WEIGHTS_FILE).read_bytes()).hexdigest()
