"""Continuous-batching bookkeeping of the emulated engine: who waits, who runs, what a step does.

Pure and synchronous: no clock, no asyncio, no cost model. An engine may hold several DP-attention
ranks (an MoE expert-parallel group): each admitted sequence lives on the least-loaded rank, and
each rank gets its own prefill token budget per step; the engine times a step by its slowest rank. The emulated engine's step loop calls
it between sleeps, passing the time; the simulator may reuse it directly.

    submit(seq)                  a request joins the FIFO waiting queue
    admissible()                 whether the head of the queue would be admitted now
    admit(now)                   admit FIFO while slots and KV allow -> admitted sequences
                                 (a sequence with nothing to compute finishes right there)
    transfer_done(seq, now)      a pulled KV arrived: the sequence joins the decode batch
    plan_prefill(max_tokens)     the next prefill step: chunks of waiting prefills + all decodes
    apply_prefill(plan, now)     account one prefill (or mixed) step -> finished sequences
    plan_decode()                the decode segment: batch, sum of contexts, steps to next finish
    rank_batches()               the same batch per DP-attention rank (ranks > 1)
    advance(steps, now)          account `steps` decode steps -> finished sequences
    remove(seq)                  a cancelled request leaves, releasing its slot and KV

A sequence's life on one engine:

    waiting --admit--> [transferring] --> [prefilling] --> [decoding] --> finished
                       (KV pulled from    (chunks of up    (one token
                        another engine)    to max_tokens)   a step)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class SeqState:
    """Mutable state of one request on one engine (engine-private; results are frozen records)."""

    traj_id: str
    reserve: int  # KV tokens held from admission to finish
    prefill_left: int  # tokens this engine still has to prefill
    prefix: int  # context tokens already in KV before the next prefill chunk
    decode_left: int  # tokens still to generate; 0 = prefill only
    transfer: bool = False  # waits for a KV pull between admission and decoding
    rank: int = 0  # the DP-attention rank serving it (engines with ranks > 1)
    ctx: int = 0  # KV length the next decode step reads
    arrived: float = 0.0  # engine times (loop clock) of each transition
    admitted: float | None = None
    prefill_end: float | None = None
    decode_start: float | None = None
    finished: float | None = None
    removed: bool = False  # cancelled: skipped by plans made before the removal
    waiter: Any = field(default=None, repr=False)  # the engine's future for this sequence


@dataclass(frozen=True)
class PrefillPlan:
    chunks: tuple[tuple[SeqState, int], ...]  # (sequence, tokens computed this step)
    decodes: tuple[SeqState, ...]  # decodes co-batched in the same step (one token each)


class Batcher:
    def __init__(self, slots: int, kv_capacity: int, ranks: int = 1):
        self.slots = slots  # sequences admitted at once
        self.kv_capacity = kv_capacity  # KV tokens admitted sequences may reserve
        self.ranks = ranks  # DP-attention ranks: each admitted sequence lives on one
        self._on_rank = [0] * ranks  # admitted sequences per rank
        self.waiting: deque[SeqState] = deque()
        self.transferring: set[SeqState] = set()
        self.prefilling: list[SeqState] = []  # FIFO: the oldest prefill gets the step first
        self.decoding: list[SeqState] = []
        self.kv_used = 0  # KV tokens reserved by admitted sequences
        self.prefill_tokens = 0  # counters since start
        self.decode_tokens = 0
        self.steps = 0

    @property
    def active(self) -> int:
        return len(self.transferring) + len(self.prefilling) + len(self.decoding)

    def submit(self, seq: SeqState) -> None:
        if seq.reserve > self.kv_capacity:
            raise ValueError(f"request of trajectory {seq.traj_id} needs {seq.reserve} KV tokens; "
                             f"the engine holds {self.kv_capacity}")
        self.waiting.append(seq)

    def admissible(self) -> bool:
        head = self.waiting[0] if self.waiting else None
        return (head is not None and self.active < self.slots
                and self.kv_used + head.reserve <= self.kv_capacity)

    def admit(self, now: float) -> list[SeqState]:
        admitted = []
        while self.admissible():  # FIFO: a head that does not fit blocks the queue (vLLM FCFS)
            seq = self.waiting.popleft()
            seq.admitted = now
            self.kv_used += seq.reserve
            if self.ranks > 1:
                seq.rank = min(range(self.ranks), key=self._on_rank.__getitem__)
            self._on_rank[seq.rank] += 1
            if seq.transfer:
                self.transferring.add(seq)
            elif seq.prefill_left > 0:
                self.prefilling.append(seq)
            elif seq.decode_left > 0:
                self._start_decode(seq, now)
            else:  # nothing to compute (a fully cached prefill): done on admission
                seq.prefill_end = now
                self._finish(seq, now)
            admitted.append(seq)
        return admitted

    def transfer_done(self, seq: SeqState, now: float) -> None:
        self.transferring.discard(seq)
        if seq.removed:
            return
        if seq.decode_left > 0:
            self._start_decode(seq, now)
        else:
            self._finish(seq, now)

    def plan_prefill(self, max_tokens: int) -> PrefillPlan:
        # Per rank: decodes go first (one token each), prefill chunks fill the rest of the token
        # budget; at least one prefill token runs so a full decode batch cannot starve prefills.
        decodes = [0] * self.ranks
        for seq in self.decoding:
            decodes[seq.rank] += 1
        budget = [max(max_tokens - d, 1) for d in decodes]
        chunks = []
        for seq in self.prefilling:
            left = budget[seq.rank]
            if left <= 0:
                continue
            n = min(seq.prefill_left, left)
            chunks.append((seq, n))
            budget[seq.rank] = left - n
        return PrefillPlan(tuple(chunks), tuple(self.decoding))

    def apply_prefill(self, plan: PrefillPlan, now: float) -> list[SeqState]:
        self.steps += 1
        finished = self._decode_one(plan.decodes, now)
        for seq, n in plan.chunks:
            if seq.removed:
                continue
            seq.prefill_left -= n
            seq.prefix += n
            self.prefill_tokens += n
            if seq.prefill_left == 0:
                self.prefilling.remove(seq)
                seq.prefill_end = now
                if seq.decode_left > 0:
                    self._start_decode(seq, now)
                else:
                    self._finish(seq, now)
                    finished.append(seq)
        return finished

    def plan_decode(self) -> tuple[int, int, int]:
        """(batch, sum of contexts, decode steps until the first sequence finishes)."""
        return (len(self.decoding), sum(s.ctx for s in self.decoding),
                min(s.decode_left for s in self.decoding))

    def rank_batches(self) -> list[tuple[int, int]]:
        """Per DP-attention rank holding decodes: (batch, sum of contexts)."""
        out = [[0, 0] for _ in range(self.ranks)]
        for seq in self.decoding:
            out[seq.rank][0] += 1
            out[seq.rank][1] += seq.ctx
        return [(b, c) for b, c in out if b]

    def advance(self, steps: int, now: float) -> list[SeqState]:
        self.steps += steps
        self.decode_tokens += steps * len(self.decoding)
        finished = []
        for seq in self.decoding:
            seq.ctx += steps
            seq.decode_left -= steps
            if seq.decode_left <= 0:
                finished.append(seq)
        if finished:
            self.decoding = [s for s in self.decoding if s.decode_left > 0]
            for seq in finished:
                self._finish(seq, now)
        return finished

    def remove(self, seq: SeqState) -> None:
        if seq.removed or seq.finished is not None:
            return
        seq.removed = True
        if seq in self.waiting:
            self.waiting.remove(seq)
            return
        for held in (self.transferring, self.prefilling, self.decoding):
            if seq in held:  # admitted here (not into an earlier batcher): give its KV back
                held.remove(seq)
                self.kv_used -= seq.reserve
                self._on_rank[seq.rank] -= 1
                return

    def _decode_one(self, decodes: tuple[SeqState, ...], now: float) -> list[SeqState]:
        live = tuple(s for s in decodes if not s.removed)
        if not live:
            return []
        self.decode_tokens += len(live)
        for seq in live:
            seq.ctx += 1
            seq.decode_left -= 1
        done = [s for s in live if s.decode_left <= 0]
        if done:
            self.decoding = [s for s in self.decoding if s.decode_left > 0]
            for seq in done:
                self._finish(seq, now)
        return done

    def _start_decode(self, seq: SeqState, now: float) -> None:
        seq.ctx = seq.prefix
        seq.decode_start = now
        self.decoding.append(seq)

    def _finish(self, seq: SeqState, now: float) -> None:
        seq.finished = now
        self.kv_used -= seq.reserve
        self._on_rank[seq.rank] -= 1
