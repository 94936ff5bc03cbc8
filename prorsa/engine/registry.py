"""Engine backends by name: the pipeline's `engines.backend` picks one, an EngineBackend that
answers every question the rest of prorsa asks of a backend, so nothing past the schema tests the name.

    backend_of(engines) -> EngineBackend    that section's backend (BACKENDS: the classes by name)
    make_engine(index, role, cfg, run_dir, gpus) -> Engine   called once per engine, where it will live;
                                                            gpus: a CUDA engine's own (cluster/devices.py)
                                                            peers: the other nodes of an engine spanning
                                                            nodes, when this is its leader
    node_server(index, cfg, run_dir, peers) -> VllmServer   a further node's headless server of that engine
    hosted_engines(pipeline) -> EnginesConfig           the engines section the engine hosts get
    resolve_model_dir(engines) -> Path                  a vLLM model's directory, a tiny one made on first use

An EngineBackend, for one engines section (EmulatedBackend, VllmBackend):
    name, time_scaled, launches_servers, measurable, vllm_layout    what the backend is (class-wide)
    on_gpus, pins_cores, start_timeout_s                            where its engines run, how long one starts
    make_engine(...), model_dir(), unavailable(), portable(), admitting_by_priority(), switch_path()

Imports are lazy so a machine without vLLM runs emulated engines.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from prorsa.config.engines import EnginesConfig
from prorsa.config.pipeline import PipelineConfig
from prorsa.engine.base import Engine
from prorsa.engine.core_share import engine_cores, node_share
from prorsa.roles import Role


class EngineBackend(Protocol):
    """What the rest of prorsa asks of an engine backend, answered for one engines section."""

    name: ClassVar[str]  # engines.backend
    time_scaled: ClassVar[bool]  # honours engines.time_scale (wall seconds per body second)
    # its engines are server processes: a log each under the run's engines/ (start progress is read
    # off it), command lines in the launch plan, ranks that may span nodes
    launches_servers: ClassVar[bool]
    measurable: ClassVar[bool]  # prorsa calibrate measures one (an emulated engine's times are the cost model)
    vllm_layout: ClassVar[bool]  # engines.tp and ep were read off engines.vllm's layout (config/engines.py)
    on_gpus: bool  # its engines take GPUs: batch jobs book them, the device plan hands them out
    pins_cores: bool  # its engines are pinned to host cores they share (engine/core_share.py)
    start_timeout_s: float  # how long an engine may take to start again: what turns and the cluster wait out

    def make_engine(self, index: int, role: Role, run_dir: Path, gpus: tuple[str, ...] | None = None,
                    peers=None) -> Engine: ...

    def model_dir(self) -> Path | None:
        """The model its engines run, made on first use; None: they run none."""

    def unavailable(self) -> str | None:
        """What this machine lacks to start its engines, before anything starts; None: nothing."""

    def portable(self) -> EnginesConfig:
        """The engines section with absolute paths: a batch job may start in another directory."""

    def admitting_by_priority(self) -> EnginesConfig:
        """The engines section with its engines admitting requests by their priority."""

    def switch_path(self) -> str:
        """How its engines change role, engines.role_switch resolved: "in_place" or "restart"."""


@dataclass(frozen=True)
class EmulatedBackend:
    """Engines timed by the cost model, in their worker's own process."""

    engines: EnginesConfig
    name: ClassVar[str] = "emulated"
    time_scaled: ClassVar[bool] = True
    launches_servers: ClassVar[bool] = False
    measurable: ClassVar[bool] = False
    vllm_layout: ClassVar[bool] = False
    on_gpus: ClassVar[bool] = False
    pins_cores: ClassVar[bool] = False
    start_timeout_s: ClassVar[float] = 0.0  # starts at once, or not at all

    def make_engine(self, index: int, role: Role, run_dir: Path, gpus: tuple[str, ...] | None = None,
                    peers=None) -> Engine:
        cfg = self.engines
        if cfg.parallelism is not None:  # the live controller has no relayout step (sim/controller.py has)
            raise ValueError("engines.parallelism: per-role parallelism is simulated only (prorsa sim); "
                             "live engines use engines.tp and engines.ep")
        from prorsa.costmodel import CostModel
        from prorsa.engine.emulated import EmulatedEngine, KvMemory

        group = cfg.engine_groups[cfg.group_of_engine()[index]]  # its own layout and slots (ungrouped: one group)
        restart_s = cfg.restart_s if self.switch_path() == "restart" else None
        cost = CostModel.from_names(cfg.gpu, cfg.model, tp=group.tp, ep=group.ep, restart_s=restart_s)
        return EmulatedEngine(engine_name(index), role, cost, slots=group.slots, time_scale=cfg.time_scale,
                              memory=KvMemory(prefix_cache=cfg.prefix_cache))

    def model_dir(self) -> None:
        return None

    def unavailable(self) -> None:
        return None

    def portable(self) -> EnginesConfig:
        return self.engines

    def admitting_by_priority(self) -> EnginesConfig:
        return self.engines  # an emulated engine always admits by priority

    def switch_path(self) -> str:
        return "restart" if self.engines.role_switch == "restart" else "in_place"  # auto: no connector here


@dataclass(frozen=True)
class VllmBackend:
    """A vLLM server per engine (engine/vllm/), on CPU cores or GPUs (engines.vllm.device)."""

    engines: EnginesConfig
    name: ClassVar[str] = "vllm"
    time_scaled: ClassVar[bool] = False  # a server runs at its own speed
    launches_servers: ClassVar[bool] = True
    measurable: ClassVar[bool] = True
    vllm_layout: ClassVar[bool] = True

    @property
    def on_gpus(self) -> bool:
        return self.engines.vllm.device == "cuda"

    @property
    def pins_cores(self) -> bool:
        return self.engines.vllm.device == "cpu"

    @property
    def start_timeout_s(self) -> float:
        return self.engines.vllm.start_timeout_s  # a server restarts within it or not at all

    def make_engine(self, index: int, role: Role, run_dir: Path, gpus: tuple[str, ...] | None = None,
                    peers=None) -> Engine:
        from prorsa.engine.vllm import Placement, VllmEngine

        cfg = self.engines
        model_dir = resolve_model_dir(cfg)
        server = node_server(index, cfg, run_dir, peers, gpus) if peers is not None else None
        engine = VllmEngine(engine_name(index), role, cfg.engine_vllm(index), model_dir,
                            Placement(_cores(index, cfg), gpus), run_dir / "engines", server, self.switch_path())
        engine.vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        return engine

    def model_dir(self) -> Path:
        return resolve_model_dir(self.engines)

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("vllm") is None:
            return "engines.backend is vllm but vLLM is not installed (run ./setup.sh, or use --engine emulated)"
        try:
            resolve_model_dir(self.engines)
        except ValueError as e:
            return str(e)
        return None

    def portable(self) -> EnginesConfig:
        cfg = self.engines
        vllm = cfg.vllm.model_copy(update={"model": str(resolve_model_dir(cfg).resolve()),
                                           "cache_dir": str(Path(cfg.vllm.cache_dir).resolve())})
        return cfg.model_copy(update={"vllm": vllm})

    def admitting_by_priority(self) -> EnginesConfig:
        # a server on the default fcfs policy would not look at a request's priority
        vllm = self.engines.vllm.model_copy(update={"scheduling_policy": "priority"})
        return self.engines.model_copy(update={"vllm": vllm})

    def switch_path(self) -> str:
        from prorsa.engine.vllm.kv_roles import switch_path

        return switch_path(self.engines.role_switch)


BACKENDS: dict[str, type[EngineBackend]] = {b.name: b for b in (EmulatedBackend, VllmBackend)}


def backend_of(engines: EnginesConfig) -> EngineBackend:
    backend = BACKENDS.get(engines.backend)
    if backend is None:
        raise ValueError(f"engines.backend: unknown backend {engines.backend!r}")
    return backend(engines)


def engine_name(index: int) -> str:
    return f"engine-{index}"


def make_engine(index: int, role: Role, cfg: EnginesConfig, run_dir: Path,
                gpus: tuple[str, ...] | None = None, peers=None) -> Engine:
    return backend_of(cfg).make_engine(index, role, run_dir, gpus, peers)


def hosted_engines(cfg: PipelineConfig) -> EnginesConfig:
    """The engines section as the engine hosts get it: with scheduling.priority, engines that
    admit by it."""
    return backend_of(cfg.engines).admitting_by_priority() if cfg.scheduling.priority else cfg.engines


def resolve_model_dir(cfg: EnginesConfig) -> Path:
    """`tiny` (a Llama) and `tiny-moe` (a Qwen3-MoE) are made locally on first use (no model hub
    is needed); anything else is a directory."""
    if cfg.vllm.model == "tiny":
        from prorsa.engine.tiny_model import ensure_tiny_model

        return ensure_tiny_model(Path(cfg.vllm.cache_dir))
    if cfg.vllm.model == "tiny-moe":
        from prorsa.engine.tiny_model import ensure_tiny_moe

        return ensure_tiny_moe(Path(cfg.vllm.cache_dir))
    model_dir = Path(cfg.vllm.model)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"engines.vllm.model: {model_dir} is not a model directory (no config.json)")
    return model_dir


def _cores(index: int, cfg: EnginesConfig) -> list[int] | None:
    """The cores engine `index` pins on CPU (all its nodes' together); None on GPUs."""
    return engine_cores(index, cfg.vllm.cores_per_engine) if cfg.vllm.device == "cpu" else None


def node_server(index: int, cfg: EnginesConfig, run_dir: Path, peers, gpus: tuple[str, ...] | None = None):
    """Node `peers.node`'s server of engine `index`, an engine spanning nodes (cluster/span_host.py):
    its ranks on its share of the engine's cores (CPU), its DP arguments from `peers` at each launch.
    Node 0's is the leader's, with the API server; the others' are headless."""
    from prorsa.engine.vllm.server import ServerSpec, VllmServer

    spec = ServerSpec.from_settings(cfg.engine_vllm(index), resolve_model_dir(cfg),
                                    node_share(_cores(index, cfg), peers.nodes, peers.node), gpus)
    spec = dataclasses.replace(spec, local_dp=peers.local_dp)
    name = engine_name(index) if peers.node == 0 else f"{engine_name(index)}-node-{peers.node}"
    return VllmServer(spec, Path(run_dir) / "engines" / f"{name}.log", peers)
