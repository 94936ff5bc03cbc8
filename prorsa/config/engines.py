"""The engines section: how many engines, their vLLM settings, per-role parallelism and groups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from prorsa.config.layout import EngineLayout, GroupSpec
from prorsa.config.section import C_LONG, Section


MAX_ENGINE_GPUS = 4096  # GPUs of one engine; more is a typo


def check_tool_parser(name: str) -> str:
    """`name` if vLLM registers a tool-call parser of that name (hermes also without vLLM, which
    prorsa parses itself); else ValueError naming the registered ones."""
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError:
        if name == "hermes":
            return name
        raise ValueError(f"{name!r} is one of vLLM's tool-call parsers, and vLLM is not installed "
                         "(./setup.sh); without it only 'hermes'") from None
    known = ToolParserManager.list_registered()
    if name not in known:
        raise ValueError(f"unknown tool-call parser {name!r}; vLLM's are: {', '.join(known)}")
    return name


class VllmSettings(Section):
    # a model directory, or "tiny" (a Llama) / "tiny-moe" (a Qwen3-MoE): made locally under cache_dir on first use
    model: str = "tiny"
    cache_dir: str = ".prorsa/models"  # where the tiny model is made
    device: Literal["cpu", "cuda"] = "cpu"
    kv_cache_bytes: int = Field(128 * 2**20, gt=0, le=C_LONG)  # CPU engines need an explicit KV size
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)  # CUDA engines
    max_model_len: int = Field(2048, gt=0, le=2**24)
    enforce_eager: bool = True  # compiled start-up costs ~3x on CPU
    tensor_parallel_size: int = Field(1, ge=1, le=MAX_ENGINE_GPUS)
    # DP attention (MoE models): ranks of tensor_parallel_size GPUs in one server, stepping in lockstep
    data_parallel_size: int = Field(1, ge=1, le=MAX_ENGINE_GPUS)
    enable_expert_parallel: bool = False  # experts sharded over tensor x data parallel GPUs
    cores_per_engine: int = Field(1, ge=0)  # CPU pinning; 0 = no pinning
    # CPU: the ranks (tensor x data parallel) one "node" holds. An engine with more spans nodes as on
    # a GPU cluster (cluster/nodes.py): a worker runs its API server and first ranks, a worker per
    # further node a headless server of the rest, all on this machine. None: every engine in one server
    node_ranks: int | None = Field(None, ge=1)
    start_timeout_s: float = Field(300.0, gt=0)
    extra_args: tuple[str, ...] = ()  # passed through to the vLLM server
    dtype: str = "auto"  # vLLM --dtype; "float32" makes greedy outputs robust to batching noise
    request_timeout_s: float = Field(600.0, gt=0)  # one HTTP request (a cold CPU server: ~50 s)
    nixl_compat_check: bool = True  # False lets engines with different weights exchange KV (tests)
    # NIXL's progress thread spins a core per engine; run it at this nice level (CPU; 0 = leave it)
    nixl_progress_nice: int = Field(19, ge=0, le=19)
    # CPU servers run at this nice level: the control plane (scheduler, workers, driver) uses little CPU but
    # sits on every turn's critical path, so where it shares cores with engines it goes first
    nice: int = Field(5, ge=0, le=19)
    # vLLM --scheduling-policy: `priority` admits by each request's priority (lower first, ties
    # first come); scheduling.priority launches the engines with it (engine/registry.py)
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    # vLLM --tool-call-parser: how `prorsa serve` reads tool calls out of a reply (hermes, llama3_json,
    # mistral, qwen3_coder, pythonic, ...: the model's own format)
    tool_call_parser: str = "hermes"

    @field_validator("tool_call_parser")
    @classmethod
    def _registered(cls, v: str) -> str:
        return v if v == "hermes" else check_tool_parser(v)  # the default: no vLLM import to check it

    @property
    def layout(self) -> EngineLayout:
        return EngineLayout(self.tensor_parallel_size, self.data_parallel_size, self.enable_expert_parallel)

    @model_validator(mode="after")
    def _layout_runs(self) -> VllmSettings:
        layout = self.layout
        if layout.gpus > MAX_ENGINE_GPUS:
            raise ValueError(f"tensor_parallel_size x data_parallel_size = {layout.gpus} GPUs in one engine; "
                             f"at most {MAX_ENGINE_GPUS}")
        if self.enable_expert_parallel and layout.gpus == 1:
            raise ValueError("enable_expert_parallel spreads the experts over tensor_parallel_size x "
                             "data_parallel_size GPUs, here 1: raise data_parallel_size (DP attention) or "
                             "tensor_parallel_size")
        if self.device == "cpu" and 0 < self.cores_per_engine < layout.gpus:
            # vLLM binds each CPU rank's threads to cores of its own (VLLM_CPU_OMP_THREADS_BIND)
            raise ValueError(f"cores_per_engine {self.cores_per_engine}: a CPU engine of tensor_parallel_size "
                             f"{self.tensor_parallel_size} x data_parallel_size {self.data_parallel_size} "
                             f"runs {layout.gpus} ranks, each on cores of its own; give it {layout.gpus} or "
                             "more, or 0 (not pinned)")
        if self.node_ranks is not None and self.device != "cpu":
            # a GPU node's size is the GPUs its batch job books: the cluster file's engines.gpus
            raise ValueError("node_ranks: CPU engines only; on GPUs a node is the cluster file's engines.gpus")
        return self


class RoleParallelism(Section):
    """How one role shards the model over an engine's GPUs (SGLang's --tp / --ep; DP attention has
    ep ranks, as with --enable-dp-attention --dp-size ep)."""

    tp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)


class Parallelism(Section):
    """Stage-specific parallelism: a role not named here uses engines.tp and engines.ep. An engine
    is one group of engines.tp x engines.ep GPUs whatever its role, so every role's tp x ep must
    equal it; a switch between layouts empties the engine and reshards its weights."""

    prefill: RoleParallelism | None = None
    decode: RoleParallelism | None = None
    mixed: RoleParallelism | None = None


MAX_ENGINES = 65536  # engines in one run; more is a typo, and a role list that long exhausts memory
ROLE_NAMES = ("prefill", "decode", "mixed")


class EngineGroup(Section):
    """`count` engines of one size and layout, and the roles they may take (the first: the one they
    open in). A switch never leaves `roles`: a 1-GPU engine sized for prefill cannot hold a wide
    decode batch's KV, and a DP-attention group laid out for decode is slow to prefill alone."""

    count: int = Field(ge=1, le=MAX_ENGINES)
    roles: tuple[Literal["prefill", "decode", "mixed"], ...]
    slots: int | None = Field(None, ge=1, le=65536)  # None: engines.slots
    # emulated engines: the cost model's layout; None: engines.tp / engines.ep
    tp: int | None = Field(None, ge=1)
    ep: int | None = Field(None, ge=1)
    # vLLM engines: the group's own server layout over engines.vllm's; tp and ep follow from it
    # (also where a vLLM pipeline's groups run emulated: each priced in the layout it would run)
    tensor_parallel_size: int | None = Field(None, ge=1, le=MAX_ENGINE_GPUS)
    data_parallel_size: int | None = Field(None, ge=1, le=MAX_ENGINE_GPUS)
    enable_expert_parallel: bool | None = None

    @field_validator("roles")
    @classmethod
    def _roles_given(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("list the roles these engines may take, the opening one first, e.g. [prefill]")
        if len(set(v)) != len(v):
            raise ValueError(f"role {next(r for r in v if v.count(r) > 1)!r} is listed twice")
        return v

    def vllm_overrides(self) -> dict:
        return {k: getattr(self, k) for k in ("tensor_parallel_size", "data_parallel_size", "enable_expert_parallel")
                if getattr(self, k) is not None}


@dataclass(frozen=True)
class BackendTraits:
    """What a pipeline may ask of an engine backend, checked before any engine is made (the
    backends themselves: engine/registry.py)."""
    weights: bool  # it runs a model's weights: the text a live environment reads, a model to train
    vllm_layout: bool  # its cost layout follows from engines.vllm's parallel sizes
    role_layouts: bool  # it models a layout per role (engines.parallelism)


BACKENDS = {"emulated": BackendTraits(weights=False, vllm_layout=False, role_layouts=True),
            "vllm": BackendTraits(weights=True, vllm_layout=True, role_layouts=False)}


class EnginesConfig(Section):
    backend: Literal["emulated", "vllm"] = "emulated"  # a key of BACKENDS
    count: int = Field(3, ge=1, le=MAX_ENGINES)
    slots: int = Field(32, ge=1, le=65536)  # concurrent requests an engine admits (its role resource)
    gpu: str = "h200"  # cost-model profile (emulated engines, simulator)
    model: str = "qwen3-8b"  # cost-model profile
    tp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)  # expert parallelism (MoE models): the cost model's all-to-all and barrier
    time_scale: float = Field(1.0, ge=0)  # emulated: 1.0 = real time, 0 = no engine time
    # emulated: which contexts stay in an engine's KV between turns (engine/prefix_cache.py):
    # ideal = all, forever; lru = idle contexts share the free KV, least recently used dropped first
    prefix_cache: Literal["ideal", "lru"] = "ideal"
    # how an engine changes role: in_place (the KV connector's role for both sides, kv_both: a
    # drain and bookkeeping), restart (started as the side its role needs, restarted into the
    # other), auto (vLLM: in_place while the installed vLLM accepts kv_both; emulated: in_place)
    role_switch: Literal["auto", "in_place", "restart"] = "auto"
    # seconds a restart into the other side holds an engine, on the modelled GPU: the cost model's
    # price of such a switch and the emulated engine's hold (benchmarks/role_restart.py)
    restart_s: float = Field(30.0, ge=0, le=86400)
    parallelism: Parallelism | None = None  # None: every role uses tp and ep (emulated engines only)
    vllm: VllmSettings = VllmSettings()
    # the GPUs of the node a run places its vLLM engines on, in order (CUDA indices or GPU-/MIG-
    # UUIDs, as CUDA_VISIBLE_DEVICES takes them); engine i gets the i-th slice of tp x dp of them.
    # None: CUDA_VISIBLE_DEVICES of the run, else every GPU NVML finds (cluster/devices.py)
    devices: tuple[str, ...] | None = None
    # engines of different sizes and layouts, in engine order (engine-0 is the first group's first);
    # count becomes their sum. None: `count` engines alike, every role open to each
    groups: tuple[EngineGroup, ...] | None = None

    @field_validator("devices", mode="before")
    @classmethod
    def _device_names(cls, v):
        if v is None or not isinstance(v, (list, tuple)):
            return v
        if any(isinstance(d, bool) or not isinstance(d, (int, str)) for d in v):
            raise ValueError("GPU indices (0, 1, ...) or GPU-/MIG- UUIDs")
        if any(isinstance(d, int) and d < 0 for d in v):
            raise ValueError("GPU indices are 0 or more")
        return tuple(str(d).strip() for d in v)

    @field_validator("devices")
    @classmethod
    def _devices_distinct(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if v is None:
            return v
        if not v or not all(v):
            raise ValueError("list the node's GPUs, e.g. [0, 1, 2, 3], or leave devices out to discover them")
        if len(set(v)) != len(v):
            twice = next(d for d in v if v.count(d) > 1)
            raise ValueError(f"GPU {twice} is listed twice; each GPU belongs to one engine")
        return v

    def layout(self, role: str) -> tuple[int, int]:
        """(tp, ep) of an engine in `role` ("prefill", "decode" or "mixed")."""
        given = getattr(self.parallelism, role, None) if self.parallelism is not None else None
        return (given.tp, given.ep) if given is not None else (self.tp, self.ep)

    @property
    def traits(self) -> BackendTraits:
        return BACKENDS[self.backend]

    @model_validator(mode="after")
    def _layouts_fit(self) -> EnginesConfig:
        # whether the gpu and model profiles exist is the resolve step's (rollout/context.py)
        if self.parallelism is None:
            return self
        if not self.traits.role_layouts:
            raise ValueError("parallelism: per-role parallelism is modelled by emulated engines only; "
                             "a vLLM engine's layout is vllm.tensor_parallel_size and vllm.data_parallel_size")
        for role in ("prefill", "decode", "mixed"):
            tp, ep = self.layout(role)
            if tp * ep != self.tp * self.ep:
                raise ValueError(f"parallelism.{role}: tp x ep = {tp} x {ep} = {tp * ep} GPUs, but an engine is "
                                 f"tp x ep = {self.tp} x {self.ep} = {self.tp * self.ep} GPUs in every role")
        return self

    @model_validator(mode="after")
    def _groups_fit(self) -> EnginesConfig:
        """Each group's layout checked as the engines' own would be; the engine count is theirs."""
        if self.groups is None:
            return self
        if not self.groups:
            raise ValueError("groups: list at least one group, or leave groups out for engines alike")
        total = sum(g.count for g in self.groups)
        if total > MAX_ENGINES:
            raise ValueError(f"groups: {total} engines in all; at most {MAX_ENGINES}")
        if "count" in self.model_fields_set and self.count != total:
            raise ValueError(f"count: {self.count}, but the groups declare {total} engines; drop count or make them agree")
        if self.parallelism is not None:
            raise ValueError("parallelism: per-role layouts of engines alike; with groups, give each group its own layout")
        for i, g in enumerate(self.groups):
            given = g.model_fields_set
            # a vLLM layout (the backend's, or a vLLM pipeline run emulated) is what the cost model reads
            if self.traits.vllm_layout or g.vllm_overrides():
                if wrong := [k for k in ("tp", "ep") if k in given]:
                    raise ValueError(f"groups[{i}].{wrong[0]}: a vLLM engine's cost layout follows from its "
                                     "tensor_parallel_size and data_parallel_size; set those")
                try:
                    VllmSettings.model_validate(self.vllm.model_dump() | g.vllm_overrides())
                except ValidationError as err:
                    msg = err.errors()[0]["msg"].removeprefix("Value error, ")
                    raise ValueError(f"groups[{i}]: {msg}") from None
        object.__setattr__(self, "count", total)  # derived once, while the model is being built
        return self

    def group_vllm(self, index: int) -> VllmSettings:
        """engines.vllm with group `index`'s layout (validated with the groups)."""
        if self.groups is None:
            return self.vllm
        return self.vllm.model_copy(update=self.groups[index].vllm_overrides())

    @property
    def engine_groups(self) -> tuple[GroupSpec, ...]:
        """Every group resolved: its cost-model layout, slots and roles; without groups, one group of
        every engine with every role open (the policy picks the opening roles)."""
        if self.groups is None:
            return (GroupSpec(self.count, ROLE_NAMES, self.tp, self.ep, self.slots, self.vllm.layout, False),)
        out = []
        for i, g in enumerate(self.groups):
            if self.traits.vllm_layout or g.vllm_overrides():
                layout = self.group_vllm(i).layout
                tp, ep = layout.cost_tp, layout.cost_ep
            else:
                layout, tp, ep = None, g.tp or self.tp, g.ep or self.ep
            out.append(GroupSpec(g.count, tuple(g.roles), tp, ep, g.slots or self.slots, layout, True))
        return tuple(out)

    def group_of_engine(self) -> tuple[int, ...]:
        """The group index of each engine, in engine order."""
        return tuple(i for i, g in enumerate(self.engine_groups) for _ in range(g.count))

    def slots_of(self, index: int) -> int:
        """Concurrent requests engine `index` admits: its group's slots (engines.slots without groups)."""
        return self.engine_groups[self.group_of_engine()[index]].slots

    def engine_vllm(self, index: int) -> VllmSettings:
        """The vLLM settings engine `index` starts with: its group's layout over engines.vllm."""
        return self.group_vllm(self.group_of_engine()[index])

    @model_validator(mode="after")
    def _cost_layout_is_the_vllm_layout(self) -> EnginesConfig:
        """A vLLM engine's cost-model tp and ep are read off the layout it runs, never set apart."""
        if not self.traits.vllm_layout:
            return self
        if self.devices is not None and self.vllm.device == "cpu":
            raise ValueError("devices: GPUs for engines on device cuda; engines.vllm.device is cpu "
                             "(CPU engines take cores_per_engine cores each)")
        layout = self.vllm.layout
        derived = {"tp": (layout.cost_tp, "tensor_parallel_size"), "ep": (layout.cost_ep, "data_parallel_size")}
        for name, (value, source) in derived.items():
            given = getattr(self, name)
            if name in self.model_fields_set and given != value:
                raise ValueError(f"{name}: got {given}, but a vLLM engine's {name} is its vllm.{source} ({value}); "
                                 f"drop engines.{name} or make them agree")
            object.__setattr__(self, name, value)  # derived once, while the model is being built
        return self


class SamplingConfig(Section):
    """How the engines draw a rollout's tokens (vLLM's sampling parameters; verl's
    rollout.temperature / top_p / top_k). The emulated engine writes no tokens and ignores it;
    `prorsa serve` requests may set their own."""

    temperature: float = Field(1.0, ge=0, le=10)  # 0: greedy
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)  # -1: every token
    min_p: float = Field(0.0, ge=0, le=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=2)
