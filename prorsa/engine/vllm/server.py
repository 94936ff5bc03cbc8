"""One vLLM OpenAI-compatible server subprocess: launch, health, warm-up, stop, restart.

    (what it launches, its argv and environment: command.py)
    VllmServer(spec, log_path[, peers])          peers: the other nodes of an engine spanning nodes
    serves_us(url)                              the server at url is a vLLM serving our model
      .start()      launch on fresh local ports, wait until it serves us, warm up (blocking: seconds to
                    a minute on CPU, so call it from a thread, not an event loop)
      .alive()      the process is running
      .healthy()    GET /health answers 200
      .stop()       SIGTERM to the API server, SIGKILL to its group after a grace period, wait
      .restart()    stop, then start again (fresh ports, so a half-dead old socket never answers)
    Peers                                       what a server spanning nodes asks of its other nodes

An engine spanning nodes (cluster/nodes.py) is one server per node: the leader's has the API server
and starts as any other, its launch waiting on its followers' ranks; a follower's is headless (no
HTTP: no health, no warm-up): its start returns once the leader serves with its ranks in.

Every engine is a server of its own: an HTTP port, a NIXL side-channel port (how decode engines
reach it to pull KV), its own cores on CPU. The connector role is kv_both, so any engine serves
either leg of a disaggregated turn; a role is only what the router asks of it.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Protocol

import httpx

from prorsa.engine.vllm.command import ServerSpec, build_command, build_env
from prorsa.engine.vllm.errors import EngineUnavailable, PatchBroken
from prorsa.engine.vllm.patches import BROKEN
from prorsa.engine.vllm.protocol import SERVED_NAME

WARMUP_PROMPT = tuple(16 + (7 * i) % 200 for i in range(300))  # > 2 KV blocks of 128 tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serves_us(url: str, timeout_s: float = 2.0) -> bool:
    """A vLLM server binds its HTTP port only after loading the model (a minute on CPU). Until then
    the port picked for it is free for anyone, and a Dask worker's HTTP server, which answers
    /health too, took one once: the start then warmed up against it. Only a server that lists our
    model is ours."""
    try:
        r = httpx.get(f"{url}/v1/models", timeout=timeout_s)
        return r.status_code == 200 and any(m.get("id") == SERVED_NAME for m in r.json().get("data", []))
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def free_ports(count: int, attempts: int = 64) -> int:
    """The first of `count` consecutive free local ports: each DP rank of a server opens its NIXL
    side channel on VLLM_NIXL_SIDE_CHANNEL_PORT + its DP index."""
    for _ in range(attempts):
        first = free_port()
        if first + count - 1 <= 65535 and all(_port_free(first + k) for k in range(1, count)):
            return first
    raise EngineUnavailable(f"no {count} consecutive free local ports for the NIXL side channels")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _own_process_group() -> dict:
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # Python 3.10


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


PORT_CLASH_ATTEMPTS = 3
# written to the server's log once GET /health answers 200 and /v1/models lists our model: vLLM's
# own endpoints say the server is up and serving (console/start_progress.py shows the step)
HEALTHY_NOTE = "# prorsa: /health 200, model served"


class PortClash(EngineUnavailable):
    pass


class Peers(Protocol):
    """The other nodes of an engine spanning nodes, as one node's server sees them
    (cluster/span_host.py). Called from the thread that starts the server."""

    node: int  # this server's node: 0 the leader, the API server's
    nodes: int  # nodes the engine spans
    local_dp: int  # DP ranks on each node

    def args(self) -> list[str]:
        """This launch's DP arguments (nodes.node_args): the leader picks where the ranks meet and
        tells its followers; a follower waits until the leader has (a new launch of it)."""

    def failed(self) -> str | None:
        """Why another node's server of this launch failed; None while none has."""

    def serving(self) -> None:
        """The leader's server serves: every follower's ranks joined."""

    def served(self) -> bool:
        """A follower: the leader serves on this launch."""


class VllmServer:
    def __init__(self, spec: ServerSpec, log_path: Path, peers: Peers | None = None):
        self.spec = spec
        self.log_path = Path(log_path)
        self.peers = peers
        self.headless = False  # this launch is a further node of an engine spanning nodes
        self.port: int | None = None
        self.side_channel_port: int | None = None
        self.start_s = 0.0  # launch to healthy, last start
        self.warmup_s = 0.0  # the warm-up request, last start
        self.kv_capacity_tokens = 0  # from /metrics after start
        self._proc: subprocess.Popen | None = None
        self._reaper: weakref.finalize | None = None
        self._log_from = 0  # where this start's output begins in the log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def alive(self) -> bool:
        """Running, and (an engine spanning nodes) no other node's server of it has failed: the
        ranks step in lockstep, so one node gone stalls or kills them all."""
        running = self._proc is not None and self._proc.poll() is None
        return running and (self.peers is None or self.peers.failed() is None)

    def healthy(self, timeout_s: float = 5.0) -> bool:
        if not self.alive():
            return False
        if self.headless:  # no HTTP: the leader's health answers for its ranks
            return True
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self) -> None:
        """Launch and wait. vLLM picks its internal ZMQ ports itself, after ours were picked but
        before they were bound, so engines starting side by side can take each other's port
        ("Address already in use"): such a start is retried on fresh ports."""
        for attempt in range(1, PORT_CLASH_ATTEMPTS + 1):
            try:
                return self._start_once()
            except PortClash:
                if attempt == PORT_CLASH_ATTEMPTS:
                    raise
                time.sleep(random.uniform(0.5, 2.0))  # let the engines that won settle first

    def _start_once(self) -> None:
        if self.alive():
            raise RuntimeError("server already running; stop() or restart() it")
        self.port, self.side_channel_port = free_port(), free_ports(self.spec.layout.dp)
        cmd = build_command(self.spec, self.port) + (self.peers.args() if self.peers is not None else [])
        self.headless = "--headless" in cmd
        env = build_env(self.spec, self.side_channel_port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n# prorsa: {time.strftime('%F %T')} starting: {' '.join(cmd)}\n".encode())
            log.flush()
            self._log_from = log.tell()
            # own process group, so stop() can signal the whole tree (API server, engine core,
            # workers); same session, so the Linux autogroup scheduler counts the server with its
            # owner and the niced NIXL thread yields to the engine's compute (see _launch.py)
            self._proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                **_own_process_group(),
            )  # fmt: skip
            # which process to look at (or signal) when this engine misbehaves
            log.write(f"# prorsa: server pid {self._proc.pid}\n".encode())
        # never leave a server behind if the owner forgets stop() or the interpreter exits
        self._reaper = weakref.finalize(self, _kill_group, self._proc.pid)
        t0 = time.monotonic()
        try:
            if self.headless:
                self._wait_served(t0 + self.spec.start_timeout_s)
                self.start_s = time.monotonic() - t0
                return
            self._wait_healthy(t0 + self.spec.start_timeout_s)
            self.start_s = time.monotonic() - t0
            self._note(HEALTHY_NOTE)
            self._warm_up()
            self.kv_capacity_tokens = self._read_kv_capacity()
            if self.peers is not None:
                self.peers.serving()
        except BaseException:
            self.stop()
            raise

    def _note(self, text: str) -> None:
        """A line of our own in the server's log, where the run's console reads the start's steps."""
        try:
            with open(self.log_path, "a") as log:
                log.write(f"{text}\n")
        except OSError:
            pass

    def _this_start(self) -> str:
        """This start's output in the log."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_from)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _port_clash(self) -> bool:
        """This start's log shows a lost race for a port (the server may hang rather than exit)."""
        return "Address already in use" in self._this_start()

    def _wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self._port_clash():
                raise PortClash(f"vLLM server lost a port race on start; see {self.log_path}")
            self._check_running()
            if self.healthy(timeout_s=2.0) and serves_us(self.url):
                return  # another server on the port: vLLM's bind fails and the log shows the clash
            time.sleep(0.5)
        raise EngineUnavailable(
            f"vLLM server not healthy after {self.spec.start_timeout_s:.0f} s; "
            f"last lines of {self.log_path}:\n{self.log_tail()}"
        )

    def _check_running(self) -> None:
        if self._proc is None:  # stop() from another thread: the worker is going
            raise EngineUnavailable("vLLM server stopped while starting")
        if self._proc.poll() is not None:
            # a patch the launcher refused (patches.py): its line says what changed, and is the failure
            if broken := [ln for ln in self._this_start().splitlines() if ln.startswith(BROKEN)]:
                raise PatchBroken("\n".join(broken) + f" (log: {self.log_path})")
            raise EngineUnavailable(
                f"vLLM server exited with code {self._proc.returncode} while starting; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            )
        if self.peers is not None and (why := self.peers.failed()):
            raise EngineUnavailable(f"vLLM server spanning nodes: {why}")

    def _wait_served(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_running()
            if self.peers.served():
                return
            time.sleep(0.5)
        raise EngineUnavailable(
            f"the leader of this headless vLLM node did not serve within {self.spec.start_timeout_s:.0f} s; "
            f"last lines of {self.log_path}:\n{self.log_tail()}"
        )

    def _warm_up(self) -> None:
        # The first request on a cold server pays lazy initialisation; pay it here, logprobs
        # included (that path has lazy parts of its own).
        body = {"model": SERVED_NAME, "prompt": list(WARMUP_PROMPT), "max_tokens": 4, "logprobs": 0}
        t0 = time.monotonic()
        r = httpx.post(f"{self.url}/v1/completions", json=body, timeout=self.spec.start_timeout_s)
        if r.status_code != 200:
            raise EngineUnavailable(f"warm-up request failed: HTTP {r.status_code} {r.text[:500]}")
        self.warmup_s = time.monotonic() - t0

    def _read_kv_capacity(self) -> int:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        info = next((ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info")), "")
        blocks = re.search(r'num_gpu_blocks="(\d+)"', info)
        block = re.search(r'block_size="(\d+)"', info)
        return int(blocks.group(1)) * int(block.group(1)) if blocks and block else 0

    def stop(self, grace_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            # the API server alone: it stops its engine core and workers in order. Signalled with
            # them, the core dies first and the server logs an EngineDeadError at every shutdown
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(proc.pid)  # whatever of the tree is left, including orphans of a killed leader
        proc.wait()
        if self._reaper is not None:
            self._reaper.detach()

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except OSError:
            return "(no log)"
