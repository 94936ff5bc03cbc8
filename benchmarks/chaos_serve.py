"""chaos.py's faults under `prorsa serve`, with OpenAI clients holding conversations with it.

`prorsa serve` on chaos.py's engines (worker processes, runtime.processes), --clients clients each
holding multi-turn conversations (--turns user turns, then POST /v1/sessions/{id}/end) over httpx
for --duration seconds, while chaos.py's Injector kills engine workers, stalls them, kills tool
workers and (with --engine vllm) SIGKILLs vLLM servers. A client retries a request that got a 5xx
or no answer at all (the connection dropped or timed out), up to --retries times, with the same
messages; then the server gets a Ctrl-C (SIGINT to its process group), as a user stops it.

Reported: each client-visible outcome (200, every 5xx with its OpenAI error type and code,
transport errors), the retries, the exit code (2: a stopped serve), and that every turn a
client got a 200 for is in trajectories.parquet exactly once: the response's id names its
trajectory and turn (chatcmpl-<trajectory>-<turn>); lost counts answered turns with no saved
turn, duplicated rows beyond one per trajectory and turns saved twice within one. Turns saved
that no client saw (answered after its client gave up, or cut by the stop) are counted apart.
Serve has no --resume, so the driver is not killed. Serve starts no tool host (a client runs its
own tools), so a `tool` fault finds no process to kill and is skipped, as any whose target has none.

    .venv/bin/python benchmarks/chaos_serve.py [--clients 8] [--duration 60] [--rate 6]
        [--kinds kill,stall,tool] [--engine vllm --kinds server,tool]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos import ENGINES, REPO, Injector, pipeline, report_head, scrub  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "chaos-serve.json"


def serve_pipeline(args) -> dict:
    """chaos.py's engines and runtime; the clients decide what runs, so no workload beyond a family."""
    p = pipeline(argparse.Namespace(**vars(args), partial=False, trajectories=1, concurrency=1))
    p["name"] = "chaos-serve"
    p["workload"] = {"family": "swe"}
    p.pop("environment", None)
    return p


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Clients:
    """--clients conversations at a time until `stop` is set; every outcome and answered turn recorded."""

    def __init__(self, args, base: str) -> None:
        self.args, self.base = args, base
        self.outcomes: Counter[str] = Counter()
        self.answered: list[tuple[str, int]] = []  # (trajectory, turn) of every 200
        self.retries = 0
        self.gave_up = 0  # requests that ran out of retries
        self.conversations = 0  # ended by their client
        self.end_refused: list[dict] = []  # a session whose /end found no open conversation, and its turns
        self.by_session: dict[str, list[tuple[str, int]]] = {}
        self.first_answer = threading.Event()
        self.stop = asyncio.Event()

    async def run(self) -> None:
        timeout = httpx.Timeout(self.args.request_timeout, connect=10.0)
        async with httpx.AsyncClient(base_url=self.base, timeout=timeout) as http:
            await asyncio.gather(*(self._client(http, c) for c in range(self.args.clients)))

    async def _client(self, http: httpx.AsyncClient, c: int) -> None:
        k = 0
        while not self.stop.is_set():
            session, k = f"client{c}-conv{k}", k + 1
            messages: list[dict] = []
            for t in range(self.args.turns):
                messages.append({"role": "user", "content": f"client {c} turn {t}: say something new"})
                reply = await self._ask(http, session, messages)
                if reply is None:
                    break
                messages.append({"role": "assistant", "content": reply})
            else:
                r = await self._send(http.post(f"/v1/sessions/{session}/end", json={"reward": 1.0}))
                self.conversations += r is not None and r.status_code == 200
                if r is not None and r.status_code == 404:
                    self.end_refused.append({"session": session, "answered": self.by_session.get(session, [])})

    async def _ask(self, http: httpx.AsyncClient, session: str, messages: list[dict]) -> str | None:
        body = {"model": "tiny", "messages": messages, "max_tokens": self.args.max_tokens, "user": session}
        for attempt in range(self.args.retries + 1):
            if self.stop.is_set():
                return None
            if attempt:
                self.retries += 1
                await asyncio.sleep(1.0)
            r = await self._send(http.post("/v1/chat/completions", json=body))
            if r is None:
                continue
            if r.status_code == 200:
                traj, turn = r.json()["id"].removeprefix("chatcmpl-").rsplit("-", 1)
                self.answered.append((traj, int(turn)))
                self.by_session.setdefault(session, []).append((traj, int(turn)))
                self.first_answer.set()
                return r.json()["choices"][0]["message"]["content"] or ""
            if r.status_code < 500:  # a request of ours it refuses: retrying would not help
                return None
        self.gave_up += 1
        return None

    def _when(self) -> str:
        # what a stopping server answers (a 503, an /end after it closed the conversation) is told apart
        return "after Ctrl-C: " if self.stop.is_set() else ""

    async def _send(self, request) -> httpx.Response | None:
        try:
            r = await request
        except httpx.HTTPError as e:
            self.outcomes[f"{self._when()}no answer ({type(e).__name__})"] += 1
            return None
        during = self._when()
        if r.status_code == 200:
            self.outcomes[f"{during}200"] += 1
        else:
            try:
                err = r.json()["error"]
                self.outcomes[f"{during}{r.status_code} {err.get('type')}/{err.get('code')}"] += 1
            except (ValueError, KeyError, TypeError):
                self.outcomes[f"{during}{r.status_code} (no OpenAI error)"] += 1
        return r


def saved_turns(rows: list[dict], answered: list[tuple[str, int]]) -> dict:
    """Every answered turn in the run folder once (the module docstring's lost and duplicated)."""
    by_traj: dict[str, list[dict]] = {}
    for r in rows:
        by_traj.setdefault(r["traj_id"], []).append(r)
    saved = Counter((r["traj_id"], t["turn"]) for r in rows for t in r["turns"])
    ids = [r["traj_id"] for r in rows]
    answered_set = set(answered)
    return {"turns_answered": len(answered), "turns_saved": sum(saved.values()), "rows": len(rows),
            "lost": sum(saved[a] == 0 for a in answered_set),
            "duplicated": len(ids) - len(set(ids)) + sum(n - 1 for n in saved.values() if n > 1),
            "answered_twice": len(answered) - len(answered_set),
            "saved_unanswered": sum(1 for key in saved if key not in answered_set),
            "statuses": dict(Counter(r["status"] for r in rows))}


def _raised(traceback: str) -> str:
    """A traceback's last frame and the exception it ends with."""
    lines = traceback.splitlines()[1:]
    end = next((i for i, line in enumerate(lines) if line and not line.startswith(" ")), len(lines))
    frames = [line.strip() for line in lines[:end] if line.strip().startswith("File ")]
    return " | ".join([*frames[-1:], *lines[end:end + 1]])


def run(args, workdir: Path) -> dict:
    f = workdir / "serve.yaml"
    f.write_text(yaml.safe_dump(serve_pipeline(args)))
    out, port = workdir / "run", _port()
    proc = subprocess.Popen([sys.executable, "-m", "prorsa.cli", "serve", str(f), "--port", str(port),
                             "--output", str(out), "--max-tokens", str(args.max_tokens)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            start_new_session=True)
    lines: list[str] = []
    t0 = time.monotonic()
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.split("] ", 1)[-1].startswith("serving "):  # after the console's clock
                break
        if proc.poll() is not None:
            raise SystemExit("error: prorsa serve ended before serving:\n" + "".join(lines[-30:]))
        up_s = time.monotonic() - t0
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        clients = Clients(args, f"http://127.0.0.1:{port}")
        injector = Injector(out, [f"engine-{i}" for i in range(ENGINES[args.engine])], args.rate, args.stall_s,
                            args.seed, proc, args.kinds, serve_pipeline(args)["runtime"]["tool_workers"],
                            ready=clients.first_answer.is_set)
        injector.start()

        async def soak() -> None:
            task = asyncio.create_task(clients.run())
            await asyncio.sleep(args.duration)
            clients.stop.set()  # no new requests; those in flight get their answer or the stop's 503
            injector.halt.set()
            os.killpg(proc.pid, signal.SIGINT)
            await task

        asyncio.run(soak())
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    injector.join(timeout=5)
    text = "".join(lines)
    rows = pq.read_table(out / "trajectories.parquet").to_pylist() if (out / "trajectories.parquet").exists() else []
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return {"exit_code": code, "start_s": round(up_s, 2), "wall_s": round(time.monotonic() - t0, 2),
            "tracebacks": text.count("Traceback"),
            "traceback_ends": [scrub(_raised(t), workdir) for t in text.split("Traceback (most recent call last):")[1:]],
            # the run folder is a temporary one: named as the command line would
            "errors": [ln.replace(str(out), "RUN_DIR") for ln in text.splitlines() if ln.startswith("error: ")],
            "outcomes": dict(clients.outcomes), "retries": clients.retries, "gave_up": clients.gave_up,
            "conversations_ended": clients.conversations, "end_refused": clients.end_refused,
            **saved_turns(rows, clients.answered),
            "turns_retried": summary.get("turns_retried"), "legs_rescued": summary.get("legs_rescued"),
            "faults": injector.faults, **({"output_tail": scrub(text[-2000:], workdir)} if code != 2 else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=6.0, help="faults per minute")
    ap.add_argument("--kinds", type=lambda v: v.split(","), default=["kill", "stall", "tool"],
                    help="comma-separated fault kinds drawn from: kill, stall, tool, server (vLLM only)")
    ap.add_argument("--engine", choices=sorted(ENGINES), default="emulated")
    ap.add_argument("--stall-s", type=float, default=3.0, help="how long a stalled worker stays stopped")
    ap.add_argument("--clients", type=int, default=8, help="conversations at a time")
    ap.add_argument("--turns", type=int, default=4, help="user turns a conversation")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of client traffic before the Ctrl-C")
    ap.add_argument("--max-tokens", type=int, default=64, help="a reply's cap")
    ap.add_argument("--retries", type=int, default=3, help="a client's retries of a 5xx or unanswered request")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="a client's wait for one answer (s)")
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args()
    if "server" in args.kinds and args.engine != "vllm":
        ap.error("--kinds server needs --engine vllm")
    if min(args.clients, args.turns) < 1 or args.duration <= 0:
        ap.error("--clients, --turns and --duration must be positive")
    with tempfile.TemporaryDirectory(prefix="prorsa-chaos-serve-") as tmp:
        result = run(args, Path(tmp))
    faults = result["faults"]
    report = {
        **report_head("chaos_serve.py", args, faults, ended_well=result["exit_code"] == 2),  # 2: a stopped serve
        "turns_lost": result["lost"], "turns_duplicated": result["duplicated"],
        "run": result,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"faults injected {report['faults_injected']} {report['faults_by_kind']}, survived "
          f"{report['faults_survived']}; exit {result['exit_code']}; client outcomes {result['outcomes']}, "
          f"retries {result['retries']}, gave up {result['gave_up']}; turns answered {result['turns_answered']}, "
          f"lost {result['lost']}, duplicated {result['duplicated']} ({result['turns_saved']} saved in "
          f"{result['rows']} conversations, {result['saved_unanswered']} no client saw)")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
