"""The house's floors: every import in prorsa/ runs down, and no files import each other in a circle
unless the circle passes through a registry (a module that defines `register`).

Imports inside functions count: a lazy import is still a dependency. A new room must be placed on
a floor here before it can import anything.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# bottom to top; a room imports only rooms on lower floors
FLOORS = [
    {"prorsa", "roles"},  # ground: the package, the Role enum
    # the one engine-load record, the one sampling record; the schema; the tests' and docs' own
    # tooling (a headless browser), which no run uses
    {"loads", "sampling", "config", "devtools"},
    # shared_weights: weights handed from a trainer (train) to engines (engine) through shared memory
    {"agent", "costmodel", "shared_weights"},
    {"engine", "train"},
    {"control"},  # the brain: forecaster, allocator, policies
    {"metrics"},
    {"report", "console"},  # figures and report.md read back from stored runs; what a command prints
    {"rollout"},  # what both bodies share; no dask
    {"cluster"},  # what runs in or starts worker processes
    {"rl"},  # the RL loop around a live rollout: warm-up, learner, a trainer on its own worker
    {"dashboard"},
    {"sim"},  # the virtual-time body; lent to the live one's policy by the callers above both
    {"sweep", "calibration"},  # many simulations as Dask tasks; a profile fitted by simulating live runs
    {"live"},  # the Dask body
    {"api"},  # the Python API: a live body kept up across calls
    {"serve"},  # the OpenAI-compatible endpoint: a driver for the live body
    {"validate"},
    {"commands"},  # what each command does behind its argument parsing
    {"cli"},
]
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}
NO_DASK = ("agent", "control", "rollout", "costmodel", "train")


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in (root / "prorsa").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(root: Path) -> dict[str, set[str]]:
    """module -> the prorsa modules (and third-party top-level names) it imports, lazily or not."""
    mods = modules(root)

    def owner(name: str) -> str | None:  # the longest known module a dotted name starts with
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                if t.split(".")[0] != "prorsa":
                    found.add(t.split(".")[0])
                elif (m := owner(t)) and m != name:
                    found.add(m)
        edges[name] = found
    return edges


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


# The package re-exports the API lazily (PEP 562 __getattr__): `prorsa.Rollout` loads it on first
# use, so `import prorsa` stays on the ground floor (test_import_prorsa_is_cheap holds it there).
LAZY_EXPORTS = {("prorsa", "prorsa.api")}


def upward(root: Path) -> list[str]:
    bad = []
    for src, targets in imports(root).items():
        for dst in targets:
            if not dst.startswith("prorsa") or room(src) == room(dst):
                continue
            if (src, dst) in LAZY_EXPORTS:
                continue
            a, b = room(src), room(dst)
            if a not in FLOOR or b not in FLOOR:
                bad.append(f"{src} -> {dst}: place room {a if a not in FLOOR else b!r} on a floor in tests/test_layers.py")
            elif FLOOR[b] >= FLOOR[a]:
                bad.append(f"{src} -> {dst}: {a} (floor {FLOOR[a]}) imports {b} (floor {FLOOR[b]})")
    return sorted(bad)


def circles(root: Path) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    graph = {m: {t for t in ts if t.startswith("prorsa")} for m, ts in imports(root).items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def unregistered_circles(root: Path) -> list[list[str]]:
    mods = modules(root)

    def is_registry(m: str) -> bool:
        tree = ast.parse(mods[m].read_text())
        return any(isinstance(n, ast.FunctionDef) and n.name == "register" for n in tree.body)

    return [c for c in circles(root) if not any(is_registry(m) for m in c)]


def test_every_import_runs_down():
    assert upward(ROOT) == []


def test_import_prorsa_is_cheap():
    code = "import sys, prorsa; print(sorted(m for m in ('dask', 'distributed', 'prorsa.api') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_no_circle_but_registries():
    assert unregistered_circles(ROOT) == []


def test_the_brain_and_shared_rooms_import_no_dask_and_no_body():
    bad = [f"{m} imports {t}" for m, ts in imports(ROOT).items() if room(m) in NO_DASK
           for t in ts if t in ("dask", "distributed") or room(t) in ("sim", "live") and t.startswith("prorsa")]
    assert bad == []


def test_the_live_body_imports_no_simulator():
    """The two bodies are peers: a live run's policy rehearses in the simulator its caller lends."""
    bad = [f"{m} imports {t}" for m, ts in imports(ROOT).items() if room(m) == "live"
           for t in ts if t.startswith("prorsa") and room(t) == "sim"]
    assert bad == []


def test_config_is_schema_only():
    bad = [f"{m} -> {t}" for m, ts in imports(ROOT).items() if room(m) == "config"
           for t in ts if t.startswith("prorsa.") and room(t) not in ("config", "roles")]
    assert bad == []


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp


def test_the_checks_catch_an_upward_import_and_a_circle(tmp_path):
    root = _tree(tmp_path, {
        "prorsa/__init__.py": "",
        "prorsa/config/__init__.py": "",
        "prorsa/config/pipeline.py": "def f():\n    from prorsa.control.policy import make_policy\n",
        "prorsa/control/__init__.py": "",
        "prorsa/control/policy.py": "from prorsa.config.pipeline import f\n",
        "prorsa/rollout/__init__.py": "",
        "prorsa/rollout/a.py": "from prorsa.rollout import b\nimport distributed\n",
        "prorsa/rollout/b.py": "from .a import x\n",
    })  # fmt: skip
    assert upward(root) == ["prorsa.config.pipeline -> prorsa.control.policy: config (floor 1) imports control (floor 4)"]
    assert unregistered_circles(root) == [["prorsa.config.pipeline", "prorsa.control.policy"],
                                          ["prorsa.rollout.a", "prorsa.rollout.b"]]
    assert "distributed" in imports(root)["prorsa.rollout.a"]
