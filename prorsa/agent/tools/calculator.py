"""The `calculator` tool: arithmetic on an expression, evaluated from its syntax tree (no eval).

    evaluate(expression) -> int | float     raises CalcError with a message for the model
    Calculator().call({"expression": "..."}) -> ToolResult

Allowed: int and float literals, + - * / // % **, unary + -, parentheses, the constants in
CONSTANTS and the functions in FUNCTIONS. Everything else (names, attributes, subscripts,
comprehensions, strings) is refused. Sizes are bounded so an expression cannot hang the
caller: at most MAX_CHARS characters, integer results of at most MAX_BITS bits, factorial
and comb arguments up to MAX_FACTORIAL.
"""

from __future__ import annotations

import ast
import math
import operator
import time
from collections.abc import Mapping
from typing import Any

from prorsa.agent.tools.base import ToolResult, ToolStatus
from prorsa.agent.tools.registry import register

MAX_CHARS = 1000
MAX_BITS = 10_000
MAX_FACTORIAL = 1000


class CalcError(ValueError):
    pass


def _pow(a, b):
    if isinstance(a, int) and isinstance(b, int) and b > 0 and a not in (0, 1, -1):
        if abs(a).bit_length() * b > MAX_BITS:
            raise CalcError(f"result too large ({a} ** {b})")
    return operator.pow(a, b)


def _factorial(n):
    if not isinstance(n, int) or n < 0 or n > MAX_FACTORIAL:
        raise CalcError(f"factorial takes an integer from 0 to {MAX_FACTORIAL}")
    return math.factorial(n)


def _comb(n, k):
    if not isinstance(n, int) or n > MAX_FACTORIAL:
        raise CalcError(f"comb takes n up to {MAX_FACTORIAL}")
    return math.comb(n, k)


BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
          ast.Pow: _pow}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
FUNCTIONS = {"sqrt": math.sqrt, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil,
             "log": math.log, "log2": math.log2, "log10": math.log10, "exp": math.exp,
             "sin": math.sin, "cos": math.cos, "tan": math.tan, "factorial": _factorial,
             "gcd": math.gcd, "lcm": math.lcm, "min": min, "max": max, "comb": _comb}
CONSTANTS = {"pi": math.pi, "e": math.e}


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        value = BINARY[type(node.op)](_eval(node.left), _eval(node.right))
        if isinstance(value, int) and value.bit_length() > MAX_BITS:
            raise CalcError("result too large")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name) and node.id in CONSTANTS:
        return CONSTANTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS \
            and not node.keywords:
        return FUNCTIONS[node.func.id](*(_eval(a) for a in node.args))
    what = ast.unparse(node) if hasattr(ast, "unparse") else type(node).__name__
    raise CalcError(f"not allowed in an arithmetic expression: {what!r}")


def evaluate(expression: str) -> int | float:
    if len(expression) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip().replace("^", "**"), mode="eval")
    except SyntaxError as e:
        raise CalcError(f"syntax error: {e.msg}") from None
    try:
        value = _eval(tree)
    except CalcError:
        raise
    except (ArithmeticError, ValueError, TypeError) as e:  # 1/0, sqrt(-1), gcd(1.5, 2)
        raise CalcError(f"{type(e).__name__}: {e}") from None
    if isinstance(value, complex):
        raise CalcError("complex result")
    return value


@register("calculator")
class Calculator:
    name = "calculator"
    description = ("Evaluate an arithmetic expression: + - * / // % ** (or ^), parentheses, "
                   f"pi, e and {', '.join(FUNCTIONS)}.")
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * sqrt(2)"}},
        "required": ["expression"],
    }

    async def call(self, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> ToolResult:
        start = time.perf_counter()
        try:
            value = evaluate(str(arguments["expression"]))
        except CalcError as e:
            return ToolResult(f"Error: {e}", ToolStatus.ERROR, time.perf_counter() - start)
        return ToolResult(repr(value), ToolStatus.OK, time.perf_counter() - start)
