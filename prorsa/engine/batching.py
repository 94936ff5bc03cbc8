"""Continuous-batching bookkeeping of the emulated engine: who waits, who runs, what a step does.

Pure and synchronous: no clock, no asyncio, no cost model. An engine may hold several DP-attention
ranks (an MoE expert-parallel group): each admitted sequence lives on the least-loaded rank, and
each rank gets its own prefill token budget per step; the engine times a step by its slowest rank. The emulated engine's step loop calls
it between sleeps, passing the time; the simulator may reuse it directly.

    submit(seq)                  a request joins the waiting queue, ordered by priority (lower
                                 first; equal priorities first come, first served)
    admissible()                 whether the head of the queue would be admitted now
    admit(now)                   admit in queue order while slots and KV allow -> admitted sequences
                                 (a sequence with nothing to compute finishes right there)
    transfer_done(seq, now)      a pulled KV arrived: the sequence joins the decode batch
    plan_prefill(max_tokens)     the next prefill step: chunks of waiting prefills + all decodes
    apply_prefill(plan, now)     account one prefill (or mixed) step -> finished sequences
    plan_decode()                the decode segment: batch, sum of contexts, steps to next finish
    kv_written(steps)            KV tokens the admitted sequences have written, `steps` decode
                                 steps past the clock (what the engine reports; kv_used is what
                                 admission reserves)
    rank_loads() / rank_batches()  decodes and their context sum per DP-attention rank
    advance(steps, now)          account `steps` decode steps -> finished sequences
    remove(seq)                  a cancelled request leaves, releasing its slot and KV
    relayout(kv_capacity, ranks)  an empty batcher takes another layout (counters kept)

A sequence's life on one engine:

    waiting --admit--> [transferring] --> [prefilling] --> [decoding] --> finished
                       (KV pulled from    (chunks of up    (one token
                        another engine)    to max_tokens)   a step)
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False, slots=True)
class SeqState:
    """Mutable state of one request on one engine (engine-private; results are frozen records)."""

    traj_id: str
    reserve: int  # KV tokens held from admission to finish
    prefill_left: int  # tokens this engine still has to prefill
    prefix: int  # context tokens already in KV before the next prefill chunk
    decode_left: int  # tokens still to generate; 0 = prefill only
    transfer: bool = False  # waits for a KV pull between admission and decoding
    rank: int = 0  # the DP-attention rank serving it (engines with ranks > 1)
    joined: int = 0  # the batcher's decode clock when it started decoding
    end: int = 0  # the decode clock at which it has generated everything
    ctx: int = 0  # KV length the next decode step reads
    arrived: float = 0.0  # engine times (loop clock) of each transition
    admitted: float | None = None
    prefill_end: float | None = None
    decode_start: float | None = None
    finished: float | None = None
    priority: float = 0.0  # its place in the waiting queue: lower first (vLLM's priority policy)
    context: int = 0  # context tokens it brings, set at admission: written from then (the prompt is in hand)
    removed: bool = False  # cancelled: skipped by plans made before the removal
    waiter: Any = field(default=None, repr=False)  # the engine's future for this sequence


@dataclass(frozen=True)
class PrefillPlan:
    chunks: tuple[tuple[SeqState, int], ...]  # (sequence, tokens computed this step)
    decodes: tuple[tuple[int, int], ...]  # per rank: (decodes co-batched, one token each; their context sum)


class Batcher:
    def __init__(self, slots: int, kv_capacity: int, ranks: int = 1):
        self.slots = slots  # sequences admitted at once
        self.kv_capacity = kv_capacity  # KV tokens admitted sequences may reserve
        self.ranks = ranks  # DP-attention ranks: each admitted sequence lives on one
        self._on_rank = [0] * ranks  # admitted sequences per rank
        self.waiting: deque[SeqState] = deque()
        self.transferring: set[SeqState] = set()
        self.prefilling: list[SeqState] = []  # FIFO: the oldest prefill gets the step first
        # Decoding sequences all advance one token a step, so one clock serves them all: a
        # sequence's context is its prefix + (clock - joined), and it finishes at clock == end.
        # A step then costs O(sequences finishing), not O(batch).
        self.decoding: set[SeqState] = set()
        self.clock = 0
        self._ends: list[tuple[int, int, SeqState]] = []  # heap of (end, tiebreak, seq)
        self._tie = itertools.count()
        self._n_dec = [0] * ranks  # decoding sequences per rank
        self._base = [0] * ranks  # per rank: sum of (prefix - joined); context sum = base + n clock
        # What admission reserves: a sequence's whole final KV (context + its decode) from the
        # start, so the emulator never preempts. That is the world's own rule and reads the
        # replayed length; what the engine reports is kv_written(), which a real engine could count.
        self.kv_used = 0
        self._context_kv = 0  # context tokens of admitted sequences not (yet) decoding
        self.prefill_tokens = 0  # counters since start
        self.decode_tokens = 0
        self.steps = 0

    @property
    def active(self) -> int:
        return len(self.transferring) + len(self.prefilling) + len(self.decoding)

    def relayout(self, kv_capacity: int, ranks: int) -> None:
        if self.active or self.waiting:
            raise RuntimeError("relayout of a batcher that holds sequences")
        self.kv_capacity, self.ranks = kv_capacity, ranks
        self._on_rank, self._n_dec, self._base = [0] * ranks, [0] * ranks, [0] * ranks
        self._ends.clear()  # only removed sequences' stale entries are left

    def submit(self, seq: SeqState) -> None:
        if seq.reserve > self.kv_capacity:
            raise ValueError(f"request of trajectory {seq.traj_id} needs {seq.reserve} KV tokens; "
                             f"the engine holds {self.kv_capacity}")
        waiting = self.waiting
        if not waiting or waiting[-1].priority <= seq.priority:
            waiting.append(seq)  # first come (every priority equal: always here)
            return
        # after every sequence of its priority or lower; a queue is short next to a step's work
        lo, hi = 0, len(waiting)
        while lo < hi:
            mid = (lo + hi) // 2
            if waiting[mid].priority <= seq.priority:
                lo = mid + 1
            else:
                hi = mid
        waiting.insert(lo, seq)

    def admissible(self) -> bool:
        head = self.waiting[0] if self.waiting else None
        return (head is not None and self.active < self.slots
                and self.kv_used + head.reserve <= self.kv_capacity)

    def admit(self, now: float) -> list[SeqState]:
        admitted = []
        while self.admissible():  # in order: a head that does not fit blocks the queue (as in vLLM)
            seq = self.waiting.popleft()
            seq.admitted = now
            self.kv_used += seq.reserve
            seq.context = seq.prefix + seq.prefill_left
            self._context_kv += seq.context
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
        budget = [max(max_tokens - d, 1) for d in self._n_dec]
        chunks = []
        for seq in self.prefilling:
            left = budget[seq.rank]
            if left <= 0:
                continue
            n = min(seq.prefill_left, left)
            chunks.append((seq, n))
            budget[seq.rank] = left - n
        return PrefillPlan(tuple(chunks), tuple(self.rank_loads()))

    def apply_prefill(self, plan: PrefillPlan, now: float) -> list[SeqState]:
        self.steps += 1
        finished = self._tick(1, now)
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

    def kv_written(self, steps: int = 0) -> int:
        """Context tokens of every admitted sequence, and the tokens each decoding one has
        generated, `steps` decode steps past the clock (a stretch in flight)."""
        n = sum(self._n_dec)
        return self._context_kv + sum(self._base) + n * (self.clock + steps)

    def plan_decode(self) -> tuple[int, int, int]:
        """(batch, sum of contexts, decode steps until the first sequence finishes)."""
        self._drop_removed()
        n = len(self.decoding)
        return n, sum(self._base) + n * self.clock, self._ends[0][0] - self.clock

    def rank_loads(self) -> list[tuple[int, int]]:
        """Per DP-attention rank: (decoding sequences, sum of their contexts)."""
        return [(n, base + n * self.clock) for n, base in zip(self._n_dec, self._base)]

    def rank_batches(self) -> list[tuple[int, int]]:
        """rank_loads() of the ranks holding decodes."""
        return [(n, c) for n, c in self.rank_loads() if n]

    def advance(self, steps: int, now: float) -> list[SeqState]:
        self.steps += steps
        return self._tick(steps, now)

    def _tick(self, steps: int, now: float) -> list[SeqState]:
        """Every decoding sequence generates `steps` tokens -> those that finished."""
        self.decode_tokens += steps * len(self.decoding)
        self.clock += steps
        finished = []
        while self._ends and self._ends[0][0] <= self.clock:
            seq = heapq.heappop(self._ends)[2]
            if seq.removed or seq not in self.decoding:
                continue
            self._leave(seq)
            seq.ctx, seq.decode_left = seq.ctx + (seq.end - seq.joined), 0
            self._finish(seq, now)
            finished.append(seq)
        return finished

    def _drop_removed(self) -> None:
        while self._ends and self._ends[0][2] not in self.decoding:
            heapq.heappop(self._ends)

    def _leave(self, seq: SeqState) -> None:
        self.decoding.discard(seq)
        self._n_dec[seq.rank] -= 1
        self._base[seq.rank] -= seq.ctx - seq.joined

    def remove(self, seq: SeqState) -> None:
        if seq.removed or seq.finished is not None:
            return
        seq.removed = True
        if seq in self.waiting:
            self.waiting.remove(seq)
            return
        if seq in self.decoding:
            self._leave(seq)
            self.kv_used -= seq.reserve
            self._on_rank[seq.rank] -= 1
            return
        for held in (self.transferring, self.prefilling):
            if seq in held:  # admitted here (not into an earlier batcher): give its KV back
                held.remove(seq)
                self.kv_used -= seq.reserve
                self._context_kv -= seq.context
                self._on_rank[seq.rank] -= 1
                return

    def _start_decode(self, seq: SeqState, now: float) -> None:
        self._context_kv -= seq.context  # counted from here on among the decodes' contexts
        seq.ctx = seq.prefix  # as of `joined`; current: prefix + clock - joined
        seq.decode_start = now
        seq.joined, seq.end = self.clock, self.clock + seq.decode_left
        self.decoding.add(seq)
        self._n_dec[seq.rank] += 1
        self._base[seq.rank] += seq.ctx - seq.joined
        heapq.heappush(self._ends, (seq.end, next(self._tie), seq))

    def _finish(self, seq: SeqState, now: float) -> None:
        seq.finished = now
        self.kv_used -= seq.reserve
        if seq.decode_start is None:  # a decode's context left the count when it began decoding
            self._context_kv -= seq.context
        self._on_rank[seq.rank] -= 1
