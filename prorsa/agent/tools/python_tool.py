"""The `python` tool: run the model's code in the sandbox and show it what the code printed.

    PythonTool(limits=SandboxLimits(), truncation=Truncation(), files=None)
    await PythonTool().call({"code": "..."}, timeout_s=None) -> ToolResult

How a sandbox run ends becomes the status (the observation ends with a one-line note for every
status but ok, so the model can tell a timeout from a silent program):

    ok -> OK (TRUNCATED when the output was cut)   exit != 0 -> ERROR   signal -> CRASH
    wall or CPU limit -> TIMEOUT   output past limits.output_bytes -> TRUNCATED (code stopped)
    isolation could not be set up -> CRASH (the code is never run unisolated)
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from prorsa.agent.tools.base import ToolResult, ToolStatus
from prorsa.agent.tools.registry import register
from prorsa.agent.tools.sandbox import SandboxLimits, SandboxRun, run_sandboxed
from prorsa.agent.tools.truncate import Truncation


def _signal_name(sig: int | None) -> str:
    try:
        return signal.Signals(sig).name
    except (ValueError, TypeError):
        return f"signal {sig}"


def describe(run: SandboxRun, limits: SandboxLimits) -> tuple[ToolStatus, str]:
    """The status of a sandbox run and the note that tells the model how it ended."""
    if run.kind == "ok":
        return ToolStatus.OK, ""
    if run.kind == "exit":
        return ToolStatus.ERROR, f"[exit code {run.exit_code}]"
    if run.kind == "signal":
        return ToolStatus.CRASH, f"[killed by {_signal_name(run.signal)}]"
    if run.kind == "timeout":
        return ToolStatus.TIMEOUT, f"[timed out after {limits.wall_s:g} s]"
    if run.kind == "cpu":
        return ToolStatus.TIMEOUT, f"[CPU time limit of {limits.cpu_s} s reached]"
    if run.kind == "memory":
        mib = limits.memory_bytes >> 20
        return ToolStatus.CRASH, f"[memory limit of {mib} MiB for the whole program reached; it was stopped]"
    if run.kind == "overflow":
        return ToolStatus.TRUNCATED, f"[output over {limits.output_bytes} bytes; the program was stopped]"
    return ToolStatus.CRASH, "[the sandbox could not start]"


def observe(run: SandboxRun, limits: SandboxLimits, truncation: Truncation) -> ToolResult:
    status, note = describe(run, limits)
    text, cut = truncation.apply(run.output)
    if cut and status is ToolStatus.OK:
        status = ToolStatus.TRUNCATED
    observation = "\n".join(part for part in (text.rstrip("\n"), note) if part) or "(no output)"
    detail = f"{run.kind} exit={run.exit_code} signal={run.signal}"
    return ToolResult(observation, status, run.elapsed_s, detail)


@register("python")
class PythonTool:
    name = "python"
    description = ("Run a Python 3 program in a fresh sandbox (no network, files only in the "
                   "current directory) and return what it prints. State does not persist between calls.")
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "the complete program to run"}},
        "required": ["code"],
    }

    def __init__(self, limits: SandboxLimits = SandboxLimits(), truncation: Truncation = Truncation(),
                 files: Mapping[str, str | bytes] | None = None):
        self.limits = limits
        self.truncation = truncation
        self.files = dict(files or {})  # copied into every call's scratch directory

    async def call(self, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> ToolResult:
        limits = self.limits if timeout_s is None else replace(self.limits, wall_s=min(timeout_s, self.limits.wall_s))
        run = await run_sandboxed(str(arguments["code"]), limits=limits, files=self.files)
        return observe(run, limits, self.truncation)
