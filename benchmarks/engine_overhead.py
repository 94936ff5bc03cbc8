"""Engine-path overhead: the same requests sent straight to the vLLM servers vs through Prorsa's
Dask runtime, side by side on the same engines.

  direct   httpx from this process: prefill (max_tokens=1, do_remote_decode) on the prefill
           engine, then decode with the returned kv_transfer_params on the decode engine
  prorsa   DaskTurnRunner.run_turn: keyed prefill, decode and tool tasks on the Dask workers,
           whose engine legs call the same servers
Two workloads:
  burst    the first turn of every trajectory of the pipeline's first step, all at once (the
           worst case for a control plane: every turn pays its scheduling latency together)
  step     the whole first step: every trajectory, turn after turn, tool latencies replayed,
           through the same trajectory loop (what a synchronous RL step does)
Both paths use the same placement (the sticky router, decided the same way) and the same
request bodies; prefix caches are reset before every measurement and the two paths alternate
which goes first. It prints medians over repeats of makespan and decode tokens/s, and the
overhead ratio prorsa/direct.

    .venv/bin/python benchmarks/engine_overhead.py [--pipeline pipelines/quickstart.yaml] [--repeats 3]
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
VOCAB = 2048  # the tiny model's vocabulary


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
    from prorsa.sampling import Sampling

    async def one(turn, route) -> int:
        body = completion_body(turn.token_ids, 1, Sampling(), turn.seed, True)
        body["kv_transfer_params"] = {"do_remote_decode": True}
        pre = (await http.post(f"{urls[route.prefill]}/v1/completions", json=body)).json()
        body = completion_body(turn.token_ids, turn.decode_tokens, Sampling(), turn.seed, True)
        body["kv_transfer_params"] = pre["kv_transfer_params"]
        dec = (await http.post(f"{urls[route.decode]}/v1/completions", json=body)).json()
        return dec["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    tokens = await asyncio.gather(*(one(t, r) for t, r in zip(turns, routes)))
    return time.perf_counter() - t0, sum(tokens)


class DirectRunner:
    """A TurnRunner that calls the servers from this process: the step workload without Dask."""

    needs_token_ids = True

    def __init__(self, http: httpx.AsyncClient, urls: dict[str, str], router, vocab_size: int) -> None:
        self.http, self.urls, self.router, self.vocab_size = http, urls, router, vocab_size

    async def _post(self, engine: str, body: dict):
        from prorsa.engine.vllm.protocol import parse_completion

        t0 = time.perf_counter()
        resp = await self.http.post(f"{self.urls[engine]}/v1/completions", json=body)
        resp.raise_for_status()
        return parse_completion(resp.json(), time.perf_counter() - t0)

    async def run_turn(self, turn):
        from prorsa.agent.loop import TurnResult
        from prorsa.engine.vllm.protocol import completion_body
        from prorsa.sampling import Sampling

        route = self.router.route(turn.traj_id)
        try:
            body = completion_body(turn.token_ids, turn.decode_tokens, Sampling(), turn.seed, True)
            if route.prefill is not None:
                pre = completion_body(turn.token_ids, 1, Sampling(), turn.seed, True)
                pre["kv_transfer_params"] = {"do_remote_decode": True}
                body["kv_transfer_params"] = (await self._post(route.prefill, pre)).kv
            dec = await self._post(route.decode, body)
        finally:
            self.router.finished(route)
        if turn.done:
            self.router.forget(turn.traj_id)
        await asyncio.sleep(turn.tool_latency_s)  # the tool task sleeps the same in the Dask path
        return TurnResult(turn.traj_id, turn.turn, route.prefill or "", route.decode, turn.appended_tokens,
                          dec.cached_tokens, len(dec.token_ids), dec.token_ids)


async def step(runner, workload, wcfg) -> tuple[float, int]:
    from prorsa.rollout.drivers import Hooks, run_sync

    t0 = time.perf_counter()
    results = await run_sync(workload, wcfg, runner, lambda: time.perf_counter() - t0, Hooks(lambda r: None))
    failed = [r for r in results if r.status != "completed"]
    if failed:
        raise RuntimeError(f"{len(failed)} trajectories failed, first: {failed[0].error}")
    return time.perf_counter() - t0, sum(t.decode_tokens for r in results for t in r.turns)


async def via_prorsa(runner, turns) -> tuple[float, int]:
    t0 = time.perf_counter()
    results = await asyncio.gather(*(runner.run_turn(t) for t in turns))
    return time.perf_counter() - t0, sum(r.decode_tokens for r in results)


def _url(dask_worker):
    from prorsa.cluster.engine_host import engine_here

    return engine_here(dask_worker).server.url


async def _reset(dask_worker):
    from prorsa.cluster.engine_host import engine_here

    await engine_here(dask_worker).reset_prefix_cache()


async def main(args) -> None:
    from distributed import Client
    from rich.console import Console
    from rich.table import Table

    from prorsa.agent.workload import Workload
    from prorsa.config.load import load_pipeline
    from prorsa.control.policy import make_policy
    from prorsa.engine.registry import engine_name, resolve_model_dir
    from prorsa.cluster.local import engine_addresses, start_local_cluster
    from prorsa.live.runtime import DaskTurnRunner
    from prorsa.rollout.router import Router

    # a fixed split: the overhead of a leg, not a policy's moves (the quickstart opens prorsa all mixed)
    cfg = load_pipeline(args.pipeline, {"engines.backend": "vllm", "runtime.dashboard_address": None,
                                        "policy": "static:2:1"})
    roles = make_policy(cfg.policy).initial_roles(cfg.engines.count)
    engines = [engine_name(i) for i in range(cfg.engines.count)]
    resolve_model_dir(cfg.engines)
    wcfg = cfg.workload.model_copy(update={"steps": 1})
    workload = Workload.from_config(wcfg, cfg.seed)
    console = Console()
    modes = ["burst", "step"] if args.mode == "both" else [args.mode]
    samples: dict[tuple[str, str], list[tuple[float, int]]] = {(m, k): [] for m in modes for k in ("direct", "prorsa")}
    with tempfile.TemporaryDirectory() as run_dir:
        async with await start_local_cluster(cfg, roles, Path(run_dir)) as cluster, \
                Client(cluster, asynchronous=True) as client, \
                httpx.AsyncClient(timeout=600, limits=httpx.Limits(keepalive_expiry=2.0)) as http:
            addresses = await engine_addresses(client)
            by_addr = await client.run(_url, workers=list(addresses.values()))
            urls = {e: by_addr[addresses[e]] for e in engines}
            turns = _turns(cfg, vocab=VOCAB)
            router = Router(dict(zip(engines, roles)))
            routes = [router.route(t.traj_id) for t in turns]  # the burst's placement, for both paths
            console.print(f"burst: {len(turns)} concurrent first turns, {sum(t.appended_tokens for t in turns)} "
                          f"prompt tokens, {sum(t.decode_tokens for t in turns)} decode tokens; step: "
                          f"{wcfg.prompts * wcfg.group_size} trajectories of up to {wcfg.max_turns} turns; "
                          f"roles {[r.value for r in roles]}")

            async def measure(mode: str, kind: str) -> tuple[float, int]:
                await client.run(_reset, workers=list(addresses.values()))
                fresh = Router(dict(zip(engines, roles)))
                if kind == "prorsa":
                    runner = DaskTurnRunner(client, fresh, addresses, cfg.runtime.turn_shape, True, VOCAB, time.time())
                    return await (via_prorsa(runner, turns) if mode == "burst" else step(runner, workload, wcfg))
                if mode == "burst":
                    return await direct(http, turns, routes, urls)
                return await step(DirectRunner(http, urls, fresh, VOCAB), workload, wcfg)

            for mode in modes:
                for rep in range(args.repeats + 1):  # the first pair warms both paths up, not counted
                    order = ["direct", "prorsa"] if rep % 2 == 0 else ["prorsa", "direct"]
                    for kind in order:
                        r = await measure(mode, kind)
                        if rep:
                            samples[(mode, kind)].append(r)
                        console.print(f"{mode} rep {rep} {kind}: {r[0]:.3f} s, {r[1] / r[0]:.0f} decode tok/s"
                                      + ("" if rep else " (warm-up)"))

    table = Table(title="engine path: the same requests straight to vLLM vs through Prorsa (medians)")
    for col in ("workload", "path", "makespan s", "decode tok/s", "prorsa/direct"):
        table.add_column(col, justify="right")
    for mode in modes:
        med = {k: statistics.median(s for s, _ in samples[(mode, k)]) for k in ("direct", "prorsa")}
        for k in ("direct", "prorsa"):
            rate = statistics.median(n / s for s, n in samples[(mode, k)])
            table.add_row(mode, k, f"{med[k]:.3f}", f"{rate:.0f}", f"{med['prorsa'] / med['direct']:.3f}" if k == "prorsa" else "")
    console.print(table)
    console.print("command: python benchmarks/engine_overhead.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", default=str(REPO / "pipelines" / "quickstart.yaml"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mode", choices=["burst", "step", "both"], default="both")
    asyncio.run(main(ap.parse_args()))
