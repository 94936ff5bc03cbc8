"""EmulatedEngine: the Engine contract (engine/base.py) with no model, timed by the cost model.

The simulator runs it on a virtual-clock event loop; live runs put it on Dask workers in wall time
(optionally scaled), so the control plane can be exercised at dozens of "GPUs" on a laptop.

    start()                 launch the step loop, one asyncio task on the running loop
    stop()                  cancel it; requests still pending fail with RuntimeError
    prefill(req)            compute the context's KV here (minus this engine's cached prefix)
    decode(req)             pull req.kv from its engine (only the part not cached here), or prefill
                            locally when req.kv is None, then generate req.replay_tokens tokens
                            (the replayed length), else req.max_tokens (no EOS is modelled)
    generate(req)           local prefill + decode (colocated)
    warm(req)               prefill into the prefix cache for a later turn (a migration)
    set_role(role)          bookkeeping: the runtime decides what to send; held work finishes
    reshards(role)          whether serving `role` needs another layout (engines.parallelism)
    relayout(role)          an empty engine takes `role`'s layout: weights move, the prefix cache goes
    restart_as(role)        an empty engine switched by restart (cost.restart_s) across the KV
                            connector's sides: held restart_s, the prefix cache gone; else set_role
    stats()                 queue, batch, KV written and counters; no I/O
    queued, active, kv_tokens   the first of them alone, read without building stats()
    reset_prefix_cache()    forget every cached prefix (after a weight update)
    update_weights(s)       stall s seconds (new weights loading) and forget every cached prefix

The step loop, one iteration per step or per skipped stretch of decode steps:

    admit FIFO while slots and KV allow     (a request reserves context + its decode length)
    prefills pending -> one step: prefill chunks up to max_batched_tokens, co-batched with every
                        running decode (vLLM-style chunked prefill), sleep cost.mixed_time(...)
    only decodes     -> sleep until the first sequence finishes, in one timer (event skipping);
                        an admissible arrival ends the stretch at the next step boundary
    nothing          -> wait for an arrival (never spins)

An MoE engine with expert parallelism ep is one DP-attention group of ep ranks (ep GPUs): slots and
KV are the group's, sequences are spread over ranks, and every step lasts as long as its slowest
rank's, so in a mixed engine one rank's prefill chunk stalls every rank's decodes. Given a RoleCosts
rather than one CostModel, an engine steps with the model of its current layout, which changes only
through relayout() (the control loop empties the engine first), never through set_role: a switch
passes through MIXED while it drains, and that must not reshard.

Every engine co-batches whatever it holds; roles decide only what the runtime sends it, so a
MIXED engine is simply one that is sent both phases. Time comes only from the running loop
(`loop.time()`, `asyncio.sleep`, `asyncio.wait_for`), so a virtual clock drives it unchanged.
Every sleep is multiplied by time_scale; at 0 the engine only yields (sleep(0)) between steps.
Given a CoreShare (engine/core_share.py: simulated vLLM CPU engines on one host), a step is also
stretched by the demand on the engine's cores when it starts.
Reported times are loop-time differences ("engine time"). Token ids are not produced.

KV, reserved and reported. Admission reserves a sequence's final KV (its context and the length it
will decode) from the start, so the emulator never preempts: that is the world's rule, and it
reads the replayed length, which only the world knows. What the engine reports (`kv_tokens` of
load() and stats()) is what has been written: every admitted sequence's context, and the tokens
each has decoded so far, counted to the step in flight. A real engine can count that; a policy
reading the reservation would learn how long each turn will decode before it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from prorsa.costmodel import CostModel, RoleCosts
from prorsa.engine.base import (DecodeRequest, DecodeResult, EngineStats, PrefillRequest,
                                PrefillResult, decode_length)
from prorsa.engine.batching import Batcher, SeqState
from prorsa.engine.core_share import CoreShare
from prorsa.engine.prefix_cache import make_prefix_cache
from prorsa.loads import EngineLoad
from prorsa.roles import Role, restarts_kv

_SHARED_STRETCH = 8  # decode steps between looks at the neighbours, while cores are shared


@dataclass(frozen=True)
class KvMemory:
    """An emulated engine's KV memory: its size and how its prefix cache evicts."""

    capacity: int | None = None  # tokens; None: what the cost model's layout holds
    prefix_cache: str = "ideal"  # engine/prefix_cache.py


class EmulatedEngine:
    needs_token_ids = False  # works from token counts

    def __init__(self, engine_id: str, role: Role, cost: CostModel | RoleCosts, slots: int,
                 time_scale: float = 1.0, max_batched_tokens: int = 8192,
                 memory: KvMemory = KvMemory(), cores: CoreShare | None = None):
        if slots < 1 or max_batched_tokens < 1 or time_scale < 0:
            raise ValueError(f"need slots >= 1, max_batched_tokens >= 1, time_scale >= 0; got "
                             f"{slots}, {max_batched_tokens}, {time_scale}")
        self.engine_id = engine_id
        self.role = role
        self.layouts = cost if isinstance(cost, RoleCosts) else RoleCosts.uniform(cost)
        self.time_scale = time_scale
        self.max_batched_tokens = max_batched_tokens
        self._kv_given = memory.capacity
        self._prefix_kind = memory.prefix_cache
        self.cores = cores  # the CPU host shared with the other engines, if any
        self._lay_out(self.layouts.of(role))
        self._batch = Batcher(slots, self.kv_capacity, self.ranks)
        self._counters = {"cached_tokens": 0, "transfers": 0, "transfer_tokens": 0, "busy_s": 0.0}
        self._task: asyncio.Task | None = None
        self._wake: _Wake | None = None  # set when the step loop should re-plan
        self._held_until = 0.0  # loop time before which no step starts (a weight update)
        self._stretch: tuple[float, np.ndarray] | None = None  # decode stretch in flight: start, step ends

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._wake = _Wake()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        b = self._batch
        for seq in [*b.waiting, *b.transferring, *b.prefilling, *b.decoding]:
            if seq.waiter is not None and not seq.waiter.done():
                seq.waiter.set_exception(RuntimeError(f"engine {self.engine_id} stopped"))
        self._batch = Batcher(b.slots, b.kv_capacity, b.ranks)

    def _lay_out(self, cost: CostModel) -> None:
        self.cost = cost
        self.ranks = cost.ep  # DP-attention ranks of an expert-parallel group, stepping in lockstep
        self.kv_capacity = cost.kv_capacity_tokens() * self.ranks if self._kv_given is None else self._kv_given
        if self.kv_capacity < 1:
            raise ValueError(f"engine {self.engine_id}: no room for KV beside the weights ({cost!r})")
        self._prefix = make_prefix_cache(self._prefix_kind, self.kv_capacity)

    def set_role(self, role: Role) -> None:
        self.role = role

    def reshards(self, role: Role) -> bool:
        return self.layouts.of(role).layout != self.cost.layout

    async def relayout(self, role: Role) -> None:
        """Take `role`'s layout; returns once the weights are in place. The engine must hold no
        sequence: their KV is laid out for the old ranks. Cached prefixes are lost for the same reason."""
        new = self.layouts.of(role)
        if new.layout == self.cost.layout:
            return
        self._must_be_empty("relayout")
        seconds = self.cost.reshard_time(new)
        self._lay_out(new)
        self._batch.relayout(self.kv_capacity, self.ranks)
        await self._hold(seconds)

    async def restart_as(self, role: Role) -> None:
        """Take `role`; across the KV connector's sides on an engine switched by restart, as a real
        server would: it must be empty, holds restart_s and comes back with no cached prefix."""
        seconds = self.cost.restart_s
        if seconds is not None and restarts_kv(self.role, role):
            self._must_be_empty("restart")
            self._prefix.clear()
            await self._hold(seconds)
        self.role = role

    def _must_be_empty(self, what: str) -> None:
        if self._batch.active or self._batch.waiting:
            raise RuntimeError(f"engine {self.engine_id}: {what} with {self._batch.active} sequences "
                               f"running and {len(self._batch.waiting)} waiting; drain it first")

    async def _hold(self, seconds: float) -> None:
        """No step starts for `seconds` (cost-model time) from now; returns when they are over."""
        loop = asyncio.get_running_loop()
        self._held_until = max(self._held_until, loop.time() + seconds * self.time_scale)
        await asyncio.sleep(max(self._held_until - loop.time(), 0.0))

    async def update_weights(self, seconds: float) -> None:
        """Returns once the new weights are in; meanwhile no step starts (the one in flight ends)."""
        loop = asyncio.get_running_loop()
        self._held_until = max(self._held_until, loop.time() + seconds * self.time_scale)
        await self.reset_prefix_cache()
        if self._wake is not None:
            self._wake.set()
        await asyncio.sleep(max(self._held_until - loop.time(), 0.0))

    async def load_weights(self, model_dir) -> None:
        """No weights to load (the cost model times a model it never runs); what a new policy
        changes here is that no cached KV is valid any more."""
        await self.reset_prefix_cache()

    async def reset_prefix_cache(self) -> None:
        self._prefix.clear()  # a weight update: no cached KV is valid any more

    def load(self, queued_prefill_tokens: int = 0) -> EngineLoad:
        """What the simulator's sampler and controller read of every engine each interval: cheap,
        where stats() builds a record with every counter."""
        b = self._batch
        return EngineLoad(self.engine_id, self.role, len(b.waiting), b.active, self._kv_written(), self.kv_capacity,
                          queued_prefill_tokens)

    def stats(self) -> EngineStats:
        b, c = self._batch, self._counters
        return EngineStats(
            engine_id=self.engine_id, role=self.role, queued=len(b.waiting), active=b.active,
            kv_tokens=self._kv_written(), kv_capacity=self.kv_capacity,
            prefill_tokens_total=b.prefill_tokens, decode_tokens_total=b.decode_tokens,
            cached_tokens_total=c["cached_tokens"],
            extra={"steps": float(b.steps), "busy_s": c["busy_s"],
                   "transfers": float(c["transfers"]),
                   "transfer_tokens_total": float(c["transfer_tokens"]),
                   "prefix_cached_tokens": float(self._prefix.tokens),
                   "prefix_evicted_tokens_total": float(self._prefix.evicted_tokens),
                   "decoding": float(len(b.decoding)), "prefilling": float(len(b.prefilling))})

    def _kv_written(self) -> int:
        """KV the admitted sequences have written by now, decode steps of a stretch in flight
        included (the batch's clock moves only when the stretch ends)."""
        steps = 0
        if self._stretch is not None:
            start, ends = self._stretch
            with contextlib.suppress(RuntimeError):  # read off the loop: as of the last step boundary
                steps = int(ends.searchsorted(asyncio.get_running_loop().time() - start, side="right"))
        return self._batch.kv_written(steps)

    # -- requests ----------------------------------------------------------------------------

    async def prefill(self, req: PrefillRequest) -> PrefillResult:
        cached = self._reusable(req.traj_id, req.context_tokens, req.new_tokens)
        seq = SeqState(req.traj_id, reserve=req.context_tokens,
                       prefill_left=req.context_tokens - cached, prefix=cached, decode_left=0,
                       priority=req.priority)
        await self._serve(seq)
        self._prefix.put(req.traj_id, req.context_tokens, self._batch.kv_used)
        kv = {"engine_id": self.engine_id, "traj_id": req.traj_id, "turn": req.turn,
              "tokens": req.context_tokens}
        end = seq.prefill_end if seq.prefill_end is not None else seq.admitted
        return PrefillResult(engine_id=self.engine_id, kv=kv, cached_tokens=cached,
                             queue_s=seq.admitted - seq.arrived, compute_s=end - seq.admitted)

    async def decode(self, req: DecodeRequest) -> DecodeResult:
        """cached_tokens: context served from this engine's cache, whether that saved a local
        prefill (kv=None) or part of the pull (kv from another engine)."""
        remote = req.kv is not None and req.kv.get("engine_id") != self.engine_id
        # Our own KV handle: the context is in our cache, nothing new to prefill.
        cached = self._reusable(req.traj_id, req.context_tokens,
                                req.new_tokens if req.kv is None else 0)
        n = decode_length(req)  # the world decoding: where the replayed turn ends
        reserve = req.context_tokens + n
        if remote:  # pull only what is not cached here (vLLM's connector does the same)
            seq = SeqState(req.traj_id, reserve=reserve, prefill_left=0,
                           prefix=req.context_tokens, decode_left=n, transfer=True,
                           priority=req.priority)
            transfer = (req.context_tokens - cached, req.kv.get("link", "net"))
        else:
            seq = SeqState(req.traj_id, reserve=reserve,
                           prefill_left=req.context_tokens - cached, prefix=cached,
                           decode_left=n, priority=req.priority)
            transfer = None
        transfer_s = await self._serve(seq, transfer)
        self._prefix.put(req.traj_id, req.context_tokens + n, self._batch.kv_used)
        start = seq.decode_start if seq.decode_start is not None else seq.finished
        return DecodeResult(
            engine_id=self.engine_id, n_tokens=n, cached_tokens=cached,
            queue_s=seq.admitted - seq.arrived, transfer_s=transfer_s,
            prefill_s=0.0 if seq.prefill_end is None else seq.prefill_end - seq.admitted,
            decode_s=seq.finished - start)

    async def generate(self, req: DecodeRequest) -> DecodeResult:
        if req.kv is not None:
            raise ValueError("generate prefills locally; pass kv=None (or call decode)")
        return await self.decode(req)

    async def warm(self, req: PrefillRequest) -> PrefillResult:
        # a prefill already is one: its context stays cached here, and no decode engine pulls it
        return await self.prefill(req)

    def _reusable(self, traj_id: str, context: int, new: int) -> int:
        """Context tokens this engine's cache can serve: never the turn's newly appended ones."""
        cached = max(0, min(self._prefix.take(traj_id, self._batch.kv_used), context - new))
        self._counters["cached_tokens"] += cached
        return cached

    async def _serve(self, seq: SeqState, transfer: tuple[int, str] | None = None) -> float:
        """Queue `seq`, wait for it to finish; returns the seconds spent pulling its KV."""
        if self._task is None:
            raise RuntimeError(f"engine {self.engine_id} is not started")
        loop = asyncio.get_running_loop()
        seq.arrived = loop.time()
        batch = self._batch  # stop() replaces it: a sequence belongs to the one it joined
        batch.submit(seq)
        if batch.admissible():
            self._wake.set()  # it can join the batch now: cut a decode stretch short
        transfer_s = 0.0
        try:
            await self._wait(seq)  # transferring sequences are woken at admission
            if transfer is not None:
                tokens, link = transfer
                t0 = loop.time()
                await self._sleep(self.cost.kv_transfer_time(tokens, link), busy=False)
                transfer_s = loop.time() - t0
                self._counters["transfers"] += 1
                self._counters["transfer_tokens"] += tokens
                if self._batch is not batch:
                    raise RuntimeError(f"engine {self.engine_id} stopped")
                batch.transfer_done(seq, loop.time())
                self._wake.set()  # it joins the decode batch at the next step
                if seq.finished is None:
                    await self._wait(seq)
        except BaseException:  # cancelled by the caller: free the slot and the KV
            if seq.finished is None:
                batch.remove(seq)
                self._wake.set()
            raise
        return transfer_s

    @staticmethod
    def _wait(seq: SeqState) -> asyncio.Future:
        """A future the step loop resolves at the sequence's next hand-back point."""
        seq.waiter = asyncio.get_running_loop().create_future()
        return seq.waiter

    @staticmethod
    def _resolve(seqs: Iterable[SeqState]) -> None:
        for seq in seqs:
            if seq.waiter is not None and not seq.waiter.done():
                seq.waiter.set_result(None)

    # -- the step loop -----------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        b = self._batch
        while True:
            if loop.time() < self._held_until:
                await asyncio.sleep(self._held_until - loop.time())
            self._wake.clear()
            admitted = b.admit(loop.time())
            self._resolve(s for s in admitted if s.transfer or s.finished is not None)
            if b.prefilling:
                plan = b.plan_prefill(self.max_batched_tokens)
                await self._sleep(self._step_time(plan))
                self._resolve(b.apply_prefill(plan, loop.time()))
            elif b.decoding:
                self._resolve(b.advance(await self._decode_stretch(loop), loop.time()))
            else:
                await self._wake.wait()

    def _step_time(self, plan) -> float:
        """One chunked-prefill step; with DP-attention ranks every rank waits for the slowest
        (the all-to-all of each MoE layer is a barrier), so a prefill chunk on one rank stalls
        the decodes of all."""
        if self.ranks == 1:
            (n, ctx), = plan.decodes
            return self.cost.mixed_time_sums([(k, s.prefix) for s, k in plan.chunks], n, ctx)
        chunks: list[list] = [[] for _ in range(self.ranks)]
        for s, k in plan.chunks:
            chunks[s.rank].append((k, s.prefix))
        return max(self.cost.mixed_time_sums(c, n, ctx) for c, (n, ctx) in zip(chunks, plan.decodes))

    async def _decode_stretch(self, loop: asyncio.AbstractEventLoop) -> int:
        """Sleep through the decode steps until the first sequence finishes; an arrival cuts
        the stretch short at the end of the step in flight. Returns the steps completed."""
        batch, ctx_sum, steps = self._batch.plan_decode()
        if self.time_scale == 0:
            await asyncio.sleep(0)
            return steps
        if self.cores is not None:  # a neighbour may start or stop: look again soon
            steps = min(steps, _SHARED_STRETCH)
        if self.ranks == 1:
            series = self.cost.decode_series(batch, ctx_sum, steps)
        else:  # lockstep: each step takes as long as the slowest rank's
            series = np.max([self.cost.decode_series(b, c, steps) for b, c in self._batch.rank_batches()], axis=0)
        # Array methods, not np.* wrappers: this runs once per decode stretch.
        ends = series.cumsum()
        with self._computing() as factor:
            if self.time_scale * factor != 1.0:
                ends *= self.time_scale * factor
            start = loop.time()
            self._stretch = (start, ends)
            try:
                if not await self._wake.wait(timeout=float(ends[-1])):
                    self._counters["busy_s"] += loop.time() - start
                    return steps
                done = int(ends.searchsorted(loop.time() - start, side="right"))
                if done < steps:  # the step in flight completes; the arrival joins the next one
                    await asyncio.sleep(float(ends[done]) - (loop.time() - start))
                    done += 1
                self._counters["busy_s"] += loop.time() - start
            finally:
                self._stretch = None
        return done

    async def _sleep(self, seconds: float, busy: bool = True) -> None:
        if not busy:
            await asyncio.sleep(seconds * self.time_scale)
            return
        with self._computing() as factor:
            seconds *= self.time_scale * factor
            self._counters["busy_s"] += seconds
            await asyncio.sleep(seconds)

    def _computing(self) -> contextlib.AbstractContextManager[float]:
        """The time factor of a step starting now: > 1 while engines sharing its cores compute."""
        return contextlib.nullcontext(1.0) if self.cores is None else self.cores.busy(self.engine_id, self._batch.active)


class _Wake:
    """asyncio.Event with a timed wait that costs one future and one timer, not a task: the step
    loop waits once per decode stretch, hundreds of thousands of times in a simulated rollout."""

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future | None = None

    def set(self) -> None:
        self._set = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(True)

    def clear(self) -> None:
        self._set = False

    async def wait(self, timeout: float | None = None) -> bool:
        """True once set; False when `timeout` seconds passed first."""
        if self._set:
            return True
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
        try:
            return await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(False)
