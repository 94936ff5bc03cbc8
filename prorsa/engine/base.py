"""The Engine contract: what every inference backend (emulated, vLLM on CPU or GPU) offers.

Called by the runtime's engine tasks (live: a Dask task on the engine's worker; simulated: the
virtual-time cluster). All calls are coroutines on the engine owner's event loop.

    start()             once, when the owning worker starts; loads weights / launches the server
    stop()              once, when the owning worker closes
    prefill(req)        first leg of a disaggregated turn: compute the KV of the context, keep it
                        for a decode engine to pull; returns a KV handle (tiny metadata)
    decode(req)         second leg: pull the KV named by req.kv (or prefill locally when
                        req.kv is None: decode-local incremental prefill) and generate
    generate(req)       a colocated turn: prefill and decode in one request on this engine
    warm(req)           compute the context's KV and keep it in this engine's prefix cache, for
                        the trajectory's next turn here (a migration while its tool runs); no
                        decode engine pulls it
    set_role(role)      bookkeeping and admission: an engine keeps serving what it admitted
    stats()             a snapshot for metrics and the controller; cheap, no I/O
    reset_prefix_cache()  drop every cached prefix (weight updates invalidate them)

Token ids travel only when the engine needs them (`Engine.needs_token_ids`): the emulated
engine works from counts, so a 30k-token SWE context costs nothing to ship through Dask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from prorsa.loads import EngineLoad
from prorsa.roles import Role
from prorsa.sampling import Sampling


@dataclass(frozen=True)
class PrefillRequest:
    traj_id: str  # the trajectory, also the prefix-cache affinity key
    turn: int  # turn index within the trajectory, from 0
    context_tokens: int  # tokens in the context after this turn's append (prompt + history)
    new_tokens: int  # tokens appended this turn (observation or prompt); the rest may be cached
    token_ids: tuple[int, ...] | None = None  # the whole context, when the engine needs ids
    priority: float = 0.0  # lower is admitted sooner; equal ones first come first (control/tail.py)


@dataclass(frozen=True)
class PrefillResult:
    engine_id: str  # engine that computed the KV
    kv: dict[str, Any]  # opaque handle for the decode engine (vLLM: kv_transfer_params)
    cached_tokens: int  # context tokens served from the prefix cache
    queue_s: float  # waiting for admission
    compute_s: float  # in the engine, admission to KV ready


@dataclass(frozen=True)
class DecodeRequest:
    traj_id: str
    turn: int
    context_tokens: int  # tokens in the context before generation
    # the response cap a real run sets (None: none, the engine's context limit bounds the reply);
    # a turn may end sooner, so nothing that plans may read it as the reply's length
    max_tokens: int | None
    token_ids: tuple[int, ...] | None = None
    kv: dict[str, Any] | None = None  # from PrefillResult; None = prefill here (colocated/local)
    new_tokens: int = 0  # when kv is None: tokens to prefill here before decoding
    sampling: Sampling = Sampling()
    seed: int | None = None  # the turn's; a served request's own is sampling.seed
    ignore_eos: bool = True  # decode to the end whatever the model writes; a live agent sets False
    # The world's alone: where a replayed turn ends (the workload's drawn length, standing in for
    # the model's EOS). Only the engine reads it, as the world decoding; None for a live model,
    # which ends its own turn. What a run can know of it comes back in DecodeResult.n_tokens.
    replay_tokens: int | None = None
    priority: float = 0.0  # lower is admitted sooner; equal ones first come first (control/tail.py)


def decode_length(req: DecodeRequest) -> int:
    """How many tokens an engine with no model of EOS (the emulated one) generates for `req`: the
    replayed length, else the cap. An engine's own business, as the world; never a policy's."""
    n = req.replay_tokens if req.replay_tokens is not None else req.max_tokens
    if n is None or n < 1:
        raise ValueError(f"decode of trajectory {req.traj_id} turn {req.turn}: no replayed length and no "
                         f"cap ({req.max_tokens}); an engine that never meets an EOS needs one")
    return n


@dataclass(frozen=True)
class DecodeResult:
    engine_id: str
    n_tokens: int  # tokens generated
    token_ids: tuple[int, ...] = ()  # empty when the engine works from counts
    logprobs: tuple[float, ...] = ()
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # per token: (id, logprob), when asked
    cached_tokens: int = 0  # when this engine prefilled: tokens served from its prefix cache
    queue_s: float = 0.0
    transfer_s: float = 0.0  # pulling the KV from the prefill engine
    prefill_s: float = 0.0  # local prefill (colocated or decode-local)
    decode_s: float = 0.0
    finish_reason: str = "length"


@dataclass(frozen=True)
class EngineStats(EngineLoad):
    """An engine's own reading: its load (prorsa/loads.py) and its counters."""

    prefill_tokens_total: int = 0  # counters since start
    decode_tokens_total: int = 0
    cached_tokens_total: int = 0
    healthy: bool = True
    extra: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class ModelsWeightUpdates(Protocol):
    """An engine that models a trainer's weight update itself (the emulated engine): it stalls for
    the update's body seconds and forgets every cached prefix. Real engines load real weights."""

    async def update_weights(self, body_s: float) -> None: ...


@runtime_checkable
class Engine(Protocol):
    engine_id: str
    role: Role
    needs_token_ids: bool

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def prefill(self, req: PrefillRequest) -> PrefillResult: ...

    async def decode(self, req: DecodeRequest) -> DecodeResult: ...

    async def generate(self, req: DecodeRequest) -> DecodeResult: ...

    async def warm(self, req: PrefillRequest) -> PrefillResult: ...

    def set_role(self, role: Role) -> None: ...

    def stats(self) -> EngineStats: ...

    async def reset_prefix_cache(self) -> None: ...

    async def load_weights(self, model_dir: str | Path) -> None:
        """The trainer's new weights, from a model directory; every cached prefix is dropped."""
        ...
