"""The house's room sizes: no file in prorsa/ over MAX_LINES lines, no function over MAX_FUNCTION
lines, none that takes more than MAX_PARAMETERS parameters (keyword-only ones count; self and cls
do not). Parameters that travel together go in a typed record; a long function is split into named
pieces that each do one job.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500
MAX_FUNCTION = 60
MAX_PARAMETERS = 8


def _functions(tree: ast.AST, prefix: str = ""):
    """(dotted name, node) of every function, methods and nested functions included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs) if p.arg not in ("self", "cls")]


def oversized(root: Path) -> list[str]:
    """One line per file, function or parameter list past its bound, in path order."""
    out = []
    for path in sorted((root / "prorsa").rglob("*.py")):
        rel, text = path.relative_to(root).as_posix(), path.read_text()
        if (n := len(text.splitlines())) > MAX_LINES:
            out.append(f"{rel}: {n} lines (at most {MAX_LINES})")
        for name, fn in _functions(ast.parse(text)):
            if (n := fn.end_lineno - fn.lineno + 1) > MAX_FUNCTION:
                out.append(f"{rel}:{fn.lineno} {name}: {n} lines (at most {MAX_FUNCTION})")
            if (n := len(parameters(fn))) > MAX_PARAMETERS:
                out.append(f"{rel}:{fn.lineno} {name}: {n} parameters (at most {MAX_PARAMETERS})")
    return out


def test_no_room_is_oversized():
    assert oversized(ROOT) == []


def test_the_check_finds_a_long_file_a_long_function_and_a_long_parameter_list(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION))
    (tmp_path / "prorsa" / "sub").mkdir(parents=True)
    (tmp_path / "prorsa" / "sub" / "a.py").write_text(
        "class C:\n"
        "    def ok(self, a, b, c, d, e, f, g, h):\n        pass\n"
        "    async def wide(self, a, b, c, d, e, f, g, *, h, i):\n        pass\n"
        f"def long():\n{body}"
        f"def outer():\n    def inner():\n{body.replace('    ', '        ')}")
    (tmp_path / "prorsa" / "b.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(tmp_path) == [
        f"prorsa/b.py: {MAX_LINES + 1} lines (at most {MAX_LINES})",
        "prorsa/sub/a.py:4 C.wide: 9 parameters (at most 8)",
        f"prorsa/sub/a.py:6 long: {MAX_FUNCTION + 1} lines (at most {MAX_FUNCTION})",
        f"prorsa/sub/a.py:{MAX_FUNCTION + 7} outer: {MAX_FUNCTION + 2} lines (at most {MAX_FUNCTION})",
        f"prorsa/sub/a.py:{MAX_FUNCTION + 8} outer.inner: {MAX_FUNCTION + 1} lines (at most {MAX_FUNCTION})",
    ]
