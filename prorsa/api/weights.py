"""New weights for the engines, from whatever a trainer holds, as a model directory they reload.

    model_dir_for(source, base, out) -> Path   source: a model directory (used as it is), a state
                                       dict, (name, tensor) pairs, or a callable returning one of
                                       these; a state dict is written as `out`/model.safetensors
                                       beside the base model's config and tokenizer files

The engines load a directory in the checkpoint format they started from (vLLM's reload_weights,
the RL loop's push in rl/training.py), so a state dict becomes one: written under a temporary
name and renamed into place whole, as the RL loop's versions are (train/weights.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Union

from prorsa.train.weights import written_whole

WeightSource = Union[str, os.PathLike, Mapping[str, Any], Iterable[tuple[str, Any]], Callable[[], Any]]
_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth")


class WeightsError(ValueError):
    """A source that is not a model directory, a state dict or a callable returning one."""


def model_dir_for(source: WeightSource, base: Path | None, out: Path) -> Path:
    """`base`: the model directory the engines started from (None: engines without a model, the
    emulated ones, whose reload only drops their cached prefixes)."""
    if callable(source):
        source = source()
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_file() and path.suffix == ".safetensors":
            return _beside_base(base, out, lambda tmp: shutil.copyfile(path, tmp / "model.safetensors"))
        if not (path / "config.json").is_file():
            raise WeightsError(f"{path}: not a model directory (no config.json) nor a .safetensors file")
        return path
    if isinstance(source, (Mapping, Iterable)):
        tensors = dict(source)
    else:
        raise WeightsError(f"update_weights: expected a model directory, a state dict, (name, tensor) pairs "
                           f"or a callable returning one, got {type(source).__name__}")
    return _beside_base(base, out, lambda tmp: _save(tensors, tmp / "model.safetensors"))


def _save(tensors: dict[str, Any], file: Path) -> None:
    from safetensors.torch import save_file

    # safetensors wants contiguous CPU tensors, and no two names sharing storage (tied embeddings)
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}, str(file))


def _beside_base(base: Path | None, out: Path, write: Callable[[Path], None]) -> Path:
    with written_whole(out) as tmp:
        if base is not None:  # config, tokenizer, generation config: everything but the old weights
            for f in base.iterdir():
                if f.is_file() and not f.name.endswith(_WEIGHT_FILES) and not f.name.endswith(".index.json"):
                    shutil.copy2(f, tmp / f.name)
        write(tmp)
    return out
