"""Tools by name: the built-ins, and user tools loaded by dotted path.

    TOOLS                         name -> factory (a class or function that returns a Tool)
    @register("name")             add a factory
    make_tool(spec, **options)    a registered name ("python", "calculator", "search") or a dotted
                                  path "pkg.mod:attr" (see load_tool); options go to the factory
    load_object("pkg.mod:attr")   import the module and return the attribute (dots walk into it)
    as_tool(obj, **options)       a Tool from: a Tool, a CommandSpec, a Tool class or factory, or
                                  a plain function (wrapped in FunctionTool)

The built-ins register on import of their modules, which make_tool does on first use.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from prorsa.agent.tools.base import Tool

TOOLS: dict[str, Callable[..., Tool]] = {}
_BUILTINS = ("prorsa.agent.tools.python_tool", "prorsa.agent.tools.calculator",
             "prorsa.agent.tools.search")


class ToolLoadError(ValueError):
    """A tool spec that names nothing loadable; the message says what and why."""


def register(name: str) -> Callable[[Callable[..., Tool]], Callable[..., Tool]]:
    def add(factory: Callable[..., Tool]) -> Callable[..., Tool]:
        TOOLS[name] = factory
        return factory

    return add


def load_object(path: str) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ToolLoadError(f"{path!r} is not a dotted path of the form 'package.module:name'")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ToolLoadError(f"cannot import {module_name!r} for {path!r}: {e}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ToolLoadError(f"{module_name!r} has no attribute {attr!r}") from e
    return obj


def as_tool(obj: Any, **options: Any) -> Tool:
    from prorsa.agent.tools.command import CommandSpec, CommandTool
    from prorsa.agent.tools.function import FunctionTool

    if isinstance(obj, CommandSpec):
        return CommandTool(obj)
    if isinstance(obj, Tool) and not inspect.isclass(obj):
        return obj
    if inspect.isclass(obj) and isinstance(obj, type) and _looks_like_tool_class(obj):
        return obj(**options)
    if callable(obj):
        return FunctionTool(obj, **options)
    raise ToolLoadError(f"{obj!r} is not a tool, a CommandSpec, a tool class or a function")


def _looks_like_tool_class(cls: type) -> bool:
    return all(hasattr(cls, a) for a in ("name", "parameters", "call"))


def make_tool(spec: str, **options: Any) -> Tool:
    for module in _BUILTINS:  # cached after the first call
        importlib.import_module(module)
    if spec in TOOLS:
        return TOOLS[spec](**options)
    if ":" in spec:
        return as_tool(load_object(spec), **options)
    raise ToolLoadError(f"unknown tool {spec!r}: expected one of {sorted(TOOLS)} or 'package.module:name'")
