"""Do the decision modules' tests pin prices, or only directions? A seeded sample of mutants of
the allocator, the forecast, its statistics, the router's modules, the move cost, the no-prior
opening and the model's calibration, each run against the tests of tests/control and tests/rollout
(the fast ones): a mutant is killed when a test fails, survives when every test passes.

Mutants are made by cosmic-ray's operators (its sqlite work database of the mutants and their
results is kept, readable with `cr-report FILE`), restricted to the ones that change a price or a decision
rather than crash at once: + - * / // swapped among themselves, a comparison's boundary moved
(< and <=) or negated (< and >=), == and !=, `is` and `is not`, `and` and `or`, a `not` added or
removed, a sign dropped, True and False, a number moved by one, a loop that never runs, break and
continue. The sample is drawn from every mutant of every module, an equal share from each, by a
seeded generator: the same seed draws the same mutants as long as the modules' source is the same,
so a run before and after new tests compares like with like. The unmutated code must pass the
tests first; the source is restored after every mutant.

The score is (killed + timed out) / mutants; "without equivalents" leaves out the survivors
judged equivalent (EQUIVALENT below, each with why no test can kill it).

    .venv/bin/python benchmarks/mutation.py [--mutants 200] [--seed 0] [--timeout S]
                                            [--modules FILE,...] [--db FILE] [--out FILE]
    .venv/bin/python benchmarks/mutation.py --rescore FILE    (after EQUIVALENT changed)

Run it on a clean checkout (it rewrites the modules it mutates while it runs); one worker process.
`--modules` mutates others (an equal share of `--mutants` each), e.g. the rehearsal's own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULES = ("prorsa/control/allocator.py", "prorsa/control/forecast.py", "prorsa/control/forecast_stats.py",
           "prorsa/rollout/router.py", "prorsa/rollout/engine_pools.py", "prorsa/rollout/stickiness.py",
           "prorsa/rollout/engine_choice.py", "prorsa/rollout/cost_rule.py", "prorsa/rollout/migration.py",
           "prorsa/rollout/placement.py", "prorsa/control/opening.py", "prorsa/control/calibration.py")
TESTS = ("tests/control", "tests/rollout")

_ARITH = ("Add", "Sub", "Mul", "Div", "FloorDiv")
_BOUNDARY_AND_NEGATION = {"Lt": ("LtE", "GtE"), "LtE": ("Lt", "Gt"), "Gt": ("GtE", "LtE"), "GtE": ("Gt", "Lt"),
                          "Eq": ("NotEq",), "NotEq": ("Eq",), "Is": ("IsNot",), "IsNot": ("Is",)}
OPERATORS = (
    *(f"core/ReplaceBinaryOperator_{a}_{b}" for a in _ARITH for b in _ARITH if a != b),
    *(f"core/ReplaceComparisonOperator_{a}_{b}" for a, bs in _BOUNDARY_AND_NEGATION.items() for b in bs),
    "core/ReplaceUnaryOperator_USub_UAdd", "core/ReplaceUnaryOperator_Delete_Not", "core/AddNot",
    "core/ReplaceAndWithOr", "core/ReplaceOrWithAnd", "core/ReplaceTrueWithFalse", "core/ReplaceFalseWithTrue",
    "core/NumberReplacer", "core/ZeroIterationForLoop", "core/ReplaceBreakWithContinue",
    "core/ReplaceContinueWithBreak",
)

# Survivors judged equivalent, keyed by (module, the mutated line as it reads after the mutation,
# stripped): the mutant behaves as the original does wherever the program can reach it, so no
# test of what the code computes can kill it. Each says why.
_UNUSED_DEFAULT = "a default no caller relies on: {} it"
_TRAILING_SUM = "the trailing suffix sum is read only past the last sample, where cond_rest takes the tail instead"
_STRICTER_SHORTCUT = ("a shortcut made stricter: what it no longer settles, the exact test against the least load "
                      "settles alike (the floor never exceeds it); only a scan more")
_FILTER_AGAIN = ("the cache keeps the pool it was made for alive, so no other pool takes its id and kept[0] is "
                 "always `eligible`: the mutant only filters the same pool again, alike")
EQUIVALENT: dict[tuple[str, str], str] = {
    ("prorsa/control/allocator.py", "goal_prefill: float = -1.0  # the split being moved toward"):
        _UNUSED_DEFAULT.format("Plan.summary(), the one maker of a PlanSummary, gives"),
    ("prorsa/control/allocator.py", "goal_mixed: float = -1.0"):
        _UNUSED_DEFAULT.format("Plan.summary(), the one maker of a PlanSummary, gives"),
    ("prorsa/control/allocator.py", "return np.array(out, dtype=int).reshape(- 2, 3)"):
        "numpy infers a negative size, any negative, from the others: -2 reshapes as -1 does",
    ("prorsa/control/forecast.py",
     "prefill_tokens: float = 1.0  # prefill tokens arriving over the horizon (turns k > 0)"):
        "a default read only by the dashboard for a decision with no forecast, whose horizon 0 drops it",
    ("prorsa/control/forecast.py",
     "decode_tps_per_seq: float = -1.0  # the per-sequence decode rate it assumed"):
        "a default read only by the dashboard for a decision with no forecast, which does not show it",
    ("prorsa/control/forecast.py",
     "prefill_prefix_tokens: float = -1.0  # mean cached context under a prefill (arrivals, backlog)"):
        _UNUSED_DEFAULT.format("the forecaster, the oracle and the steady forecast each give"),
    ("prorsa/control/forecast.py",
     "def __init__(self, horizon_s: float = 5.0, bin_s: float = 0.5, *, decode_tps: float = 50.0,"):
        _UNUSED_DEFAULT.format("the adaptive policy and the oracle each give"),
    ("prorsa/control/forecast.py",
     "def __init__(self, horizon_s: float = 3.0, bin_s: float = 0.5, *, decode_tps: float = 50.0,"):
        _UNUSED_DEFAULT.format("the adaptive policy and the oracle each give"),
    ("prorsa/control/forecast.py", "growth = np.maximum(self._mid[None, :] - t.start[:, None], -1.0) * rate"):
        "growth below 0 only where a bin's middle is before the decode starts, where occupancy is 0",
    ("prorsa/control/forecast_stats.py",
     "grid = np.unique(np.concatenate([edges, t[(t >= edges[0]) & (t < edges[-1])]]))"):
        "a change at the first edge adds a point the edges already hold, and np.unique drops it",
    ("prorsa/control/forecast_stats.py", "self._sorted = s, np.append(np.cumsum(s[::-1])[::-1], 1.0)"):
        _TRAILING_SUM,
    ("prorsa/control/forecast_stats.py", "return np.array([x]), np.array([x, -1.0])"):
        _TRAILING_SUM,
    ("prorsa/control/forecast_stats.py",
     "self.end_from = np.zeros( 3)  # ends reported straight after [the decode, a tool phase]"):
        "only [0] and [1] are counted; a third entry stays 0 and adds nothing to the sum",
    ("prorsa/control/forecast_stats.py",
     "at = np.where(i >= 0, level[np.maximum(i, 0)] if len(level) else 1, self._level)"):
        "with no change recorded every index is -1, so np.where takes the level, never this value",
    ("prorsa/rollout/engine_pools.py", "@dataclass(frozen=False)"):
        "nothing sets a Route's fields (dataclasses.replace makes another) or hashes one: routes are "
        "handed to the legs and back, never kept as keys",
    ("prorsa/rollout/engine_pools.py",
     "kv: int = field(default=0, compare=True)  # KV tokens the cost rule counts on the decode engine"):
        "nothing compares two Routes or hashes one, so what their equality counts is never asked",
    ("prorsa/rollout/engine_pools.py",
     "kv: int = field(default= -1, compare=False)  # KV tokens the cost rule counts on the decode engine"):
        "a Route keeps the default only where the cost rule is off (_prefilled_by books its KV otherwise), "
        "and then nothing reads the KV books finished() takes it from",
    ("prorsa/rollout/stickiness.py", "if kept is None or kept[0] is eligible:"): _FILTER_AGAIN,
    ("prorsa/rollout/stickiness.py", "if kept is None or kept[ 1] is not eligible:"): _FILTER_AGAIN,
    ("prorsa/rollout/stickiness.py", "if kept is None or kept[ -1] is not eligible:"): _FILTER_AGAIN,
    ("prorsa/rollout/engine_choice.py", "if sticky and self.load[prev] <= self.overload - max(self._floor, 1):"):
        _STRICTER_SHORTCUT,
    ("prorsa/rollout/engine_choice.py", "if sticky and self.load[prev] <= self.overload * max(self._floor, 0):"):
        _STRICTER_SHORTCUT,
    ("prorsa/rollout/engine_choice.py", "if sticky and self.load[prev] < self.overload * max(self._floor, 1):"):
        _STRICTER_SHORTCUT,
    ("prorsa/rollout/cost_rule.py",
     "self._prices = engine_prices if self.move_cost is not None or engine_prices else None"):
        "the engines' own prices are read only where the cost rule is on (move_cost set), and there both "
        "keep engine_prices, or an empty dict of them, which prices every engine by move_cost as None does",
    ("prorsa/rollout/cost_rule.py", "self._backlog = {e: -1.0 for e in self.roles}"):
        "every read of a backlog goes through backlog(), which floors it at 0 first: a start below 0 reads as 0",
    ("prorsa/rollout/migration.py", 'own_kv = route.kv if leg == "decode" else -1'):
        "a prefill leg's wait is its backlog alone (wait_s reads no KV for it), so what is taken off the KV "
        "there is never read",
    ("prorsa/control/prior_check.py", "trajectories_ended: int = -1"):
        "a default read only where nothing is running (contradiction's Censored()), where the turns bound "
        "needs PRIOR_SAMPLES trajectories: -1 ended is under it as 0 is; the policy gives every field",
    ("prorsa/control/opening.py", "decode_tokens=0.0, tool_s= -1.0, turns=0.0)"):
        "the hint is held only to the prompts in hand (opening_contradiction): its tool time is compared "
        "only with tool calls seen, and the opening has seen none",
}


def enumerate_mutants(modules: tuple[str, ...]) -> list:
    """Every mutation cosmic-ray's OPERATORS make in `modules`, in a fixed order (module, operator,
    occurrence)."""
    import cosmic_ray.plugins
    from cosmic_ray.ast import ast_nodes, get_ast_from_path
    from cosmic_ray.ast.ast_query import ASTQuery
    from cosmic_ray.work_item import MutationSpec

    specs = []
    for module in modules:
        tree = get_ast_from_path(REPO / module)
        for name in OPERATORS:
            operator = cosmic_ray.plugins.get_operator(name)()
            positions = [(node, start, end) for node in ast_nodes(tree)
                         for start, end in operator.mutation_positions(node)]
            for occurrence, (node, start, end) in enumerate(positions):
                specs.append(MutationSpec(module_path=module, operator_name=name, occurrence=occurrence,
                                          start_pos=start, end_pos=end,
                                          definition_name=ASTQuery(node).get_definition_name()))
    return specs


def draw(specs: list, n: int, seed: int, modules: tuple[str, ...] = MODULES) -> list:
    """`n` of `specs`, an equal share from each module (a small module's score rests on as many
    mutants as a large one's; what a module cannot fill goes to the others), each share drawn by a
    generator seeded per module, so one module's source changing redraws only its share."""
    by_module: dict[str, list] = {}
    for s in specs:
        by_module.setdefault(str(s.module_path), []).append(s)
    share = dict.fromkeys(by_module, 0)
    for _ in range(min(n, len(specs))):  # one at a time, to the module with the fewest drawn yet
        m = min((m for m in by_module if share[m] < len(by_module[m])), key=lambda m: (share[m], modules.index(m)))
        share[m] += 1
    out = []
    for m, v in by_module.items():
        picked = random.Random(f"{seed}:{m}").sample(range(len(v)), share[m])
        out += [v[i] for i in sorted(picked)]
    return out


def changed_line(diff: str) -> tuple[int, str, str]:
    """The first changed line of a unified diff: (line number, before, after), stripped."""
    line, before, after = 0, "", ""
    for d in diff.splitlines():
        if d.startswith("@@"):
            line = int(d.split()[1].split(",")[0].lstrip("-"))
        elif d.startswith("-") and not d.startswith("---") and not before:
            before = d[1:].strip()
        elif d.startswith("+") and not d.startswith("+++") and not after:
            after = d[1:].strip()
        elif d.startswith(" ") and not before:
            line += 1
    return line, before, after


def short(before: str, after: str, context: int = 24) -> str:
    """`before` -> `after`, cut to the part that differs with a little context either side."""
    i = 0
    while i < min(len(before), len(after)) and before[i] == after[i]:
        i += 1
    j = 0
    while j < min(len(before), len(after)) - i and before[-1 - j] == after[-1 - j]:
        j += 1
    lo = max(0, i - context)

    def cut(s: str) -> str:
        hi = min(len(s), len(s) - j + context)
        return ("..." if lo else "") + s[lo:hi] + ("..." if hi < len(s) else "")

    return f"`{cut(before)}` -> `{cut(after)}`"


def run_tests(command: str, timeout: float) -> tuple[str, float]:
    """-> ("killed" | "survived" | "timeout", seconds)."""
    from cosmic_ray.testing import run_tests as cr_run_tests
    from cosmic_ray.work_item import TestOutcome

    t0 = time.perf_counter()
    outcome, output = cr_run_tests(command, timeout)
    took = time.perf_counter() - t0
    if outcome is TestOutcome.KILLED:
        return ("timeout" if output == "timeout" else "killed"), took
    return ("survived" if outcome is TestOutcome.SURVIVED else "incompetent"), took


def digest(modules: tuple[str, ...]) -> dict[str, str]:
    return {m: hashlib.sha256((REPO / m).read_bytes()).hexdigest() for m in modules}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def score(counts: Counter, equivalent: int = 0) -> float | None:
    tested = counts["killed"] + counts["timeout"] + counts["survived"] - equivalent
    return round((counts["killed"] + counts["timeout"]) / tested, 4) if tested > 0 else None


def summary(rows: list[dict], modules: tuple[str, ...]) -> dict:
    out = {}
    for m in (*modules, "total"):
        mine = [r for r in rows if m == "total" or r["file"] == m]
        counts = Counter(r["outcome"] for r in mine)
        eq = sum(1 for r in mine if r["outcome"] == "survived" and r.get("equivalent"))
        out[m] = {"mutants": len(mine), **{k: counts[k] for k in ("killed", "timeout", "survived", "incompetent")},
                  "equivalent": eq, "score": score(counts), "score_without_equivalent": score(counts, eq)}
    return out


def judged(row: dict) -> dict:
    """`row` with its survivor's EQUIVALENT reason, if it has one."""
    row.pop("equivalent", None)
    if row["outcome"] == "survived" and (reason := EQUIVALENT.get((row["file"], row["mutated"]))):
        row["equivalent"] = reason
    return row


def rescore(path: Path) -> None:
    """Judge a results file's survivors again by EQUIVALENT as it is now (a mutant's equivalence
    does not depend on the tests, so a run before new tests is judged as the run after them)."""
    doc = json.loads(path.read_text())
    mods = tuple(m for m in doc["modules"] if m != "total")
    missing = [r for r in doc["mutants"] if "mutated" not in r]
    if missing:  # written before rows kept their mutated line: make each mutant again to read it
        import cosmic_ray.plugins
        from cosmic_ray.mutating import mutate_code

        specs = {(str(s.module_path), s.operator_name, s.occurrence): s for s in enumerate_mutants(mods)}
        for r in missing:
            spec = specs[r["file"], "core/" + r["operator"], r["occurrence"]]
            source = (REPO / r["file"]).read_text()
            mutant = mutate_code(source, cosmic_ray.plugins.get_operator(spec.operator_name)(), spec.occurrence)
            r["mutated"] = next(b.strip() for a, b in zip(source.splitlines(), mutant.splitlines()) if a != b)
    doc["modules"] = summary([judged(r) for r in doc["mutants"]], mods)
    doc["survivors"] = [r for r in doc["mutants"] if r["outcome"] == "survived"]
    doc["judged_by"] = f"python benchmarks/mutation.py --rescore {path}"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{path}: {sum(1 for r in doc['survivors'] if r.get('equivalent'))} of {len(doc['survivors'])} "
          f"survivors judged equivalent")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mutants", type=int, default=200, help="how many to draw (all of them if fewer)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds a mutant's tests may run (default: 4x the unmutated run, at least 30)")
    ap.add_argument("--modules", default=",".join(MODULES),
                    help="comma-separated modules to mutate (default: the twelve that decide roles and routes)")
    ap.add_argument("--db", default=None, help="cosmic-ray's sqlite work database (default: a temporary file)")
    ap.add_argument("--out", default="benchmarks/results/mutation.json")
    ap.add_argument("--rescore", type=Path, metavar="FILE",
                    help="run nothing: judge FILE's survivors again by EQUIVALENT and rewrite its scores")
    args = ap.parse_args()
    if args.rescore:
        return rescore(args.rescore)
    modules = tuple(args.modules.split(","))
    missing = [m for m in modules if not (REPO / m).is_file()]
    if missing:
        sys.exit(f"error: --modules: no such file {', '.join(missing)}")

    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkItem
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console()
    os.chdir(REPO)
    # the tests import the mutated tree, whatever else the environment has installed as prorsa
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    command = shlex.join([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                         "-m", "not slow", *TESTS])
    t0 = time.perf_counter()
    pristine = {m: (REPO / m).read_text() for m in modules}
    before = digest(modules)
    dirty = git("status", "--porcelain", "--", *modules, *TESTS)
    if dirty:
        console.print(f"[yellow]uncommitted changes in the modules or their tests:[/]\n{dirty}")

    outcome, baseline_s = run_tests(command, 600)
    if outcome != "survived":
        sys.exit(f"the unmutated code fails its tests ({outcome}): {command}")
    timeout = args.timeout or max(30.0, 4 * baseline_s)
    specs = enumerate_mutants(modules)
    sample = draw(specs, args.mutants, args.seed, modules)
    console.print(f"{len(specs)} mutants in {len(modules)} modules, {len(sample)} drawn (seed {args.seed}); "
                  f"unmutated tests {baseline_s:.1f} s, timeout {timeout:.0f} s")

    db_path = Path(args.db or tempfile.mkdtemp(prefix="mutation-"))
    db_path = db_path / "mutation.sqlite" if db_path.is_dir() else db_path
    db_path.unlink(missing_ok=True)
    rows: list[dict] = []
    try:
        with use_db(str(db_path), WorkDB.Mode.create) as db:
            items = [WorkItem.single(job_id=f"{i:04d}", mutation=s) for i, s in enumerate(sample)]
            db.add_work_items(items)
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("{task.fields[tally]}"))
            with Progress(*columns, console=console) as progress:
                task = progress.add_task("mutants", total=len(items), tally="")
                tally: Counter = Counter()
                for item in items:
                    spec = item.mutations[0]
                    progress.update(task, description=f"{Path(spec.module_path).name}:{spec.start_pos[0]}")
                    t1 = time.perf_counter()
                    result = mutate_and_test(item.mutations, command, timeout)
                    db.set_result(item.job_id, result)
                    if digest(modules) != before:
                        raise RuntimeError(f"{spec.module_path} was not restored after job {item.job_id}")
                    if result.test_outcome is None:  # no mutation could be made: nothing was tested
                        state = "incompetent"
                    elif result.test_outcome.value == "killed":
                        state = "timeout" if result.output == "timeout" else "killed"
                    else:
                        state = result.test_outcome.value
                    line, old, new = changed_line(result.diff or "")
                    rows.append(judged({
                        "job": item.job_id, "file": str(spec.module_path), "line": line or spec.start_pos[0],
                        "operator": spec.operator_name.removeprefix("core/"), "occurrence": spec.occurrence,
                        "in": spec.definition_name, "description": short(old, new), "mutated": new,
                        "outcome": state, "seconds": round(time.perf_counter() - t1, 2)}))
                    tally[state] += 1
                    progress.update(task, advance=1, tally=" ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    finally:
        for m, text in pristine.items():
            if (REPO / m).read_text() != text:
                (REPO / m).write_text(text)

    scores = summary(rows, modules)
    table = Table("module", "mutants", "killed", "timeout", "survived", "equivalent", "score", "w/o equivalent")
    for m, s in scores.items():
        table.add_row(Path(m).name, *(str(s[k]) for k in ("mutants", "killed", "timeout", "survived", "equivalent")),
                      *(f"{s[k]:.3f}" if s[k] is not None else "-" for k in ("score", "score_without_equivalent")))
    console.print(table)
    for r in rows:
        if r["outcome"] == "survived":
            console.print(f"{r['file']}:{r['line']} {r['operator']} {r['description']}"
                          + (f"  (equivalent: {r['equivalent']})" if r.get("equivalent") else ""),
                          markup=False, highlight=False)

    elapsed = time.perf_counter() - t0
    cmd = " ".join(["python benchmarks/mutation.py", *sys.argv[1:]])
    print(f"command: {cmd}  ({elapsed:.0f} s); work database {db_path}")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "command": cmd.strip(), "commit": git("rev-parse", "--short", "HEAD") + ("+" if dirty else ""),
        "seed": args.seed, "drawn": len(sample), "population": len(specs),
        "population_by_module": dict(Counter(str(s.module_path) for s in specs)),
        "operators": [o.removeprefix("core/") for o in OPERATORS], "test_command": shlex.join(
            ["python", *shlex.split(command)[1:]]),
        "baseline_s": round(baseline_s, 1), "timeout_s": round(timeout, 1), "elapsed_s": round(elapsed),
        "modules": scores, "survivors": [r for r in rows if r["outcome"] == "survived"], "mutants": rows,
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
