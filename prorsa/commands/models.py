"""`prorsa model`: models for the vLLM engines.

    make_tiny(directory, seed, vocab_size)   a tiny random Llama in a new or empty DIRECTORY
"""

from __future__ import annotations

from pathlib import Path

import click

from prorsa.commands.errors import fail
from prorsa.metrics.run_dirs import holds_anything


def make_tiny(directory: str, seed: int, vocab_size: int) -> None:
    from prorsa.engine.tiny_model import TinyShape, make_tiny_model, weights_digest

    target = Path(directory)
    if holds_anything(target):
        fail(f"{target}: directory exists and is not empty")
    make_tiny_model(target, seed=seed, shape=TinyShape(vocab_size=vocab_size))
    click.echo(f"made {target} (weights sha256 {weights_digest(target)[:16]})")
