"""A role switch's cost on vLLM CPU engines: in place (kv_both) against by restart (kv_producer /
kv_consumer, engines.role_switch: restart), and what the allocator charges for each.

Two engines of the quickstart's tiny model, A and B, pinned to cores 0 and 1, float32, greedy.
Each switch swaps the pair's roles with OLD_LEGS disaggregated turns of the old direction in
flight; an engine is unavailable from the switch until it can take its new leg:
  in place   the old legs it holds drain (A's prefills; B's decodes), then it serves the new one
  restart    the old legs drain and every decode that pulls its KV ends, then its server restarts
             into the other side (VllmEngine.restart_as): drain plus its own restart (the two
             restart one after the other, as a controller keeps one engine of each phase open)
After each switch one turn in the new direction (the probe) must give the colocated output: the
new leg really served, KV shipped the new way. The in-place pair starts with kv_both; the same
servers are then turned into producer / consumer by restart_as (not counted) for the restart runs.
Prices: CostModel.switch_time as the allocator reads it (Capacity.drain_time), Qwen3-8B on an H200,
a decode engine holding 22 sequences of 32k context with 1000 tokens left each, in place and at
engines.restart_s (default 30 s; see benchmarks/README.md for the estimate).

    .venv/bin/python benchmarks/role_restart.py [--repeats 3] [--out benchmarks/results/role-restart.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD_LEGS = 4
GEN = 32
_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)")
_LOAD = re.compile(r"Model loading took .*? and ([\d.]+) seconds")


def _ids(seed: int, n: int = 300) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(16, 2000) for _ in range(n))


async def _turn(p, d, ids, traj: str):
    from prorsa.engine.base import DecodeRequest, PrefillRequest
    from prorsa.engine.vllm.protocol import GREEDY

    pre = await p.prefill(PrefillRequest(traj, 0, len(ids), len(ids), tuple(ids)))
    return await d.decode(DecodeRequest(traj, 0, len(ids), GEN, tuple(ids), kv=pre.kv, sampling=GREEDY))


async def _alone(e, ids, traj: str):
    from prorsa.engine.base import DecodeRequest
    from prorsa.engine.vllm.protocol import GREEDY

    return await e.generate(DecodeRequest(traj, 0, len(ids), GEN, tuple(ids), sampling=GREEDY))


def _log_figures(engine) -> dict:
    """What the restarted server's own log says its start spent (this start's lines only)."""
    text = engine.server._this_start()
    init, load = _INIT.findall(text), _LOAD.findall(text)
    return {"engine_init_s": float(init[-1]) if init else None, "weights_load_s": float(load[-1]) if load else None}


async def _switch(pair, k: int, restart: bool) -> list[dict]:
    """Swap the pair's roles under OLD_LEGS old-direction turns; one record per engine."""
    from prorsa.roles import Role

    p, d = pair
    old = [asyncio.create_task(_turn(p, d, _ids(1000 * k + i), f"old{k}-{i}")) for i in range(OLD_LEGS)]
    while d.inflight(Role.DECODE) == 0:  # the old direction really under way
        await asyncio.sleep(0.002)
    out = []
    t0 = time.monotonic()
    if not restart:
        p.set_role(Role.DECODE)
        d.set_role(Role.PREFILL)
        await p.drain(Role.PREFILL)
        p_ready = time.monotonic() - t0
        await d.drain(Role.DECODE)
        d_ready = time.monotonic() - t0
        out = [{"engine": p.engine_id, "to": "decode", "unavailable_s": p_ready},
               {"engine": d.engine_id, "to": "prefill", "unavailable_s": d_ready}]
    else:
        await asyncio.gather(*old)  # the decodes pulling p's KV are done: p may go
        drained = time.monotonic() - t0
        for e, role in ((p, Role.DECODE), (d, Role.PREFILL)):
            r0 = time.monotonic()
            await e.restart_as(role)
            took = time.monotonic() - r0
            out.append({"engine": e.engine_id, "to": role.value, "drain_s": drained,
                        "restart_s": took, "unavailable_s": drained + took,
                        "server_start_s": e.server.start_s, "warmup_s": e.server.warmup_s, **_log_figures(e)})
    await asyncio.gather(*old)
    probe_ids = _ids(7000 + k)
    t1 = time.monotonic()
    probe = await _turn(d, p, probe_ids, f"probe{k}")
    first = time.monotonic() - t1
    expected = await _alone(p, probe_ids, f"alone{k}")
    for r in out:
        r["first_turn_s"] = first
        r["probe_matches"] = probe.token_ids == expected.token_ids
    return out


async def _measure(repeats: int, logs: Path) -> dict:
    from prorsa.config.engines import VllmSettings
    from prorsa.engine.tiny_model import ensure_tiny_model
    from prorsa.engine.vllm import Placement, VllmEngine
    from prorsa.engine.vllm.kv_roles import RESTART
    from prorsa.roles import Role

    model = ensure_tiny_model(REPO / ".prorsa" / "models")
    settings = VllmSettings(dtype="float32", start_timeout_s=900)
    a = VllmEngine("A", Role.PREFILL, settings, model, Placement([0]), log_dir=logs)
    b = VllmEngine("B", Role.DECODE, settings, model, Placement([1]), log_dir=logs)
    runs: dict[str, list[dict]] = {"in_place": [], "restart": []}
    try:
        await asyncio.gather(a.start(), b.start())
        for p, d in ((a, b), (b, a)):  # NIXL handshakes and lazy paths out of the timings
            await _turn(p, d, _ids(99), "warm")
        pair = (a, b)
        for k in range(repeats):
            runs["in_place"] += await _switch(pair, k, restart=False)
            pair = pair[::-1]
        for e in pair:  # kv_both -> the side each has now; not counted
            e.switch = RESTART
            await e.restart_as(e.role)
        await _turn(*pair, _ids(98), "warm")  # pair[0] is the prefill engine: the new servers' handshake
        for k in range(repeats):
            runs["restart"] += await _switch(pair, 100 + k, restart=True)
            pair = pair[::-1]
    finally:
        await asyncio.gather(a.stop(), b.stop(), return_exceptions=True)
    return runs


def _prices(restart_s: float) -> dict:
    from prorsa.control.allocator import Capacity
    from prorsa.costmodel import CostModel
    from prorsa.loads import EngineLoad
    from prorsa.roles import Role

    out = {}
    for path, price in (("in_place", None), ("restart", restart_s)):
        cap = Capacity.from_cost(CostModel.from_names("h200", "qwen3-8b", restart_s=price), slots=32)
        decoding = EngineLoad("e", Role.DECODE, 0, 22, 22 * 32768, 10**7)
        prefilling = EngineLoad("e", Role.PREFILL, 0, 4, 0, 10**7)
        out[path] = {"prefill_to_decode_s": cap.drain_time(prefilling, Role.DECODE, 0),
                     "decode_to_prefill_s": cap.drain_time(decoding, Role.PREFILL, 1000),
                     "decode_to_mixed_s": cap.drain_time(decoding, Role.MIXED, 1000)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--restart-s", type=float, default=30.0, help="the GPU restart the prices use (engines.restart_s)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "role-restart.json"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="role-restart-") as logs:
        runs = asyncio.run(_measure(args.repeats, Path(logs)))
    median = {path: statistics.median(r["unavailable_s"] for r in rs) for path, rs in runs.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    doc = {"command": "python benchmarks/role_restart.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": time.strftime("%F"), "commit": commit,
           "machine": f"{platform.machine()}, {platform.system()}, 2 cores shared with other jobs",
           "model": "tiny (quickstart)", "old_legs": OLD_LEGS, "runs": runs, "median_unavailable_s": median,
           "restart_s": args.restart_s, "prices": _prices(args.restart_s)}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({"median_unavailable_s": median, "prices": doc["prices"]}, indent=1))
    return 0 if all(r["probe_matches"] for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
