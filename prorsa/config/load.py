"""Reading pipeline files: YAML -> PipelineConfig, or one clear ConfigError line.

    parse_overrides(["k.k=v", ...])  command-line KEY=VALUE overrides -> {dotted key: value}
    load_pipeline(path, overrides)   parse, apply dotted overrides, validate the schema (what
                                     needs policies, profiles or the trace's content is checked
                                     by the resolve step above: rollout/context.py)
    read_mapping(path)               a YAML file's top-level mapping (any config file): at most
                                     MAX_FILE_BYTES, MAX_NODES values with aliases expanded, no
                                     key given twice
    describe(error)                  pydantic's error -> "field.path: got X; expected Y"
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import typing
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

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


def describe(err: dict[str, Any], model: type[BaseModel] | None = None) -> str:
    """`model`: the schema the error came from; an unknown field is then told the nearest it has."""
    loc = ".".join(p if isinstance(p, str) and p.isprintable() and p.strip() == p and p else repr(p)
                   for p in err["loc"]) or "(top level)"
    loc = re.sub(r"\bgroups\.(\d+)", r"groups[\1]", loc)  # engines.groups[1].roles: a group as it is indexed
    msg = err["msg"].removeprefix("Value error, ")
    # a cross-field check names the group field it refuses (engines: groups[1].tp: ...): that is its place
    if m := re.match(r"(count|groups\[\d+\](?:\.\w+)?): ", msg):
        loc, msg = f"{loc}.{m.group(1)}", msg[m.end():]
    # a check across sections names the field it refuses (runtime.cells: ...): that is its place
    elif loc == "(top level)" and (m := re.match(r"([a-z_]+(?:\.[a-z_]+)+): ", msg)):
        loc, msg = m.group(1), msg[m.end():]
    if err["type"] == "extra_forbidden":
        near = _nearest(model, err["loc"]) if model is not None else None
        return f"{loc}: unknown field" + (f"; did you mean {near!r}?" if near else "")
    if err["type"] == "missing":
        return f"{loc}: missing; this field is required"
    if "input" in err and not isinstance(err["input"], dict):
        return f"{loc}: got {err['input']!r}; expected: {msg}"
    return f"{loc}: {msg}"


def _nearest(model: type[BaseModel], loc: tuple) -> str | None:
    """The field of the section `loc` points into whose name is nearest its last part."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        inner = [a for a in (field.annotation, *typing.get_args(field.annotation))
                 for a in (a, *typing.get_args(a)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return None
        model = inner[0]
    close = difflib.get_close_matches(str(loc[-1]), list(getattr(model, "model_fields", {})), n=1, cutoff=0.6)
    return close[0] if close else None


def is_file(path: str | Path) -> bool:
    """Path.is_file, False also for names no file can have (a NUL byte, too long)."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


MAX_FILE_BYTES = 1 << 20  # a config file is a page of settings; a bigger one is not one
MAX_NODES = 100_000  # values in the document once every alias is expanded (a "billion laughs" has 10^9)


class _Loader(yaml.SafeLoader):
    """safe_load, refusing a key given twice in one mapping (YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable):  # an unhashable key is refused by the base class
                if key in seen:
                    raise _Refused(f"line {key_node.start_mark.line + 1}: key {key!r} given twice")
                seen.add(key)
        return super().construct_mapping(node, deep)


class _Refused(Exception):
    """A document this loader will not build: the message says why."""


def _expanded(node, memo: dict[int, int]) -> int:
    """Values in the document under `node` with every alias expanded; shared nodes counted once
    per use, each computed once."""
    n = memo.get(id(node))
    if n is None:
        if isinstance(node, yaml.MappingNode):
            n = 1 + sum(_expanded(k, memo) + _expanded(v, memo) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n = 1 + sum(_expanded(v, memo) for v in node.value)
        else:
            n = 1
        memo[id(node)] = n
    return n


def _load_yaml(text: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded(node, {}) > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES:,} values once its aliases are expanded")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_mapping(path: Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping, or one ConfigError line."""
    if not is_file(path):
        raise ConfigError(f"{path}: no such file")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: {size:,} bytes; a config file is at most {MAX_FILE_BYTES:,}")
        data = _load_yaml(path.read_text())
    except _Refused as e:
        raise ConfigError(f"{path}: {e}") from None
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


_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """`workload.prompts=64 policy=prorsa engines.vllm.model=null` (hydra's form) -> dotted key ->
    value, each value read as YAML (64 an int, null None, [a, b] a list); the schema checks them."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq or not _KEY.fullmatch(key):
            raise ConfigError(f"override {item!r}: expected KEY=VALUE with a dotted field name, "
                              "e.g. workload.prompts=64")
        try:
            out[key] = _load_yaml(text) if text.strip() else None
        except (yaml.YAMLError, _Refused, RecursionError) as e:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({type(e).__name__})") from None
    return out


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
        raise ConfigError(f"{path}: {describe(errs[0], PipelineConfig)}{more}") from None
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
