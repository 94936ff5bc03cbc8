"""Reading pipeline files: YAML -> PipelineConfig, or one clear ConfigError line.

    load_pipeline(path, overrides)   parse, apply dotted overrides, validate the schema (what
                                     needs policies, profiles or the trace's content is checked
                                     by the resolve step above: rollout/context.py)
    read_mapping(path)               a YAML file's top-level mapping (any config file)
    describe(error)                  pydantic's error -> "field.path: got X; expected Y"
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from prorsa.config.pipeline import PipelineConfig


class ConfigError(Exception):
    """A bad input file; the message is one line naming the file, the field and the problem."""

    def __init__(self, message: str) -> None:
        # the line may quote the input, and an input can hold line breaks
        super().__init__(message.replace("\r", "\\r").replace("\n", "\\n"))


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: {key} is not a section")
        node = child
    node[leaf] = value


def describe(err: dict[str, Any]) -> str:
    loc = ".".join(p if isinstance(p, str) and p.isprintable() and p.strip() == p and p else repr(p)
                   for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown field"
    if err["type"] == "missing":
        return f"{loc}: missing; this field is required"
    if "input" in err and not isinstance(err["input"], dict):
        return f"{loc}: got {err['input']!r}; expected: {msg}"
    return f"{loc}: {msg}"


def is_file(path: str | Path) -> bool:
    """Path.is_file, False also for names no file can have (a NUL byte, too long)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def read_mapping(path: Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping, or one ConfigError line."""
    if not is_file(path):
        raise ConfigError(f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: {where}not valid YAML ({problem})") from None
    except RecursionError:  # the parser recurses once per nesting level
        raise ConfigError(f"{path}: not valid YAML (nested too deeply)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data


def load_pipeline(path: str | Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    path = Path(path)
    data = read_mapping(path)
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    try:
        cfg = PipelineConfig.model_validate(data)
    except ValidationError as e:
        errs = e.errors()
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise ConfigError(f"{path}: {describe(errs[0])}{more}") from None
    cfg = cfg.resolve_paths(path.parent)
    if cfg.workload.trace:
        if not is_file(cfg.workload.trace):
            raise ConfigError(f"{path}: workload.trace: got {cfg.workload.trace!r}; no such file")
    env = cfg.environment
    if env is not None and env.dataset.endswith(".jsonl") and not is_file(env.dataset):
        raise ConfigError(f"{path}: environment.dataset: got {env.dataset!r}; no such file")
    return cfg


def config_hash(cfg: PipelineConfig) -> str:
    """Stable across runs and machines: what makes two runs comparable."""
    blob = json.dumps(cfg.model_dump(mode="json"), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
