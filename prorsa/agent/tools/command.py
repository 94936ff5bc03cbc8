"""A tool that runs a command line in the sandbox, declared as data.

    CommandSpec(name, argv, description="", parameters=None, limits=..., truncation=...)
    CommandTool(spec)       the Tool; `{key}` in an argv element is replaced by argument `key`

The command is never given to a shell: each argv element is filled in on its own, so an argument
cannot add words or redirections. Without explicit `parameters`, every placeholder becomes a
required string argument.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from prorsa.agent.tools.base import ToolResult, ToolStatus
from prorsa.agent.tools.python_tool import observe
from prorsa.agent.tools.sandbox import SandboxLimits, run_sandboxed
from prorsa.agent.tools.truncate import Truncation


@dataclass(frozen=True)
class CommandSpec:
    name: str
    argv: tuple[str, ...]  # e.g. ("grep", "-rn", "{pattern}", ".")
    description: str = ""
    parameters: Mapping[str, Any] | None = None  # None: one required string per placeholder
    limits: SandboxLimits = SandboxLimits()
    truncation: Truncation = Truncation()
    files: Mapping[str, str] = field(default_factory=dict)  # seeded into every call's scratch dir

    def placeholders(self) -> list[str]:
        names = [f for part in self.argv for _, f, _, _ in string.Formatter().parse(part) if f]
        return list(dict.fromkeys(names))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class CommandTool:
    def __init__(self, spec: CommandSpec):
        if not spec.argv:
            raise ValueError(f"command tool {spec.name!r} has an empty argv")
        self.spec = spec
        self.name = spec.name
        self.description = spec.description or f"Run `{' '.join(spec.argv)}`."
        self.parameters = spec.parameters or {
            "type": "object", "required": spec.placeholders(),
            "properties": {p: {"type": "string"} for p in spec.placeholders()},
        }

    async def call(self, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> ToolResult:
        values = {k: _text(v) for k, v in arguments.items()}
        try:
            argv = [part.format_map(values) for part in self.spec.argv]
        except (KeyError, IndexError, ValueError) as e:
            return ToolResult(f"Error: cannot fill in the command: {e!r}", ToolStatus.ERROR, 0.0,
                              "bad arguments")
        limits = self.spec.limits
        if timeout_s is not None:
            limits = replace(limits, wall_s=min(timeout_s, limits.wall_s))
        run = await run_sandboxed(argv=argv, limits=limits, files=dict(self.spec.files))
        return observe(run, limits, self.spec.truncation)
