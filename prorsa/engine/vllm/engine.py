"""VllmEngine: the Engine protocol over one vLLM OpenAI server, token ids in, ids and logprobs out.

    start() / stop()      launch / terminate the server (in a thread: a CPU start takes 20-110 s)
    ensure_healthy()      restart a dead or unresponsive server; True when it restarted
    prefill(req)          POST /v1/completions, max_tokens=1, kv_transfer_params={"do_remote_decode":
                          true}: the engine computes the context's KV and holds it; returns the
                          response's kv_transfer_params as the KV handle
    decode(req)           with req.kv: the same prompt plus that handle, unchanged; the engine pulls
                          the KV over NIXL and generates. Without: prefills locally first (its
                          prefix cache makes only the uncached tail compute)
    generate(req)         one colocated request
    warm(req)             POST /v1/completions, max_tokens=1, no KV transfer: the context's blocks
                          stay in this server's prefix cache for the trajectory's next turn here
    set_role(role)        bookkeeping: any engine serves either leg (connector role kv_both)
    restart_as(role)      take a role whose connector side differs from the server's by restarting
                          it into that side (engines.role_switch restart: kv_roles.py); else set_role
    load_weights(model_dir)   new weights in place from a model directory (vLLM's reload_weights)
    load_shared(manifest)     new weights in place from a trainer's shared-memory region on this
                          node, changed layers only where the manifest says so (worker_ext.py)
    inflight(role) / drain(role)   requests of one leg in flight / wait until none remain
    stats()               from in-flight counters and the last refresh_metrics(); no I/O
    refresh_metrics()     read /metrics (running, waiting, KV usage) for stats()
    reset_prefix_cache()  POST /reset_prefix_cache (needs VLLM_SERVER_DEV_MODE=1, set by server.py)

Legs: prefill() counts as Role.PREFILL, decode() as Role.DECODE (local prefill included),
generate() as Role.MIXED. All coroutines run on the owner's event loop (one httpx client).

Every leg is sent with its request's priority (engine/base.py: lower sooner; protocol.py turns it
into vLLM's int milliseconds); the server admits by it when launched with the priority scheduling
policy (engines.vllm.scheduling_policy, which scheduling.priority sets: engine/registry.py).

A request that fails because the server is down raises EngineUnavailable and starts a restart at
once (not at the worker's next health check), or joins the health check's under way; requests
sent meanwhile wait for it rather than fail. A decode whose KV pull failed raises
KvTransferFailed; any other failed request raises EngineError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from prorsa.config.engines import VllmSettings
from prorsa.engine.base import DecodeRequest, DecodeResult, EngineStats, PrefillRequest, PrefillResult
from prorsa.engine.vllm.errors import EngineError, EngineUnavailable, KvTransferFailed
from prorsa.engine.vllm.kv_roles import IN_PLACE, kv_role
from prorsa.engine.vllm.protocol import Reply, completion_body, gauge, parse_completion
from prorsa.engine.vllm.server import ServerSpec, VllmServer
from prorsa.roles import Role
from prorsa.shared_weights import WeightManifest

log = logging.getLogger(__name__)

# begins the line a restart writes to its server's log: the run's console reads the cause there
# (console/start_progress.py), wherever the engine's worker runs
RESTART_NOTE = "# prorsa: restarting: "


def _why_down(server: VllmServer) -> str:
    return "the server did not answer /health" if server.alive() else "the server's process died"


def note_restart(server: VllmServer, cause: str) -> None:
    try:
        with open(server.log_path, "a") as f:
            f.write(f"\n{RESTART_NOTE}{cause}\n")
    except OSError:  # no log to write to: the worker's own log still says it (engine_host)
        pass


METRICS_FRESH_S = 5.0  # stats() trusts a /metrics snapshot this long


@dataclass(frozen=True)
class _Metrics:
    """A /metrics snapshot."""

    at: float  # time.monotonic() of the read
    running: int
    waiting: int
    kv_usage: float  # fraction of KV blocks in use


@dataclass(frozen=True)
class Placement:
    """Where an engine's server runs: its CPU cores (pinned) and, on a GPU node, its devices."""

    cores: list[int] | None = None
    gpus: tuple[str, ...] | None = None


class VllmEngine:
    needs_token_ids = True

    def __init__(
        self,
        engine_id: str,
        role: Role,
        settings: VllmSettings,
        model_dir: Path,
        placement: Placement,
        log_dir: Path,
        server: VllmServer | None = None,
        switch: str = IN_PLACE,
    ):
        self.engine_id = engine_id
        self.role = role
        self.settings = settings
        self.switch = switch  # kv_roles.py: "in_place" (kv_both) or "restart"
        # `server`: one made by the caller (an engine spanning nodes: its leader's, registry.py)
        self.server = server or VllmServer(
            ServerSpec.from_settings(settings, model_dir, placement.cores, placement.gpus, kv_role(role, switch)),
            Path(log_dir) / f"{engine_id}.log",
        )
        self._client: httpx.AsyncClient | None = None
        self._inflight: Counter[Role] = Counter()
        # contexts of the requests in flight: KV they have written (or are writing) since their
        # admission; what their decodes add is not visible to the client until they return
        self._kv_inflight = 0
        self._totals: Counter[str] = Counter()
        self._metrics: _Metrics | None = None
        self._lock: asyncio.Lock | None = None  # serialises restarts and weight loads
        self._restart: asyncio.Task | None = None  # a restart begun by a request that found the server gone
        # the weights last loaded in place; a restarted server serves its --model (the path
        # every engine shares, which NIXL's handshake compares) and loads these again
        self._weights_dir: Path | None = None
        self._weights_shared: WeightManifest | None = None  # or the shared region last loaded from

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self.server.start)
        self._client = httpx.AsyncClient(
            base_url=self.server.url,
            timeout=self.settings.request_timeout_s,
            # drop idle connections before the server does (uvicorn: 5 s), or a reused one fails with ReadError
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0),
        )

    async def stop(self) -> None:
        if self._restart is not None and self._restart is not asyncio.current_task():
            self._restart.cancel()  # shutting down: a restart must not bring a server back after it
            with contextlib.suppress(asyncio.CancelledError):
                await self._restart
        client, self._client = self._client, None  # before closing: no request picks up a closing client
        if client is not None:
            await client.aclose()
        await asyncio.to_thread(self.server.stop)

    async def ensure_healthy(self) -> bool:
        """Restart the server if it is dead or does not answer /health. True if it restarted.
        One restart at a time, whoever asks (the worker's health watch, a request that found the
        server gone) joins the one under way, and requests wait for it (_wait_for_restart)."""
        return await asyncio.shield(self._restarting())

    def _restarting(self) -> asyncio.Future:
        if self._restart is None or self._restart.done():
            self._restart = asyncio.ensure_future(self._restart_if_unhealthy())
            self._restart.add_done_callback(self._restart_ended)
        return self._restart

    async def _restart_if_unhealthy(self) -> bool:
        async with self._guard():
            if await asyncio.to_thread(self.server.healthy):
                return False
            note_restart(self.server, _why_down(self.server))
            await self.stop()  # from within the restart task: it does not cancel itself
            await self.start()
            await self._reload_newest()
            return True

    def _restart_ended(self, task: asyncio.Future) -> None:
        # retrieved here, so a failure nobody awaited is one line, not asyncio's traceback at exit
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s: restart failed: %s", self.engine_id, task.exception())

    async def load_weights(self, model_dir: str | Path, timeout_s: float = 600.0) -> None:
        """New weights in place, from a model directory in the checkpoint format the server
        loaded (vLLM's reload_weights, through the dev-mode /collective_rpc endpoint): no restart,
        no recompile. Requests in flight go on with the new weights from the next step; every
        cached prefix is dropped, since its KV was computed by the old ones.

        During a restart this waits for it and then loads onto the new server; if the engine is
        down, it raises EngineUnavailable but keeps the directory, which the next restart loads."""
        async with self._guard():
            self._weights_dir, self._weights_shared = Path(model_dir), None
            await self._reload(self._weights_dir, timeout_s)

    async def load_shared(self, manifest: WeightManifest, timeout_s: float = 600.0) -> dict:
        """New weights in place from a trainer's shared-memory region on this node
        (shared_weights.py): the tensors the manifest names, widened to whole layers, go
        through vLLM's in-place reload in the worker (worker_ext.py), with no file in between; every
        cached prefix is dropped. Returns what the worker loaded ({"tensors", "bytes"}). A restart
        reloads the region whole: it holds the newest weights."""
        async with self._guard():
            self._weights_dir = None
            self._weights_shared = manifest.whole()
            return await self._load_shared(manifest, timeout_s)

    async def _load_shared(self, manifest: WeightManifest, timeout_s: float = 600.0) -> dict:
        body = {"method": "prorsa_load_shared", "kwargs": {"manifest": manifest.to_json()}, "timeout": timeout_s}
        r = await self._rpc(body, f"loading weights from {manifest.path}", timeout_s)
        await self.reset_prefix_cache()
        return r.json()["results"][0]

    async def _reload_newest(self) -> None:
        if self._weights_dir is not None:
            await self._reload(self._weights_dir)
        elif self._weights_shared is not None:
            await self._load_shared(self._weights_shared)

    async def _rpc(self, body: dict[str, Any], what: str, timeout_s: float) -> httpx.Response:
        if self._client is None:
            raise EngineUnavailable(f"{self.engine_id}: not started")
        try:
            r = await self._client.post("/collective_rpc", json=body, timeout=timeout_s)
        except httpx.TransportError as e:
            raise EngineUnavailable(f"{self.engine_id}: {e}") from e
        if r.status_code != 200:
            raise EngineError(f"{self.engine_id}: {what} failed ({r.status_code}): {r.text[:300]}")
        return r

    def _guard(self) -> asyncio.Lock:
        self._lock = self._lock or asyncio.Lock()
        return self._lock

    async def _reload(self, model_dir: Path, timeout_s: float = 600.0) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(model_dir)}, "timeout": timeout_s}
        await self._rpc(body, f"reloading weights from {model_dir}", timeout_s)
        await self.reset_prefix_cache()

    # --- the two legs and the colocated turn ------------------------------------------------

    async def prefill(self, req: PrefillRequest) -> PrefillResult:
        return await self._prefill(req, {"do_remote_decode": True})

    async def warm(self, req: PrefillRequest) -> PrefillResult:
        return await self._prefill(req, None)

    async def _prefill(self, req: PrefillRequest, transfer: dict[str, Any] | None) -> PrefillResult:
        body = completion_body(req.token_ids, max_tokens=1, logprobs=False, priority=req.priority)
        if transfer is not None:
            body["kv_transfer_params"] = transfer
        reply = await self._complete(body, Role.PREFILL, kv_tokens=req.context_tokens)
        if transfer is not None and not reply.kv:
            raise EngineError(f"{self.engine_id}: prefill returned no kv_transfer_params (no KV connector?)")
        self._totals["prefill"] += reply.prompt_tokens - reply.cached_tokens
        self._totals["cached"] += reply.cached_tokens
        return PrefillResult(
            engine_id=self.engine_id,
            kv=reply.kv or {},
            cached_tokens=reply.cached_tokens,
            queue_s=reply.queue_s,
            compute_s=reply.first_token_s,
        )

    async def decode(self, req: DecodeRequest) -> DecodeResult:
        return await self._generate(req, Role.DECODE, kv=req.kv)

    async def generate(self, req: DecodeRequest) -> DecodeResult:
        return await self._generate(req, Role.MIXED, kv=None)

    async def _generate(self, req: DecodeRequest, leg: Role, kv: dict[str, Any] | None) -> DecodeResult:
        # vLLM rewinds a seeded request's generator when its prefill is split across scheduler
        # steps, and a CPU generator has no offset to rewind: the engine core dies ("CPU Generator
        # does not use offset"). On CPU a turn samples from the engine's own stream instead.
        seed = req.sampling.seed if req.sampling.seed is not None else req.seed
        seed = seed if self.settings.device != "cpu" else None
        # Replaying, the world decides where the turn ends: a random tiny model is made to write
        # the drawn length by asking exactly that many tokens, EOS ignored. Else the run's cap.
        if req.replay_tokens is not None:
            max_tokens, ignore_eos = req.replay_tokens, True
        else:
            max_tokens, ignore_eos = req.max_tokens, req.ignore_eos
        body = completion_body(req.token_ids, max_tokens, req.sampling, seed, ignore_eos, priority=req.priority)
        if kv is not None:
            body["kv_transfer_params"] = kv  # unchanged: names the prefill engine and its blocks
        reply = await self._complete(body, leg, kv_tokens=req.context_tokens)
        self._totals["decode"] += len(reply.token_ids)
        self._totals["cached"] += reply.cached_tokens
        if kv is None:
            self._totals["prefill"] += reply.prompt_tokens - reply.cached_tokens
        return DecodeResult(
            engine_id=self.engine_id,
            n_tokens=len(reply.token_ids),
            token_ids=reply.token_ids,
            logprobs=reply.logprobs,
            top_logprobs=reply.top_logprobs[:len(reply.token_ids)],
            cached_tokens=reply.cached_tokens,
            queue_s=reply.queue_s,
            transfer_s=reply.first_token_s if kv is not None else 0.0,
            prefill_s=reply.first_token_s if kv is None else 0.0,
            decode_s=reply.decode_s,
            finish_reason=reply.finish_reason,
        )

    def _server_lost(self) -> None:
        """Restart now and hold new requests until it is done: failing them fast would spend each
        turn's retries in the seconds before the health check notices, on an engine that may
        have no stand-in (the only decode engine), and fail the trajectories. A failed restart
        is logged (_restart_ended); the worker's health watch tries again."""
        self._restarting()

    async def _wait_for_restart(self) -> None:
        """Wait out a restart under way; then the request goes to whatever server there is (none:
        EngineUnavailable). Neither the restart's failure nor its cancellation (the engine
        stopping) is the request's own: when the health watch's restart cancelled a request's,
        its waiting legs raised CancelledError, which no retry catches, and their trajectories
        failed."""
        restart = self._restart
        if restart is None or restart.done():
            return
        try:
            await asyncio.shield(restart)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not restart.cancelled() or (task is not None and task.cancelling()):
                raise
        except Exception:
            pass

    async def _core_dead(self) -> bool:
        """The API server still answers but its engine core is gone (vLLM's EngineDeadError: HTTP
        500 to every request until restarted), which /health reports at once. No answer in time
        proves nothing on a busy CPU: the health watch judges that."""
        client = self._client  # None if a restart began meanwhile: that settles it
        if client is None:
            return False
        try:
            r = await client.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return r.status_code != 200

    async def _complete(self, body: dict[str, Any], leg: Role, kv_tokens: int) -> Reply:
        await self._wait_for_restart()
        if self._client is None:
            raise EngineUnavailable(f"{self.engine_id}: not started")
        self._inflight[leg] += 1
        self._kv_inflight += kv_tokens
        t0 = time.monotonic()
        try:
            r = await self._client.post("/v1/completions", json=body)
        except httpx.TransportError as e:  # refused, reset, closed mid-response: the server is gone
            self._server_lost()
            raise EngineUnavailable(f"{self.engine_id}: {type(e).__name__}: {e}") from e
        finally:
            self._inflight[leg] -= 1
            self._kv_inflight -= kv_tokens
        if r.status_code != 200:
            if not self.server.alive() or (r.status_code >= 500 and await self._core_dead()):
                self._server_lost()
                raise EngineUnavailable(f"{self.engine_id}: server died (HTTP {r.status_code})")
            if leg is Role.DECODE and "kv_transfer_params" in body and r.status_code >= 500:
                raise KvTransferFailed(f"{self.engine_id}: HTTP {r.status_code}: {r.text[:300]}")
            raise EngineError(f"{self.engine_id}: HTTP {r.status_code}: {r.text[:300]}")
        return parse_completion(r.json(), time.monotonic() - t0)

    # --- roles and draining ------------------------------------------------------------------

    def set_role(self, role: Role) -> None:
        # No admission change: requests already sent finish here; the router stops sending the
        # old leg, and a caller that must wait for it awaits drain(old_role).
        self.role = role

    async def restart_as(self, role: Role) -> None:
        """Take `role`, restarting the server into the connector side it needs where that is not
        the server's. The caller has emptied the engine first (no leg here, none pulling KV from
        it: the KV a prefill holds dies with the server); a request sent meanwhile waits for the
        new server, as during any restart."""
        want = kv_role(role, self.switch)
        if want != self.server.spec.kv_role:
            await self._wait_for_restart()  # a health restart under way ends first
            self._restart = asyncio.ensure_future(self._restart_into(want))
            self._restart.add_done_callback(self._restart_ended)
            await asyncio.shield(self._restart)
        self.role = role

    async def _restart_into(self, want: str) -> None:
        async with self._guard():
            old = self.server.spec.kv_role
            note_restart(self.server, f"role switch: kv_role {old} -> {want}")
            await self.stop()  # from within the restart task: it does not cancel itself
            self.server.spec = replace(self.server.spec, kv_role=want)
            try:
                await self.start()
            except BaseException:
                # the health watch's restart brings back the side the engine still has
                self.server.spec = replace(self.server.spec, kv_role=old)
                raise
            await self._reload_newest()

    def inflight(self, role: Role | None = None) -> int:
        return sum(self._inflight.values()) if role is None else self._inflight[role]

    async def drain(self, role: Role | None = None, poll_s: float = 0.005) -> None:
        """Return when no request of this leg (or none at all) is in flight."""
        while self.inflight(role):
            await asyncio.sleep(poll_s)

    # --- observation -------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        capacity = self.server.kv_capacity_tokens
        extra = {f"inflight_{leg.value}": float(self._inflight[leg]) for leg in Role}
        m = self._metrics
        if m is not None and time.monotonic() - m.at < METRICS_FRESH_S:
            # the server's own view, as of the last refresh_metrics()
            queued, active, kv_tokens = m.waiting, m.running, int(m.kv_usage * capacity)
            extra["kv_usage"] = m.kv_usage
        else:
            # the client's view: it cannot see admission, so all in flight counts as active, and
            # the KV written is their contexts (tokens decoded since are the server's to count)
            queued, active = 0, self.inflight()
            kv_tokens = min(self._kv_inflight, capacity) if capacity else self._kv_inflight
        return EngineStats(
            engine_id=self.engine_id,
            role=self.role,
            queued=queued,
            active=active,
            kv_tokens=kv_tokens,
            kv_capacity=capacity,
            prefill_tokens_total=self._totals["prefill"],
            decode_tokens_total=self._totals["decode"],
            cached_tokens_total=self._totals["cached"],
            healthy=self.server.alive(),
            extra=extra,
        )

    async def refresh_metrics(self) -> None:
        if self._client is None:
            return
        try:
            text = (await self._client.get("/metrics", timeout=5)).text
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"{self.engine_id}: /metrics: {e}") from e
        self._metrics = _Metrics(
            at=time.monotonic(),
            running=int(gauge(text, "vllm:num_requests_running")),
            waiting=int(gauge(text, "vllm:num_requests_waiting")),
            kv_usage=gauge(text, "vllm:kv_cache_usage_perc"),
        )

    async def reset_prefix_cache(self, timeout_s: float = 60.0) -> None:
        """Drop every cached prefix. vLLM refuses while blocks are held (running requests, KV
        waiting for a decode engine to pull it: up to the NIXL lease, 30 s unless a decode
        engine's heartbeats extend it), so retry until it succeeds or time runs out."""
        if self._client is None:
            raise EngineUnavailable(f"{self.engine_id}: not started")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                r = await self._client.post("/reset_prefix_cache")
            except httpx.TransportError as e:
                raise EngineUnavailable(f"{self.engine_id}: {e}") from e
            if r.status_code == 200 and r.json().get("success", True):
                return
            if r.status_code == 404:
                raise EngineError(f"{self.engine_id}: /reset_prefix_cache missing (VLLM_SERVER_DEV_MODE?)")
            if time.monotonic() > deadline:
                raise EngineError(f"{self.engine_id}: prefix cache reset refused for {timeout_s:.0f} s")
            await asyncio.sleep(0.2)
