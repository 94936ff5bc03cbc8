"""`math-tir`: arithmetic and algebra problems that are quick to solve with a short program.

    make_math_tir(n, seed) -> [Task]   answers are integers written in decimal; each task's
                                       reference call is a `python` program that prints it

Each template draws its numbers from the task's own random.Random, computes the answer here
(the same arithmetic as its reference program), and is sized so brute force finishes in well
under a second.
"""

from __future__ import annotations

import math
import random

from prorsa.agent.datasets.base import Task, register
from prorsa.agent.tools.base import ToolCall


def _sum_multiples(r: random.Random):
    n, a, b = r.randrange(200, 5000), r.randrange(2, 12), r.randrange(2, 12)
    answer = sum(i for i in range(1, n) if i % a == 0 or i % b == 0)
    return (f"What is the sum of all positive integers below {n} that are divisible by {a} or {b}?",
            answer, f"print(sum(i for i in range(1, {n}) if i % {a} == 0 or i % {b} == 0))")


def _power_mod(r: random.Random):
    a, b, m = r.randrange(2, 100), r.randrange(50, 10**6), r.randrange(7, 1000)
    return (f"What is the remainder when {a}^{b} is divided by {m}?", pow(a, b, m),
            f"print(pow({a}, {b}, {m}))")


def _linear(r: random.Random):
    x, a, b = r.randrange(-50, 51), r.choice([i for i in range(-12, 13) if i]), r.randrange(-100, 101)
    c = a * x + b
    return (f"Solve for x: {a}x + {b} = {c}.", x, f"print(({c} - {b}) // {a})")


def _count_primes(r: random.Random):
    lo = r.randrange(1, 5000)
    hi = lo + r.randrange(100, 3000)
    answer = sum(1 for k in range(max(lo, 2), hi + 1) if all(k % d for d in range(2, math.isqrt(k) + 1)))
    code = (f"print(sum(1 for k in range({max(lo, 2)}, {hi + 1}) "
            f"if all(k % d for d in range(2, int(k ** 0.5) + 1))))")
    return f"How many prime numbers are there between {lo} and {hi}, inclusive?", answer, code


def _factorial_digits(r: random.Random):
    n = r.randrange(10, 200)
    answer = sum(int(d) for d in str(math.factorial(n)))
    return (f"What is the sum of the digits of {n}!?", answer,
            f"import math\nprint(sum(int(d) for d in str(math.factorial({n}))))")


def _lcm3(r: random.Random):
    a, b, c = (r.randrange(2, 60) for _ in range(3))
    return (f"What is the least common multiple of {a}, {b} and {c}?", math.lcm(a, b, c),
            f"import math\nprint(math.lcm({a}, {b}, {c}))")


def _quadratic(r: random.Random):
    r1, r2 = r.randrange(-30, 31), r.randrange(-30, 31)
    p, q = -(r1 + r2), r1 * r2
    return (f"The equation x^2 + ({p})x + ({q}) = 0 has two integer roots. What is the larger root?",
            max(r1, r2),
            f"print(max(x for x in range(-100, 101) if x * x + ({p}) * x + ({q}) == 0))")


def _fibonacci_mod(r: random.Random):
    n, m = r.randrange(50, 5000), r.randrange(10, 10**4)
    a, b = 1, 1
    for _ in range(n - 2):
        a, b = b, (a + b) % m
    answer = b % m if n > 1 else 1 % m
    code = f"a, b = 1, 1\nfor _ in range({n} - 2):\n    a, b = b, (a + b) % {m}\nprint(b % {m})"
    return f"With F(1) = F(2) = 1, what is the {n}th Fibonacci number modulo {m}?", answer, code


TEMPLATES = {"sum_multiples": _sum_multiples, "power_mod": _power_mod, "linear": _linear,
             "count_primes": _count_primes, "factorial_digits": _factorial_digits, "lcm3": _lcm3,
             "quadratic": _quadratic, "fibonacci_mod": _fibonacci_mod}
INSTRUCTION = "Use the python tool if it helps. Give the final answer as \\boxed{N}."


@register("math-tir")
def make_math_tir(n: int, seed: int = 0) -> list[Task]:
    names = sorted(TEMPLATES)
    tasks = []
    for i in range(n):
        r = random.Random(f"math-tir:{seed}:{i}")
        template = names[i % len(names)] if i < len(names) else r.choice(names)
        question, answer, code = TEMPLATES[template](r)
        tasks.append(Task(f"math-tir-{seed}-{i}", "math-tir", f"{question}\n{INSTRUCTION}", str(answer),
                          (ToolCall("python", {"code": code}),), meta={"template": template}))
    return tasks
