"""A longer live run with random faults, against the same run without them.

`prorsa run` on emulated engines (time-scaled) whose workers are processes (runtime.processes),
so a fault is a real one: `kill` SIGKILLs an engine worker's process (its Nanny starts a new
one, the engine comes back empty), `stall` SIGSTOPs one for --stall-s seconds and then lets it
go on (a hung worker, a network that stops answering), `tool` SIGKILLs a tool worker's process
(the search tool's calls run there; its Nanny starts a new one), and with --engine vllm `server`
SIGKILLs a vLLM server's whole process group under a live engine worker (the worker restarts the
server). Faults arrive as a Poisson process at --rate per minute from each session's first saved
trajectory on (with --partial: its first step's batch, as a step saves its fates when it ends),
each of a kind drawn from --kinds on a target drawn at random, all from --seed.
The same pipeline runs first without faults, as the baseline.

With --kill-driver F the driver itself (and every process it started) is SIGKILLed once, F of
the clean run's wall time in (with --partial: once the journal holds F of the steps' batches),
and `prorsa run --resume` finishes the run, under faults as well.

Reported: faults injected by kind, faults survived (the engine served again afterwards: a new
process for a kill, a resumed one for a stall, and the run finished), trajectories lost (expected
and not completed in trajectories.parquet), duplicated (rows beyond one per id), failed, turns
retried and legs re-bound, and the overhead of the faulty run over the clean one: makespan (one
session), or wall time from the first start to the end (with a driver kill: every session).

    .venv/bin/python benchmarks/chaos.py [--rate 6] [--trajectories 96] [--kill-driver 0.5]
        [--kinds kill,stall,tool] [--engine vllm --kinds server,tool]

With `tool` among the kinds the workload is search with real search-tool calls on the tool
workers (else SWE with timed tool waits).

With --partial the workload is synchronous GRPO steps (--prompts groups of --group-size a step,
as many steps as --trajectories asks for) under a `partial_rollout:` section as a user would set
it (over_sample 0.5, carry, overlap), so faults and the driver kill land in partial steps. Every
trajectory a step started must be in trajectories.parquet exactly once: lost counts those started
(the journal's last driver state counts each step's groups) with no row, and trained members whose
group is not whole in its batch; duplicated, rows beyond one per id. Each step's batch must be
`prompts` whole groups of completed members (steps_trained). Cancelled and stale rows are the
partial driver's drops (never trained), counted as dropped, not lost; failed, any other status.

`chaos_serve.py` injects the same faults under `prorsa serve` with clients talking to it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "chaos.json"


ENGINES = {"emulated": 4, "vllm": 3}
SERVER = "prorsa.engine.vllm._launch"  # in a vLLM server's command line


def pipeline(args) -> dict:
    engines = {"backend": "emulated", "count": 4, "slots": 16, "time_scale": args.time_scale}
    if args.engine == "vllm":
        engines = {"backend": "vllm", "count": 3, "slots": 8, "vllm": {"model": "tiny", "max_model_len": 4096}}
    p = {
        "name": "chaos", "seed": args.seed, "policy": "static:1:2" if args.engine == "vllm" else "static:2:2",
        "engines": engines,
        "workload": {"family": "search" if "tool" in args.kinds else "swe", "mode": "async", "concurrency": args.concurrency,
                     "trajectories": args.trajectories, "max_turns": 8, "token_scale": 0.5,
                     "tool_time_scale": args.time_scale},
        "runtime": {"processes": True, "turn_retries": 3, "metrics_interval_s": 0.5, "tool_workers": 2,
                    "dashboard_address": None, "output_batch": 8, "output_flush_s": 1.0},
    }  # fmt: skip
    if "tool" in args.kinds:  # real tool calls on the tool workers, so killing one is a fault
        p["environment"] = {"dataset": "search", "tasks": args.trajectories, "tools": ["search"],
                            "reward": "contains_answer", "max_observation_tokens": 512}
    if args.partial:
        w = p["workload"]
        del w["trajectories"], w["concurrency"]
        w |= {"mode": "sync", "prompts": args.prompts, "group_size": args.group_size, "steps": steps_of(args)}
        p["partial_rollout"] = {"over_sample": 0.5, "carry": True, "overlap": True}
    return p


def steps_of(args) -> int:
    return max(1, -(-args.trajectories // (args.prompts * args.group_size)))


def expected_ids(args) -> set[str]:
    return {f"a{i}" for i in range(args.trajectories)}


def count_plain(args, rows: list[dict], run_dir: Path) -> dict:
    """Every expected trajectory completed once."""
    ids = [r["traj_id"] for r in rows]
    completed = {r["traj_id"] for r in rows if r["status"] == "completed"}
    return {"trajectories_expected": args.trajectories, "rows": len(rows),
            "lost": len(expected_ids(args) - completed), "duplicated": len(ids) - len(set(ids)),
            "failed": sum(r["status"] != "completed" for r in rows)}


def count_partial(args, rows: list[dict], run_dir: Path) -> dict:
    """What the partial steps trained (module docstring): each step `prompts` whole groups once."""
    ids = [r["traj_id"] for r in rows]
    trained: dict[int, dict[str, set[str]]] = {}
    for r in rows:
        if r["trained_step"] is not None and r["status"] == "completed":
            group = r["traj_id"].rsplit("-g", 1)[0]
            trained.setdefault(r["trained_step"], {}).setdefault(group, set()).add(r["traj_id"])
    steps = steps_of(args)
    whole = [sum(len(m) == args.group_size for m in trained.get(s, {}).values()) for s in range(steps)]
    # a trained member whose group is not whole: a member of it is missing, and it is not a sample either
    orphans = sum(len(m) for g in trained.values() for m in g.values() if len(m) != args.group_size)
    state = _manifest(run_dir).get("driver_state") or {}
    started = sum(state.get("started", {}).values()) * args.group_size
    unreported = max(0, started - len(set(ids)))
    return {"trajectories_expected": steps * args.prompts * args.group_size, "rows": len(rows),
            "trained": sum(min(w, args.prompts) for w in whole) * args.group_size,
            "lost": unreported + orphans, "unreported": unreported, "started": started,
            "duplicated": len(ids) - len(set(ids)),
            "dropped": sum(r["status"] in ("cancelled", "stale") for r in rows),
            "failed": sum(r["status"] not in ("completed", "cancelled", "stale") for r in rows),
            "steps_trained": sum(w == args.prompts for w in whole)}


def _manifest(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def _committed(run_dir: Path) -> int:
    return _manifest(run_dir).get("trajectories", 0)


def _pid(run_dir: Path, target: str) -> int | None:
    """engine-<i> or tools-<j>: the worker process hosting it now."""
    where = "tools" if target.startswith("tools") else "engines"
    try:
        return int((run_dir / where / f"{target}.pid").read_text())
    except (OSError, ValueError):
        return None


def _server(worker_pid: int) -> int | None:
    """The vLLM server started by an engine worker process, if one is up."""
    try:
        for child in psutil.Process(worker_pid).children(recursive=True):
            if SERVER in " ".join(child.cmdline()):
                return child.pid
    except psutil.Error:
        pass
    return None


class Injector(threading.Thread):
    """Faults at Poisson times while the run goes; each records whether its engine came back."""

    def __init__(self, run_dir: Path, engines: list[str], rate_per_min: float, stall_s: float, seed: int,
                 proc: subprocess.Popen, kinds: list[str], tool_workers: int,
                 ready: Callable[[], bool] | None = None) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.engines, self.proc, self.kinds = run_dir, engines, proc, kinds
        saved = _committed(run_dir)  # a resumed session starts with some
        # by default faults begin with this session's first saved trajectory: engines up, rollout going
        self.ready = ready or (lambda: _committed(run_dir) != saved)
        self.halt = threading.Event()  # no more faults (a run being stopped on purpose)
        self.tools = [f"tools-{j}" for j in range(tool_workers)]
        self.rate, self.stall_s = rate_per_min / 60.0, stall_s
        self.rng = random.Random(seed)
        self.faults: list[dict] = []

    def run(self) -> None:
        while not self.ready() and self.proc.poll() is None:
            time.sleep(0.1)
        t0 = time.monotonic()
        while self.proc.poll() is None:
            time.sleep(self.rng.expovariate(self.rate))
            if self.proc.poll() is not None or self.halt.is_set():
                return
            kind = self.rng.choice(self.kinds)
            target = self.rng.choice(self.tools if kind == "tool" else self.engines)
            pid = _pid(self.run_dir, target)
            if kind == "server" and pid is not None:
                pid = _server(pid)
            if pid is None:
                continue
            fault = {"t_s": round(time.monotonic() - t0, 2), "kind": kind, "target": target, "survived": False}
            try:
                if kind in ("kill", "tool"):
                    os.kill(pid, signal.SIGKILL)
                    fault["survived"] = self._back(target, pid)
                elif kind == "server":
                    os.killpg(pid, signal.SIGKILL)  # the server leads its own group: its engine core too
                    fault["survived"] = self._server_back(target, pid)
                else:
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(self.stall_s)
                    os.kill(pid, signal.SIGCONT)
                    fault["survived"] = True
            except ProcessLookupError:  # it was being restarted already: not a fault we made
                continue
            self.faults.append(fault)

    def _back(self, target: str, old_pid: int, timeout_s: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = _pid(self.run_dir, target)
            if pid not in (None, old_pid):
                return True
            time.sleep(0.1)
        return False

    def _server_back(self, engine: str, old_pid: int, timeout_s: float = 300.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            worker = _pid(self.run_dir, engine)
            server = _server(worker) if worker is not None else None
            if server not in (None, old_pid):
                return True
            time.sleep(0.5)
        return False


def _session(cmd: list[str], out: Path, args, faults: bool, seed: int, kill_driver_at: float | None):
    """One `prorsa run` process (a fresh run or a --resume); engine faults while it goes, and a
    SIGKILL of its whole process group (driver, scheduler, workers) at kill_driver_at seconds."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            start_new_session=True)
    while not out.exists() or not any(out.iterdir()):
        time.sleep(0.1)
    (run_dir,) = out.iterdir()
    injector = None
    if faults:
        injector = Injector(run_dir, [f"engine-{i}" for i in range(ENGINES[args.engine])], args.rate, args.stall_s,
                            seed, proc, args.kinds, pipeline(args)["runtime"]["tool_workers"])
        injector.start()
    deadline = t0 + (kill_driver_at if kill_driver_at is not None else args.timeout)
    # a partial rollout's driver dies once the journal holds that many steps' batches: mid-rollout,
    # with carried groups in flight, however long the cluster took to start
    kill_step = (None if kill_driver_at is None or not args.partial
                 else max(1, min(steps_of(args) - 1, round(args.kill_driver * steps_of(args)))))
    killed = False
    while True:
        try:
            output, _ = proc.communicate(timeout=0.5)  # a retried communicate loses no output
            break
        except subprocess.TimeoutExpired:
            step = (_manifest(run_dir).get("driver_state") or {}).get("step", 0)
            at_step = kill_step is not None and step >= kill_step
            if time.monotonic() >= deadline or at_step:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
                killed = kill_driver_at is not None and (kill_step is None or at_step)
                break
    if injector is not None:
        injector.join(timeout=5)
    return run_dir, proc.returncode, output, time.monotonic() - t0, injector.faults if injector else [], killed


def one_run(args, workdir: Path, faults: bool, kill_driver_at: float | None = None) -> dict:
    label = "faults" if faults else "clean"
    f = workdir / f"{label}.yaml"
    f.write_text(yaml.safe_dump(pipeline(args)))
    out = workdir / label
    cmd = [sys.executable, "-m", "prorsa.cli", "run", str(f), f"output_dir={out}"]
    wall, makespan, all_faults, driver_kills, session = 0.0, 0.0, [], 0, 0
    while True:
        run_dir, code, output, took, injected, killed = _session(cmd, out, args, faults, args.seed + session,
                                                                 kill_driver_at)
        wall += took
        all_faults += injected
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
        if not killed:
            break
        driver_kills += 1
        kill_driver_at, session = None, session + 1  # one driver kill; the resumed session finishes
        for stale in [*(run_dir / "engines").glob("*.pid"), *(run_dir / "tools").glob("*.pid")]:
            stale.unlink()  # its workers died with it; signal only new ones
        cmd = [sys.executable, "-m", "prorsa.cli", "run", "--resume", str(run_dir)]
    makespan = summary.get("makespan_s")
    rows = pq.read_table(run_dir / "trajectories.parquet").to_pylist() if (run_dir / "trajectories.parquet").exists() else []
    result = {
        "exit_code": code, "wall_s": round(wall, 2), "makespan_s": makespan, "sessions": session + 1,
        "driver_kills": driver_kills, "trajectories_resumed": summary.get("trajectories_resumed"),
        **(count_partial if args.partial else count_plain)(args, rows, run_dir),
        "turns_retried": summary.get("turns_retried"), "legs_rescued": summary.get("legs_rescued"),
    }
    if faults:
        result["faults"] = all_faults
    if code != 0:
        result["output_tail"] = scrub(output[-2000:], workdir)
    return result


def scrub(text: str, workdir: Path) -> str:
    """Console text for a results file: the temporary run folder and this machine's paths left out."""
    text = text.replace(str(workdir), "WORKDIR")
    return re.sub(r"/(?:[\w.+-]+/)+(?=[\w.+-]+\.py\b)", "", text)  # a Python file's folders


def report_head(script: str, args, faults: list[dict], ended_well: bool) -> dict:
    """A results file's command, settings and faults (a fault counts as survived once the run ended well)."""
    return {
        "command": f"python benchmarks/{script} " + " ".join(sys.argv[1:]),
        "settings": vars(args) | {"output": str(args.output.relative_to(REPO)) if args.output.is_relative_to(REPO)
                                  else str(args.output)},
        "faults_injected": len(faults),
        "faults_by_kind": {k: sum(f["kind"] == k for f in faults) for k in args.kinds},
        "faults_survived": sum(f["survived"] for f in faults) if ended_well else 0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=6.0, help="faults per minute")
    ap.add_argument("--kinds", type=lambda v: v.split(","), default=["kill", "stall"],
                    help="comma-separated fault kinds drawn from: kill, stall, tool, server (vLLM only)")
    ap.add_argument("--engine", choices=sorted(ENGINES), default="emulated")
    ap.add_argument("--stall-s", type=float, default=3.0, help="how long a stalled worker stays stopped")
    ap.add_argument("--trajectories", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--kill-driver", type=float, metavar="FRACTION",
                    help="also SIGKILL the driver (and its workers) once, this far into the clean run's wall "
                         "time, and finish with prorsa run --resume")
    ap.add_argument("--partial", action="store_true",
                    help="sync GRPO steps under partial_rollout (over_sample 0.5, carry, overlap); "
                         "--trajectories is then what the steps train")
    ap.add_argument("--prompts", type=int, default=4, help="with --partial: groups a step trains")
    ap.add_argument("--group-size", type=int, default=4, help="with --partial: trajectories a group")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.partial and min(args.prompts, args.group_size) < 1:
        ap.error("--prompts and --group-size must be at least 1")
    if "server" in args.kinds and args.engine != "vllm":
        ap.error("--kinds server needs --engine vllm")
    with tempfile.TemporaryDirectory(prefix="prorsa-chaos-") as tmp:
        clean = one_run(args, Path(tmp), faults=False)
        # --partial kills at a step (_session), with a timeout as the only deadline
        kill_at = (None if args.kill_driver is None else args.timeout if args.partial
                   else args.kill_driver * clean["wall_s"])
        faulty = one_run(args, Path(tmp), faults=True, kill_driver_at=kill_at)
    faults = faulty.get("faults", [])
    if faulty["driver_kills"]:  # the killed session wrote no makespan: compare wall times
        faulty["makespan_s"] = None
    report = {
        **report_head("chaos.py", args, faults, ended_well=faulty["exit_code"] == 0),
        "trajectories_lost": faulty["lost"], "trajectories_duplicated": faulty["duplicated"],
        "trajectories_failed": faulty["failed"],
        **({"trajectories_dropped": faulty["dropped"], "trajectories_trained": faulty["trained"]}
           if args.partial else {}),
        "driver_kills": faulty["driver_kills"],
        "makespan_overhead": (round(faulty["makespan_s"] / clean["makespan_s"] - 1, 4)
                              if faulty["makespan_s"] and clean["makespan_s"] else None),
        "wall_overhead": round(faulty["wall_s"] / clean["wall_s"] - 1, 4),
        "faulty_run": faulty, "clean_run": clean,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    overhead = (f"makespan {faulty['makespan_s']} s vs {clean['makespan_s']} s clean "
                f"(overhead {report['makespan_overhead']:+.1%}); " if report["makespan_overhead"] is not None else "")
    print(f"faults injected {report['faults_injected']} {report['faults_by_kind']}, survived "
          f"{report['faults_survived']}; driver kills {faulty['driver_kills']} "
          f"(resumed {faulty['trajectories_resumed']} saved); trajectories lost {report['trajectories_lost']}, "
          f"duplicated {report['trajectories_duplicated']}, failed {report['trajectories_failed']} of "
          f"{args.trajectories}; turns retried {faulty['turns_retried']}, legs re-bound {faulty['legs_rescued']} "
          f"(last session); {overhead}wall {faulty['wall_s']} s vs {clean['wall_s']} s clean "
          f"(overhead {report['wall_overhead']:+.1%})")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
