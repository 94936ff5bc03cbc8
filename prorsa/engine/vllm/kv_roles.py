"""Which NIXL connector role (kv_role) a vLLM engine starts with, and how it changes role.

    accepts_kv_both(source)        whether the installed vLLM still takes kv_role kv_both (read off
                                   its config source, not imported: importing vLLM takes seconds)
    switch_path(setting)           engines.role_switch resolved: "in_place" or "restart" (auto:
                                   in_place while vLLM accepts kv_both, or where no vLLM is installed
                                   and only the simulator prices the switches); ValueError for
                                   in_place on a vLLM without it
    kv_role(role, path)            kv_both in place; else kv_producer for a prefill engine,
                                   kv_consumer for a decode or mixed one (roles.py)
    describe(path)                 one line for the launch plan

In place, a role is only what the router asks of an engine. By restart, the server is stopped once
the engine holds no leg and no other engine still pulls KV from it, and started again with the
other kv_role on the engine's cores, under its name (fresh ports, as every restart here: a half-dead
old socket never answers). Its weights come back from the OS page cache. vLLM's sleep mode (which
keeps weights across a sleep) cannot help: the connector is built with its role when the engine
starts, and the CPU build has no sleep mode.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from prorsa.roles import Role

IN_PLACE, RESTART = "in_place", "restart"


def _config_source() -> Path | None:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "config" / "kv_transfer.py"
    return path if path.is_file() else None


def accepts_kv_both(source: Path | None = None) -> bool:
    """Whether vLLM's KVRole literal lists kv_both (vllm/config/kv_transfer.py: a Literal of the
    producer and consumer literals). No vLLM, or a file of another shape: False, so auto takes the
    path that needs nothing deprecated."""
    source = source or _config_source()
    if source is None:
        return False
    aliases = {t.id: node.value for node in ast.parse(source.read_text()).body if isinstance(node, ast.Assign)
               for t in node.targets if isinstance(t, ast.Name)}
    return "kv_both" in _strings(aliases.get("KVRole"), aliases, depth=0)


def _strings(node: ast.AST | None, aliases: dict[str, ast.AST], depth: int) -> set[str]:
    """The string constants of a type alias, the aliases it names followed."""
    if node is None or depth > 8:
        return set()
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.add(n.value)
        elif isinstance(n, ast.Name) and n.id in aliases:
            out |= _strings(aliases[n.id], aliases, depth + 1)
    return out


def switch_path(setting: str, source: Path | None = None) -> str:
    if setting == RESTART:
        return RESTART
    source = source or _config_source()
    if source is None or accepts_kv_both(source):  # no vLLM: no engine starts, prices stay as they were
        return IN_PLACE
    if setting == IN_PLACE:
        raise ValueError("engines.role_switch: in_place needs kv_role kv_both, which the installed vLLM "
                         "does not accept; use restart or auto")
    return RESTART


def kv_role(role: Role, path: str) -> str:
    if path == IN_PLACE:
        return "kv_both"
    return "kv_producer" if role.exports_kv else "kv_consumer"


def describe(path: str) -> str:
    if path == IN_PLACE:
        return "role switch: in place (kv_role kv_both: a drain, no restart)"
    return ("role switch: restart (prefill engines kv_producer, decode and mixed kv_consumer; a switch "
            "across them empties the engine and restarts its server)")
