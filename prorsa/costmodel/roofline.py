"""Roofline step-time model of one engine (a TP group, or one DP-attention rank of an EP group).

Called by the emulated engine (every step it runs), the simulator and the allocator (what one
engine serves in each role, and what a switch costs). Pure arithmetic on constants resolved once
in __init__: no I/O, no YAML, no clock; cheap enough for ~1e6 calls per simulated rollout.

    prefill_time(chunks)            one batched prefill step; chunks = (new, cached_prefix) per seq
    decode_time(contexts)           one decode step; contexts = KV length per sequence
    mixed_time(chunks, contexts)    one chunked-prefill step co-batched with decodes
    mixed_time_sums(chunks, n, c)   the same, the decodes given as their count and context sum
    decode_series(batch, ctx, k)    k consecutive decode steps (contexts grow by one a step)
    prefill_compute_time(n, c)      prefill compute alone (no overhead, no weight reads): bounds
    decode_token_time(ctx, batch)   one sequence's share of a full decode step: bounds
    kv_transfer_time(tokens, link)  pulling `tokens` of KV over "net" or "nvlink"
    switch_time(from, to, ...)      draining before a role switch (+ resharding, to another layout)
    reshard_time(to)                moving the weights into another layout's parallelism
    weight_update_time(bytes, link) a trainer's weight update: a fixed cost + the bytes it moves over
                                    the trainer's link to this engine (its node's memory, or the NIC)
    layout                          (tp, ep): how the engine's GPUs are laid out
    kv_capacity_tokens()            KV tokens that fit beside the weights
    touched_weight_bytes(tokens)    weight bytes one step streams (MoE: only the hit experts)

The model (shared/FACTS.md, "Cost-model starting values"), per step of T tokens over S sequences:

    compute = (2 P_act T + 2 V h S) / (MFU_lin peak TP)           linear layers (+ lm_head per seq)
            + 4 L Hq dh sum(n (c + n/2)) / (MFU_attn peak TP)      attention; a decode is n = 1
    memory  = (W_touched(T) + kv_per_token sum(c)) / (TP eta BW)   weights and KV read once a step
    W_touched(T) = W_nonexpert + L (E/EP) (1 - (1 - k/E)^(T EP)) W_expert     (dense: all weights)
    step    = T_oh + max(compute, memory) + all-reduce (TP) + all-to-all (EP)

Prefill steps also read the KV of their cached prefix (FACTS omits it; it only matters for a
tiny extend on a long prefix, where it keeps prefill(1, c) from being cheaper than decode(c)).
EP models one DP-attention rank: its own batch through attention, experts sharded EP ways and fed
by all ranks (assumed balanced). The input embedding is resident but not streamed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from prorsa.costmodel.profiles import GpuProfile, ModelProfile, load_gpu, load_model
from prorsa.roles import Role, restarts_kv

_ACT_BYTES = 2  # bf16 activations in collectives
# Fixed seconds of a weight update besides moving its bytes: the engine's load call through
# /collective_rpc, reprocessing a model's layers and the prefix-cache reset. Evidence: the tiny shape's
# memory-path update on one vLLM CPU engine (4 MB: the bytes cost nothing), median of 3
# (benchmarks/results/weight-sync-paths.json, shapes tiny, 0.5b, 1.5b); on GPUs an estimate [E].
WEIGHT_UPDATE_FIXED_S = 0.47


class CostModel:
    def __init__(self, gpu: GpuProfile, model: ModelProfile, tp: int = 1, ep: int = 1, *,
                 mem_fraction: float = 0.9, switch_prefill_tokens: int = 8192, restart_s: float | None = None):
        if tp < 1 or ep < 1:
            raise ValueError(f"tp and ep must be >= 1, got tp={tp} ep={ep}")
        if ep > 1 and not model.is_moe:
            raise ValueError(f"ep={ep} needs an MoE model; {model.name} is dense")
        if not 0 < mem_fraction <= 1:
            raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
        self.gpu, self.model, self.tp, self.ep = gpu, model, tp, ep
        self.mem_fraction = mem_fraction  # like vLLM's gpu_memory_utilization
        self.switch_prefill_tokens = switch_prefill_tokens  # the prefill step a switch waits out
        # engines switched by restart (engines.role_switch): what a restart into the other KV
        # connector side costs once the engine is empty; None: every switch is in place
        self.restart_s = restart_s

        m, g = model, gpu
        peak = (g.peak_flops_fp8 if m.weight_bytes == 1 else g.peak_flops) * tp
        self._lin_s = 2 * m.params_active / (m.mfu_linear * peak)  # per token
        self._head_s = 2 * m.vocab * m.hidden / (m.mfu_linear * peak)  # lm_head, per sequence
        self._attn_s = 4 * m.layers * m.q_heads * m.head_dim / (g.mfu_attn * peak)  # per n(c+n/2)

        bw = tp * g.bw_efficiency * g.hbm_bw
        expert_all = m.layers * m.experts * m.expert_params * m.weight_bytes
        streamed = (m.params_total - m.params_embedding) * m.weight_bytes - expert_all
        self._w_dense_s = streamed / bw  # non-expert weights (all of a dense model)
        self._w_expert_s = expert_all / ep / bw  # this rank's experts, if every one is hit
        self._miss = 1 - m.experts_per_token / m.experts if m.is_moe else 0.0  # per routed token
        # KV heads split over TP ranks; past kv_heads ranks they are replicated, not split.
        self._kv_shards = min(tp, m.kv_heads)
        self._kv_s = m.kv_bytes_per_token / (self._kv_shards * g.bw_efficiency * g.hbm_bw)

        # Two all-reduces per layer (attention out, MLP out), ring: 2 (TP-1)/TP of the payload.
        nvlink = g.nvlink_bw * g.nvlink_efficiency
        self._ar_fixed = 2 * m.layers * g.collective_latency_s if tp > 1 else 0.0
        self._ar_s = (2 * m.layers * 2 * (tp - 1) / tp * m.hidden * _ACT_BYTES / nvlink
                      if tp > 1 else 0.0)  # per token
        # Dispatch + combine per MoE layer: k copies of each token, (EP-1)/EP leave the rank.
        link = nvlink if tp * ep <= g.gpus_per_node else g.net_bw
        self._a2a_fixed = 2 * m.layers * g.collective_latency_s if ep > 1 else 0.0
        self._a2a_s = (2 * m.layers * m.experts_per_token * m.hidden * _ACT_BYTES
                       * (ep - 1) / ep / link if ep > 1 else 0.0)  # per token
        self._oh = g.step_overhead_s

    @classmethod
    def from_names(cls, gpu: str, model: str, tp: int = 1, ep: int = 1, **kwargs) -> CostModel:
        return cls(load_gpu(gpu), load_model(model), tp=tp, ep=ep, **kwargs)

    def __repr__(self) -> str:
        return f"CostModel({self.gpu.name}, {self.model.name}, tp={self.tp}, ep={self.ep})"

    @property
    def layout(self) -> tuple[int, int]:
        """(tp, ep): two cost models of one engine with the same layout price every step alike."""
        return self.tp, self.ep

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    # -- step times ------------------------------------------------------------------------

    def prefill_time(self, chunks: Sequence[tuple[int, int]]) -> float:
        return self.mixed_time(chunks, ())

    def decode_time(self, contexts: Sequence[int]) -> float:
        n = len(contexts)
        if n == 0:
            return 0.0
        ctx = float(sum(contexts))
        return self.step_time(n, n, ctx + 0.5 * n, ctx)

    def mixed_time(self, chunks: Sequence[tuple[int, int]], contexts: Sequence[int]) -> float:
        return self.mixed_time_sums(chunks, len(contexts), float(sum(contexts)))

    def mixed_time_sums(self, chunks: Sequence[tuple[int, int]], n: int, ctx: float) -> float:
        """mixed_time with the decodes given as their count and context sum."""
        tokens = seqs = 0
        attn = kv = 0.0
        for new, cached in chunks:
            if new > 0:
                tokens += new
                seqs += 1
                attn += new * (cached + 0.5 * new)
                kv += cached
        if n:
            tokens += n
            seqs += n
            attn += ctx + 0.5 * n
            kv += ctx
        return self.step_time(tokens, seqs, attn, kv) if tokens else 0.0

    def step_time(self, tokens: int, seqs: int, attn_units: float, kv_read_tokens: float) -> float:
        """The roofline of one step from its sums: `tokens` computed over `seqs` sequences,
        attention work sum(n (c + n/2)), and `kv_read_tokens` of KV streamed."""
        compute, memory, comm = self._terms(tokens, seqs, attn_units, kv_read_tokens)
        return self._oh + (compute if compute > memory else memory) + comm

    def step_times(self, tokens: np.ndarray, seqs: np.ndarray, attn_units: np.ndarray,
                   kv_read_tokens: np.ndarray) -> np.ndarray:
        """step_time over arrays of steps at once (the allocator prices a grid of batches)."""
        compute, memory, comm = self._terms(tokens, seqs, attn_units, kv_read_tokens)
        return self._oh + np.maximum(compute, memory) + comm

    def _terms(self, tokens, seqs, attn_units, kv_read_tokens):
        """(compute, memory, communication) seconds of a step; scalars or arrays alike."""
        compute = self._lin_s * tokens + self._head_s * seqs + self._attn_s * attn_units
        weights = self._w_dense_s
        if self._w_expert_s:
            weights = weights + self._w_expert_s * (1.0 - self._miss ** (tokens * self.ep))
        memory = weights + self._kv_s * kv_read_tokens
        comm = 0.0
        if self._ar_fixed:
            comm += self._ar_fixed + self._ar_s * tokens
        if self._a2a_fixed:
            comm += self._a2a_fixed + self._a2a_s * tokens
        return compute, memory, comm

    def decode_series(self, batch: int, ctx_sum: float, steps: int) -> np.ndarray:
        """Times of `steps` consecutive decode steps of `batch` sequences whose contexts sum to
        `ctx_sum` at the first step; each step adds one token to every context. Equals
        [decode_time(contexts + i) for i in range(steps)], vectorised."""
        if batch <= 0 or steps <= 0:
            return np.zeros(max(steps, 0))
        # Runs once per decode stretch, so the arrays are updated in place (two allocations, not
        # nine); each element sees the same operations as the formula in step_time, so the
        # times are bit-identical to it (IEEE + and * commute exactly).
        weights = self._w_dense_s
        if self._w_expert_s:
            weights += self._w_expert_s * (1.0 - self._miss ** (batch * self.ep))
        comm = 0.0
        if self._ar_fixed:
            comm += self._ar_fixed + self._ar_s * batch
        if self._a2a_fixed:
            comm += self._a2a_fixed + self._a2a_s * batch
        ctx = np.arange(steps, dtype=float)
        ctx *= batch
        ctx += ctx_sum  # each step's context sum
        step = ctx + 0.5 * batch
        step *= self._attn_s
        step += self._lin_s * batch + self._head_s * batch  # compute
        ctx *= self._kv_s
        ctx += weights  # memory
        np.maximum(step, ctx, out=step)
        step += self._oh
        if comm:  # adding 0.0 changes nothing but costs an array pass
            step += comm
        return step

    def prefill_compute_time(self, new: int, cached: int) -> float:
        """The compute of prefilling `new` tokens on `cached` ones, with no step overhead and no
        weight reads: what batching with others can never make cheaper (for lower bounds)."""
        if new <= 0:
            return 0.0
        return self._lin_s * new + self._head_s + self._attn_s * new * (cached + 0.5 * new)

    def decode_token_time(self, context: float, batch: int) -> float:
        """One sequence's share of a decode step in a full batch of `batch` at `context`."""
        b = max(batch, 1)
        return self.step_time(b, b, b * (context + 0.5), b * context) / b

    def touched_weight_bytes(self, tokens: int) -> float:
        """Weight bytes one step of `tokens` tokens streams on this engine (all TP ranks)."""
        bw = self.tp * self.gpu.bw_efficiency * self.gpu.hbm_bw
        hit = 1.0 - self._miss ** (tokens * self.ep) if self._w_expert_s else 0.0
        return (self._w_dense_s + self._w_expert_s * hit) * bw

    # -- transfer, switch, memory ------------------------------------------------------------

    def kv_transfer_time(self, tokens: int, link: str = "net") -> float:
        """Pulling `tokens` of KV: each TP rank pulls its KV-head shard over its own link."""
        if tokens <= 0:
            return 0.0
        g = self.gpu
        if link == "net":
            bw, fixed = g.net_bw, g.net_latency_s
        elif link == "nvlink":
            bw, fixed = g.nvlink_bw * g.nvlink_efficiency, g.collective_latency_s
        else:
            raise ValueError(f"link must be 'net' or 'nvlink', got {link!r}")
        return fixed + tokens * self.kv_bytes_per_token / (self._kv_shards * bw)

    def switch_time(self, from_role: Role, to_role: Role, inflight_decode_tokens: int = 0,
                    batch: int = 0, *, context_tokens: int = 0, to_cost: CostModel | None = None) -> float:
        """Drain time before `from_role` -> `to_role` takes effect; this model is the engine's in
        `from_role`, `to_cost` its model in `to_role` (None: the same layout).

        Into MIXED nothing drains. Leaving prefill waits out the prefill step in flight.
        Leaving decode waits out the in-flight decodes: `inflight_decode_tokens` still to generate
        over `batch` sequences holding `context_tokens` of KV. Remaining lengths are taken as
        uniform, so the longest is ~2x the mean and the batch shrinks linearly to zero.
        Into another layout (stage-specific parallelism) the engine empties first, whatever the
        roles: a sequence's KV is sharded by the old layout and no engine reshards KV in flight;
        then the weights move (reshard_time). Across the KV connector's sides on an engine switched
        by restart (roles.py restarts_kv) it empties too, then restarts (restart_s).
        """
        restart = self.restart_s is not None and restarts_kv(from_role, to_role)
        if restart or (to_cost is not None and to_cost.layout != self.layout):
            drain = 0.0
            if from_role.serves_decode:
                drain = self._decode_drain(inflight_decode_tokens, batch, context_tokens)
            if from_role.serves_prefill:
                drain = max(drain, self.prefill_time([(self.switch_prefill_tokens, 0)]))
            return drain + (self.restart_s if restart else 0.0) + (self.reshard_time(to_cost) if to_cost else 0.0)
        if from_role is to_role or to_role is Role.MIXED:
            return 0.0
        if to_role is Role.DECODE:  # from PREFILL or MIXED: a prefill chunk may be in flight
            return self.prefill_time([(self.switch_prefill_tokens, 0)])
        return self._decode_drain(inflight_decode_tokens, batch, context_tokens)

    def _decode_drain(self, inflight_decode_tokens: int, batch: int, context_tokens: int) -> float:
        if batch <= 0 or inflight_decode_tokens <= 0:
            return 0.0
        steps = min(inflight_decode_tokens, math.ceil(2 * inflight_decode_tokens / batch))
        half = max(1, batch // 2)  # the average batch while draining
        return steps * self.step_time(half, half, context_tokens / 2 + 0.5 * half,
                                      context_tokens / 2)

    def reshard_time(self, to: CostModel) -> float:
        """Seconds to move this engine's weights into `to`'s layout on the same GPUs, once empty.

        Assumed: every GPU pulls its whole new shard from its peers at once (the group already
        holds every weight between them, so nothing comes from host memory or disk), over NVLink
        inside a node and the NIC across nodes. Both layouts' CUDA graphs are taken as captured at
        start (capturing them takes vLLM and SGLang seconds, which a switch could not afford).
        What an empty engine does lose is its prefix cache: the old layout's KV is gone, so the
        next turns of its trajectories re-prefill (the emulated engine models that)."""
        if to.layout == self.layout:
            return 0.0
        g = to.gpu
        per_gpu = to.weight_bytes_resident() / to.tp  # an EP rank's weights over its TP GPUs
        link = g.nvlink_bw * g.nvlink_efficiency if to.tp * to.ep <= g.gpus_per_node else g.net_bw
        return g.step_overhead_s + g.collective_latency_s + per_gpu / link

    def weight_update_time(self, nbytes: float | None = None, link: str = "node") -> float:
        """Seconds to load a weight update into this engine, priced by the bytes it moves: every
        rank loads its share at once, over `link`, after a fixed cost per update (the load call and
        dropping every cached prefix). "node": the trainer on the engine's node hands the weights
        over in memory (CUDA IPC over NVLink; on a CPU profile nvlink_bw is the host's copy rate
        between processes); "net": from another node over the NIC. `nbytes`: the bytes one update
        moves into the engine (None: all its weights; fewer when only changed tensors move)."""
        if link not in ("node", "net"):
            raise ValueError(f"link: 'node' or 'net', not {link!r}")
        g = self.gpu
        moved = self.weight_bytes_resident() if nbytes is None else nbytes
        rate = g.nvlink_bw * g.nvlink_efficiency if link == "node" else g.net_bw
        if g.weight_load_bw > 0:  # the engine's own processing of what arrives, where it is slower
            rate = min(rate, g.weight_load_bw)
        return WEIGHT_UPDATE_FIXED_S + moved / self.tp / rate

    def weight_bytes_resident(self) -> float:
        """Weight bytes held by this engine (all its TP ranks; EP: this rank's experts)."""
        m = self.model
        expert_all = m.layers * m.experts * m.expert_params * m.weight_bytes
        return m.params_total * m.weight_bytes - expert_all + expert_all / self.ep

    def kv_capacity_tokens(self) -> int:
        """KV tokens that fit in mem_fraction of the engine's memory beside its weights
        (activations and CUDA graphs are inside the (1 - mem_fraction) margin)."""
        free = self.tp * self.gpu.hbm_bytes * self.mem_fraction - self.weight_bytes_resident()
        per_token = self.kv_bytes_per_token * self.tp / self._kv_shards  # replication past kv_heads
        return max(0, int(free // per_token))
