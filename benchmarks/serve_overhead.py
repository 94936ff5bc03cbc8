"""The endpoint's overhead: one workload rolled out by `prorsa run` and through `prorsa serve` by an
OpenAI client, side by side on the same engines, policy and pipeline.

  run     `prorsa run PIPELINE`: the workload's synchronous steps, replayed (makespan from summary.json)
  serve   `prorsa serve PIPELINE` and a client replaying the same trajectories over /v1/completions:
          each turn's append as that many one-token pieces of text (a special token: one id each),
          its decode as max_tokens with ignore_eos (the replay's exact lengths), its tool latency
          as a sleep between requests; the steps one after another, each step's trajectories at
          once (makespan: the client's first request to its last answer)

The ratio serve / run is the endpoint's overhead on the makespan (HTTP, the chat format, one
request per turn instead of one coroutine per trajectory). The two alternate which goes first.

    .venv/bin/python benchmarks/serve_overhead.py [--pipeline pipelines/quickstart.yaml]
        [--engine emulated] [--repeats 3] [--out benchmarks/results/serve-overhead.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIECE = "<tool_response>"  # a special token of the tiny tokenizer: n of them are n ids


def run_makespan(pipeline: Path, engine: str, out: Path) -> float:
    subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), "--engine", engine, "--output", str(out),
                    "runtime.dashboard_address=null"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())["makespan_s"]


async def replay(url: str, specs_by_step: list[list]) -> float:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)

    async def one(spec) -> None:
        prompt = ""
        for turn in spec.turns:
            prompt += PIECE * turn.appended_tokens
            r = await client.completions.create(model="tiny", prompt=prompt, max_tokens=max(turn.decode_tokens, 1),
                                                user=spec.traj_id, extra_body={"ignore_eos": True})
            if turn.done:
                return
            prompt += r.choices[0].text
            await asyncio.sleep(turn.tool_latency_s)

    t0 = time.perf_counter()
    for specs in specs_by_step:
        await asyncio.gather(*(one(s) for s in specs))
    return time.perf_counter() - t0


def provenance(script: str) -> dict:
    """What a results file says of the run behind it: the command (as run from the repository), date,
    commit, machine."""
    return {"command": " ".join([f"python benchmarks/{script}", *sys.argv[1:]]), "date": dt.date.today().isoformat(),
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                     text=True).stdout.strip(),
            "machine": f"{platform.machine()}, {platform.system()}"}


@contextlib.contextmanager
def serving(pipeline: Path, engine: str, out: Path, stopped: list[int] | None = None):
    """`prorsa serve PIPELINE` on a free port while the block runs -> (its base URL, its process);
    then SIGINT, and its exit code appended to `stopped`."""
    proc = subprocess.Popen([sys.executable, "-m", "prorsa.cli", "serve", str(pipeline), "--engine", engine,
                             "--port", "0", "--output", str(out), "runtime.dashboard_address=null"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        said = []
        while (line := proc.stdout.readline()) and not line.split("] ", 1)[-1].startswith("serving "):
            said.append(line)
        if not line:
            sys.exit(f"error: prorsa serve did not start (exit {proc.wait()}):\n{''.join(said[-10:])}")
        # its console's progress lines fill the pipe unless read
        threading.Thread(target=lambda: [said.append(x) for x in proc.stdout], daemon=True).start()
        yield line.split(" on ")[1].split()[0], proc
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=300)
        if stopped is not None:
            stopped.append(code)
    finally:
        if proc.poll() is None:
            proc.kill()


def serve_makespan(pipeline: Path, engine: str, out: Path, specs_by_step: list[list]) -> float:
    with serving(pipeline, engine, out) as (url, _):
        return asyncio.run(replay(url, specs_by_step))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipeline", type=Path, default=ROOT / "pipelines/quickstart.yaml")
    ap.add_argument("--engine", choices=["emulated", "vllm"], default="emulated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/serve-overhead.json")
    args = ap.parse_args()

    from prorsa.agent.workload import Workload
    from prorsa.config.load import load_pipeline

    cfg = load_pipeline(args.pipeline)
    workload = Workload.from_config(cfg.workload, cfg.seed)
    steps = [workload.trajectories_for_step(s) for s in range(cfg.workload.steps)]
    runs: dict[str, list[float]] = {"run": [], "serve": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for door in (["run", "serve"] if r % 2 == 0 else ["serve", "run"]):
                out = Path(tmp) / f"{door}-{r}"
                m = run_makespan(args.pipeline, args.engine, out) if door == "run" else \
                    serve_makespan(args.pipeline, args.engine, out, steps)
                runs[door].append(round(m, 3))
                print(f"{door} {r}: {m:.2f} s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in runs.items()}
    doc = {
        **provenance("serve_overhead.py"),
        "pipeline": args.pipeline.name, "engine": args.engine,
        "trajectories": sum(len(s) for s in steps), "turns": sum(len(t.turns) for s in steps for t in s),
        "runs": runs, "median_s": med, "ratio": round(med["serve"] / med["run"], 3),
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
