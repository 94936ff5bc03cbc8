"""The tools one trajectory may call, by name.

    Toolbox(tools, timeout_s=None)      tools: Tool objects with distinct names
    await Toolbox.run(call) -> ToolResult   an unknown name is an ERROR observation listing the
                                        known ones; everything else as call_tool
    Toolbox.schemas()                   the tools in the OpenAI function format that chat
                                        templates take (`tools=` of apply_chat_template)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prorsa.agent.tools.base import Tool, ToolCall, ToolResult, ToolStatus, call_tool


class Toolbox:
    def __init__(self, tools: Iterable[Tool], timeout_s: float | None = None):
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.timeout_s = timeout_s  # per call; None leaves it to each tool's own limits

    async def run(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(f"Error: no tool named {call.name!r}; the tools are {sorted(self.tools)}",
                              ToolStatus.ERROR, 0.0, "unknown tool")
        return await call_tool(tool, call.arguments, timeout_s=self.timeout_s)

    def schemas(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": dict(t.parameters)}}
                for t in self.tools.values()]
