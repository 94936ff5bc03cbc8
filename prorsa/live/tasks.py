"""The functions Dask runs on workers, one per leg of a turn.

    prefill_task(req)            engine worker, resources={"prefill": 1}  -> PrefillResult
    decode_task(pre, req)        engine worker, resources={"decode": 1}   -> DecodeResult
    generate_task(req)           engine worker, resources={"decode": 1}   -> DecodeResult (colocated)
    decode_task(None, req)       the same, decode-local: the engine holding the context prefills
                                 the append itself (key local-<traj>-<k>)
    warm_task(req)               engine worker, resources={"prefill": 1}: the trajectory's context
                                 prefilled into this engine's cache while its tool runs, for its
                                 next turn here (scheduling.migrate)  -> whether it warmed
    tool_task(turn, pre, dec)    tool worker: runs the turn's tool call (environments; live: the
                                 calls parsed from the decode's text) or sleeps its replayed
                                 latency                                  -> TurnResult
    turn_task(turn, route)       tool worker: submits its own legs, waits, runs the tool -> TurnResult
    leg_graph / tool_graph       a turn's task group as delayed tasks (the legs, then the tool task
                                 after them), submitted in batches

A turn's `priority` (engine/base.py: its admission key, lower sooner; 0 everywhere: first come)
goes on both leg requests, for the engines to admit by, and onto the group's tasks as Dask's
`priority` annotation, negated (Dask runs higher first), so the scheduler's queue and each worker's
ready queue order them the same way.

A turn's task group (keys carry traj and turn, annotations carry phase/tokens/context):

    turn-<traj>-<k>  (tool worker)
       |-- prefill-<traj>-<k>  (prefill pool)  --kv handle-->  decode-<traj>-<k>  (decode pool)
       '-- tool after decode, observation -> next turn

Engine legs are coroutines: they run on the worker's event loop beside the engine, so a slot
costs no thread.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import dask
from dask import delayed
from distributed import get_client, secede

from prorsa.agent.environment import with_observation
from prorsa.agent.live_episode import with_step
from prorsa.agent.loop import TurnRequest, TurnResult
from prorsa.cluster.engine_host import engine_here
from prorsa.cluster.tool_host import respond, run_tool
from prorsa.engine.base import DecodeRequest, DecodeResult, PrefillRequest, PrefillResult
from prorsa.rollout.legs import leg_requests, turn_result
from prorsa.rollout.router import Route

log = logging.getLogger(__name__)


async def prefill_task(req: PrefillRequest) -> PrefillResult:
    return await engine_here().prefill(req)


async def decode_task(pre: PrefillResult | None, req: DecodeRequest) -> DecodeResult:
    if pre is not None:
        req = replace(req, kv=pre.kv)
    return await engine_here().decode(req)


async def generate_task(req: DecodeRequest) -> DecodeResult:
    return await engine_here().generate(req)


async def warm_task(req: PrefillRequest) -> bool:
    # optional work: a warm-up that fails costs the next turn the recompute it was to save, no more
    try:
        await engine_here().warm(req)
        return True
    except Exception as e:
        log.warning("warming %s for turn %d failed (%s: %s)", req.traj_id, req.turn + 1, type(e).__name__, e)
        return False


def warm_submit(client, req: PrefillRequest, turn: TurnRequest, address: str, priority: float = 0.0):
    """-> the Dask future of warming the engine at `address` with `req` (warm_request)."""
    with dask.annotate(phase="warm", **turn_annotations(turn), **dask_priority(priority)):
        return client.submit(warm_task, req, key=f"warm-{turn.traj_id}-{turn.turn}", workers=[address],
                             allow_other_workers=True, resources={"prefill": 1}, pure=False)


def tool_task(
    turn: TurnRequest, pre: PrefillResult | None, dec: DecodeResult, submitted: float, started: float
) -> TurnResult:
    t0 = time.time()
    obs = step = None
    if turn.live:
        step = respond(dec.token_ids)
    elif turn.tool_call is not None:
        obs = run_tool(turn.tool_call)
    elif turn.tool_latency_s > 0:  # no environment: the tool's latency is part of the workload
        time.sleep(turn.tool_latency_s)
    end = time.time()
    res = turn_result(turn, pre, dec, submitted - started, end - started, end - t0)
    if step is not None:
        return with_step(res, step)
    return res if obs is None else with_observation(res, obs)


def leg_graph(turn: TurnRequest, route: Route, addresses: dict[str, str], attempt: int = 0,
              priority: float = 0.0, budget: int | None = None):
    """The engine legs of a turn as delayed tasks (keys, annotations, loose worker restrictions),
    not yet submitted: (prefill or None, decode). Submitting several turns' legs as one graph
    costs the scheduler one update-graph instead of one per task. `budget`: the run's context
    budget, which caps the reply (rollout/legs.py response_cap).

    The scheduler sees every annotation, so none carries the replayed length (the world's,
    rollout/legs.py) but `replay_tokens` on a decode leg, which the lifecycle plugin reads only
    once the leg has finished, when the run holds the reply and its length."""
    pre_req, dec_req = leg_requests(turn, route, priority, budget)
    tag = f"{turn.traj_id}-{turn.turn}" + (f"-r{attempt}" if attempt else "")
    common = dict(allow_other_workers=True, **dask_priority(priority), **turn_annotations(turn, dec_req.max_tokens))
    replay = {} if dec_req.replay_tokens is None else {"replay_tokens": dec_req.replay_tokens}
    if pre_req is None:
        # colocated: one generate request; decode-local: a decode that prefills the append first
        phase, fn = ("local", decode_task) if route.local_prefill else ("generate", generate_task)
        args = (None, dec_req) if route.local_prefill else (dec_req,)
        with dask.annotate(phase=phase, tokens=turn.appended_tokens, **replay,
                           resources={"decode": 1}, workers=[addresses[route.decode]], **common):
            return None, delayed(fn, pure=False)(*args, dask_key_name=f"{phase}-{tag}")
    with dask.annotate(phase="prefill", tokens=turn.appended_tokens,
                       resources={"prefill": 1}, workers=[addresses[route.prefill]], **common):
        pf = delayed(prefill_task, pure=False)(pre_req, dask_key_name=f"prefill-{tag}")
    with dask.annotate(phase="decode", tokens=0, **replay,
                       resources={"decode": 1}, workers=[addresses[route.decode]], **common):
        df = delayed(decode_task, pure=False)(pf, dec_req, dask_key_name=f"decode-{tag}")
    return pf, df


def turn_annotations(turn: TurnRequest, max_tokens: int | None = None) -> dict:
    """What the scheduler plugin reads off every task of a turn (lifecycle_plugin.py);
    `max_tokens`: the reply's cap, on its legs (None: none set, or a tool task)."""
    a = dict(traj=turn.traj_id, turn=turn.turn, family=turn.family, context=turn.context_tokens - turn.appended_tokens,
             append=turn.appended_tokens)
    return a if max_tokens is None else a | {"max_tokens": max_tokens}


def dask_priority(priority: float) -> dict:
    """Dask's `priority` annotation for a turn's admission key: higher runs first, so negated;
    none for 0, which leaves Dask's own order (older graphs first)."""
    return {"priority": -priority} if priority else {}


def tool_graph(turn: TurnRequest, pf, df, key: str, submitted: float, started: float, priority: float = 0.0):
    """The tool task `key` after the legs `pf`, `df` (leg_graph)."""
    with dask.annotate(phase="tool", tokens=0, done=turn.done, resources={"env": 1}, **dask_priority(priority),
                       **turn_annotations(turn)):
        return delayed(tool_task, pure=False)(turn, pf, df, submitted, started, dask_key_name=key)


def turn_task(
    turn: TurnRequest, route: Route, addresses: dict[str, str], started: float, attempt: int = 0,
    priority: float = 0.0, budget: int | None = None,
) -> TurnResult:
    """The design card's shape: the turn task owns its legs and runs its tool where it stands.
    Submit it with `priority` positional: Client.submit takes a `priority=` keyword for itself."""
    t_submit = time.time()
    client = get_client()
    pf, df = leg_graph(turn, route, addresses, attempt, priority, budget)
    futures = client.compute([df] if pf is None else [pf, df], optimize_graph=False)
    secede()  # waiting on engines must not hold one of the tool worker's threads
    pre, dec = client.gather(futures) if pf is not None else (None, futures[0].result())
    return tool_task(turn, pre, dec, t_submit, started)
