"""Tools an agent calls during a trajectory, and the parser that finds the calls in its output.

    base.py         Tool protocol, ToolCall, ToolResult, ToolStatus, call_tool (never raises)
    registry.py     TOOLS, @register, make_tool("python" | "pkg.mod:attr"), load_object, as_tool
    toolbox.py      Toolbox: one trajectory's tools by name, run(call), schemas() for templates
    parser.py       ToolCallParser: Hermes/Qwen <tool_call> tags and bare function-call JSON
    sandbox.py      run_sandboxed: a process in fresh namespaces with rlimits and a scratch dir
    python_tool.py  `python`: the model's program in the sandbox
    command.py      CommandSpec / CommandTool: a command line as a sandboxed tool
    function.py     FunctionTool: a Python function as a tool
    calculator.py   `calculator`: arithmetic from the syntax tree
    search.py       `search`: BM25 over a corpus of Documents
    truncate.py     Truncation: an observation cut to a budget of characters or tokens
"""

from prorsa.agent.tools.base import Tool, ToolCall, ToolResult, ToolStatus, call_tool
from prorsa.agent.tools.command import CommandSpec, CommandTool
from prorsa.agent.tools.function import FunctionTool
from prorsa.agent.tools.parser import ParsedCalls, ParseError, ToolCallParser
from prorsa.agent.tools.registry import TOOLS, ToolLoadError, as_tool, load_object, make_tool, register
from prorsa.agent.tools.sandbox import SandboxLimits, SandboxRun, run_sandboxed
from prorsa.agent.tools.toolbox import Toolbox
from prorsa.agent.tools.truncate import Truncation

__all__ = [
    "Tool", "ToolCall", "ToolResult", "ToolStatus", "call_tool", "CommandSpec", "CommandTool",
    "FunctionTool", "ParsedCalls", "ParseError", "ToolCallParser", "TOOLS", "ToolLoadError",
    "as_tool", "load_object", "make_tool", "register", "SandboxLimits", "SandboxRun",
    "run_sandboxed", "Toolbox", "Truncation",
]
