"""Engine-path overhead: the same batch of disaggregated turns sent straight to the vLLM servers
vs through Prorsa's Dask runtime, side by side on the same engines.

  direct   httpx from this process: prefill (max_tokens=1, do_remote_decode) on the prefill
           engine, then decode with the returned kv_transfer_params on the decode engine
  prorsa   DaskTurnRunner.run_turn: a keyed turn task on the tool worker submitting prefill and
           decode tasks to the engine workers, which call the same servers
Both use the same placement (the router's, decided the same way for both) and the same request
bodies; prefix caches are reset before every measurement and the two alternate which goes first.
It prints medians over repeats of makespan and tokens/s, and the overhead ratio prorsa/direct.

    .venv/bin/python benchmarks/engine_overhead.py [--pipeline pipelines/quickstart.yaml] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def _turns(cfg, vocab: int):
    from prorsa.agent.loop import TurnRequest, synth_ids
    from prorsa.agent.workload import Workload

    turns = []
    for spec in Workload.from_config(cfg.workload, cfg.seed).trajectories_for_step(0):
        t0 = spec.turns[0]
        ids = tuple(synth_ids((0, spec.step, spec.prompt_index, spec.group_index), t0.appended_tokens, vocab))
        turns.append(TurnRequest(spec.traj_id, 0, spec.family, t0.appended_tokens, t0.appended_tokens,
                                 t0.decode_tokens, 0.0, True, spec.seed, ids))
    return turns


async def direct(http: httpx.AsyncClient, turns, routes, urls: dict[str, str]) -> tuple[float, int]:
    from prorsa.engine.vllm.engine import completion_body

    async def one(turn, route) -> int:
        body = completion_body(turn.token_ids, 1, 1.0, turn.seed, True)
        body["kv_transfer_params"] = {"do_remote_decode": True}
        pre = (await http.post(f"{urls[route.prefill]}/v1/completions", json=body)).json()
        body = completion_body(turn.token_ids, turn.decode_tokens, 1.0, turn.seed, True)
        body["kv_transfer_params"] = pre["kv_transfer_params"]
        dec = (await http.post(f"{urls[route.decode]}/v1/completions", json=body)).json()
        return dec["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    tokens = await asyncio.gather(*(one(t, r) for t, r in zip(turns, routes)))
    return time.perf_counter() - t0, sum(tokens)


async def via_prorsa(runner, turns) -> tuple[float, int]:
    t0 = time.perf_counter()
    results = await asyncio.gather(*(runner.run_turn(t) for t in turns))
    return time.perf_counter() - t0, sum(r.decode_tokens for r in results)


def _url(dask_worker):
    from prorsa.rollout.engine_host import engine_here

    return engine_here(dask_worker).server.url


async def _reset(dask_worker):
    from prorsa.rollout.engine_host import engine_here

    await engine_here(dask_worker).reset_prefix_cache()


async def main(args) -> None:
    from distributed import Client
    from rich.console import Console
    from rich.table import Table

    from prorsa.config.load import load_pipeline
    from prorsa.control.policy import make_policy
    from prorsa.engine.registry import engine_name, resolve_model_dir
    from prorsa.rollout.cluster import engine_addresses, start_local_cluster
    from prorsa.rollout.dask_runtime import DaskTurnRunner
    from prorsa.rollout.router import Router

    cfg = load_pipeline(args.pipeline, {"engines.backend": "vllm", "runtime.dashboard_address": None})
    roles = make_policy(cfg.policy).initial_roles(cfg.engines.count)
    engines = [engine_name(i) for i in range(cfg.engines.count)]
    resolve_model_dir(cfg.engines)
    console = Console()
    samples: dict[str, list[tuple[float, int]]] = {"direct": [], "prorsa": []}
    with tempfile.TemporaryDirectory() as run_dir:
        async with await start_local_cluster(cfg, roles, Path(run_dir)) as cluster, \
                Client(cluster, asynchronous=True) as client, httpx.AsyncClient(timeout=600, limits=httpx.Limits(keepalive_expiry=2.0)) as http:
            addresses = await engine_addresses(client)
            by_addr = await client.run(_url, workers=list(addresses.values()))
            urls = {e: by_addr[addresses[e]] for e in engines}
            turns = _turns(cfg, vocab=2048)
            router = Router(dict(zip(engines, roles)))
            routes = [router.route(t.traj_id) for t in turns]  # the placement both paths use
            runner = DaskTurnRunner(client, Router(dict(zip(engines, roles))), addresses,
                                    cfg.runtime.turn_shape, True, 2048, time.time())
            console.print(f"{len(turns)} concurrent turns, {sum(t.appended_tokens for t in turns)} prompt "
                          f"tokens, {sum(t.decode_tokens for t in turns)} decode tokens; roles {roles}")
            for rep in range(args.repeats + 1):  # the first pair warms both paths up, not counted
                order = ["direct", "prorsa"] if rep % 2 == 0 else ["prorsa", "direct"]
                for kind in order:
                    await client.run(_reset, workers=list(addresses.values()))
                    r = await (direct(http, turns, routes, urls) if kind == "direct" else via_prorsa(runner, turns))
                    if rep:
                        samples[kind].append(r)
                    console.print(f"rep {rep} {kind}: {r[0]:.3f} s, {r[1] / r[0]:.0f} decode tok/s"
                                  + ("" if rep else " (warm-up)"))

    table = Table(title="engine path: the same batch straight to vLLM vs through Prorsa (medians)")
    for col in ("path", "makespan s", "decode tok/s"):
        table.add_column(col, justify="right")
    med = {k: statistics.median(s for s, _ in v) for k, v in samples.items()}
    for k, v in samples.items():
        table.add_row(k, f"{med[k]:.3f}", f"{statistics.median(n / s for s, n in v):.0f}")
    console.print(table)
    console.print(f"overhead: prorsa/direct makespan = {med['prorsa'] / med['direct']:.3f} "
                  f"({(med['prorsa'] / med['direct'] - 1) * 100:+.1f}% of engine time)")
    console.print("command: python benchmarks/engine_overhead.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", default=str(REPO / "pipelines" / "quickstart.yaml"))
    ap.add_argument("--repeats", type=int, default=5)
    asyncio.run(main(ap.parse_args()))
