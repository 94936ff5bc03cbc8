"""`swe-lite`: repair a small buggy Python function so that its unit tests pass.

    BUGS                              template name -> Bug(buggy, fixed, inputs, probes)
    make_swe_lite(n, seed) -> [Task]  answer = the fixed source; tests = assert lines; the
                                      reference call runs the fixed source and the tests in the
                                      `python` tool; meta["buggy"] is the source to repair

Expected values in the tests come from running the known fix here, on inputs drawn from the
task's random.Random plus the template's probes: inputs on which the bug shows, so every task's
buggy source fails at least one test (tests/agent/test_datasets.py checks both directions).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from prorsa.agent.datasets.base import Task, register
from prorsa.agent.tools.base import ToolCall


@dataclass(frozen=True)
class Bug:
    buggy: str  # the function with the bug; "{f}" stands for its name
    fixed: str  # the same function repaired
    inputs: Callable[[random.Random], tuple]  # one random argument tuple
    probes: tuple[tuple, ...]  # argument tuples on which the buggy version is wrong


def _ints(r, lo=-20, hi=20, n=None):
    return [r.randrange(lo, hi) for _ in range(n or r.randrange(1, 8))]


_MAX_LOOP = "    for x in xs:\n        if x > best:\n            best = x\n    return best\n"
_FIZZ = "    if n % 3 == 0:\n        return 'Fizz'\n"
_BUZZ = "    if n % 5 == 0:\n        return 'Buzz'\n"
_FIZZBUZZ = "    if n % 15 == 0:\n        return 'FizzBuzz'\n"
BUGS = {
    "sum_to": Bug("def {f}(n):\n    return sum(range(1, n))\n",
                  "def {f}(n):\n    return sum(range(1, n + 1))\n",
                  lambda r: (r.randrange(0, 100),), ((1,), (10,))),
    "largest": Bug("def {f}(xs):\n    best = 0\n" + _MAX_LOOP, "def {f}(xs):\n    best = xs[0]\n" + _MAX_LOOP,
                   lambda r: (_ints(r),), (([-3, -7, -1],),)),
    "is_palindrome": Bug("def {f}(s):\n    return s == s[::-1]\n",
                         "def {f}(s):\n    s = s.lower()\n    return s == s[::-1]\n",
                         lambda r: ("".join(r.choice("abAB") for _ in range(r.randrange(1, 6))),),
                         (("Abba",), ("Racecar",))),
    "count_vowels": Bug("def {f}(s):\n    return sum(1 for c in s.lower() if c in 'aeio')\n",
                        "def {f}(s):\n    return sum(1 for c in s.lower() if c in 'aeiou')\n",
                        lambda r: ("".join(r.choice("abuoxyU ") for _ in range(r.randrange(0, 12))),),
                        (("Umbrella under",),)),
    "clamp": Bug("def {f}(x, lo, hi):\n    return max(hi, min(lo, x))\n",
                 "def {f}(x, lo, hi):\n    return max(lo, min(hi, x))\n",
                 lambda r: (r.randrange(-50, 50), r.randrange(-20, 0), r.randrange(0, 20)),
                 ((5, 0, 10), (-5, 0, 10))),
    "mean": Bug("def {f}(xs):\n    return sum(xs) // len(xs)\n",
                "def {f}(xs):\n    return sum(xs) / len(xs)\n",
                lambda r: (_ints(r, 0, 50),), (([1, 2],), ([3, 4, 4],))),
    "fizzbuzz": Bug("def {f}(n):\n" + _FIZZ + _BUZZ + _FIZZBUZZ + "    return str(n)\n",
                    "def {f}(n):\n" + _FIZZBUZZ + _FIZZ + _BUZZ + "    return str(n)\n",
                    lambda r: (r.randrange(1, 100),), ((15,), (30,))),
    "reverse_words": Bug("def {f}(s):\n    return s[::-1]\n",
                         "def {f}(s):\n    return ' '.join(reversed(s.split()))\n",
                         lambda r: (" ".join(r.choices(["red", "fox", "sky", "owl"], k=r.randrange(1, 5))),),
                         (("hello big world",),)),
    "second_largest": Bug("def {f}(xs):\n    return sorted(xs)[-2]\n",
                          "def {f}(xs):\n    return sorted(set(xs))[-2]\n",
                          lambda r: (_ints(r, 0, 9, r.randrange(3, 8)) + [10, 11],), (([1, 5, 5],), ([2, 9, 9, 3],))),
    "factorial": Bug("def {f}(n):\n    if n == 0:\n        return 0\n    return n * {f}(n - 1)\n",
                     "def {f}(n):\n    if n == 0:\n        return 1\n    return n * {f}(n - 1)\n",
                     lambda r: (r.randrange(0, 12),), ((0,), (5,))),
}
NAMES = {"sum_to": ["sum_to", "total_up_to", "triangle"], "largest": ["largest", "max_of", "find_max"],
         "is_palindrome": ["is_palindrome", "reads_same"], "count_vowels": ["count_vowels", "vowels_in"],
         "clamp": ["clamp", "bound"], "mean": ["mean", "average"], "fizzbuzz": ["fizzbuzz", "fb"],
         "reverse_words": ["reverse_words", "flip_words"], "second_largest": ["second_largest", "runner_up"],
         "factorial": ["factorial", "fact"]}
TESTS_PER_TASK = 5


def _call(f: str, args: tuple) -> str:
    return f"{f}({', '.join(repr(a) for a in args)})"


def _tests(bug: Bug, f: str, r: random.Random) -> tuple[str, ...]:
    ns: dict = {}
    exec(bug.fixed.format(f=f), ns)  # our own known-good source, to compute expected values
    cases = list(bug.probes[:1]) + [bug.inputs(r) for _ in range(TESTS_PER_TASK - 1)]
    return tuple(f"assert {_call(f, a)} == {ns[f](*a)!r}" for a in cases)


def runner(source: str, tests: tuple[str, ...]) -> str:
    """A program that runs `source` then each test, printing PASS or FAIL per test."""
    return (source + "\n\nfor _i, _t in enumerate(" + repr(list(tests)) + "):\n"
            "    try:\n        exec(_t)\n        print('PASS', _i)\n"
            "    except Exception as _e:\n        print('FAIL', _i, repr(_e))\n")


@register("swe-lite")
def make_swe_lite(n: int, seed: int = 0) -> list[Task]:
    templates = sorted(BUGS)
    tasks = []
    for i in range(n):
        r = random.Random(f"swe-lite:{seed}:{i}")
        template = templates[i % len(templates)]
        f = r.choice(NAMES[template])
        bug = BUGS[template]
        buggy, fixed = bug.buggy.format(f=f), bug.fixed.format(f=f)
        tests = _tests(bug, f, r)
        prompt = (f"This function has a bug:\n\n```python\n{buggy}```\n\nThese tests must pass:\n\n"
                  + "\n".join(tests) + "\n\nReply with the whole fixed function in a ```python block.")
        tasks.append(Task(f"swe-lite-{seed}-{i}", "swe-lite", prompt, fixed,
                          (ToolCall("python", {"code": runner(fixed, tests)}),), tests,
                          meta={"template": template, "function": f, "buggy": buggy}))
    return tasks
