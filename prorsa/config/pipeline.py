"""The pipeline file (pipelines/*.yaml) as pydantic models.

Immutable once loaded (frozen models); unknown keys are errors, so a typo never silently falls
back to a default. Each component receives only its own section.
"""

from __future__ import annotations

import math
import re
from types import UnionType
from pathlib import Path
from typing import Literal

from typing import Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from prorsa.config.layout import EngineLayout, GroupSpec


C_LONG = 2**63 - 1  # what an rlimit or a byte count handed to the OS must fit in
# Upper bounds on what multiplies a run's work or memory: past them an input is a typo, and
# accepting it would grow the run until the machine gives out, not fail with a message.
MANY = 2**20  # trajectories of one step, in flight, tasks, steps
MAX_WORKERS = 4096  # tool workers (processes), tool threads per worker


class _Section(BaseModel):
    # inf and nan pass gt/ge bounds, and an infinite interval or scale is never what was meant
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, v, info: ValidationInfo):
        # pydantic reads true as 1: `count: true` is a mistake, not one engine
        if isinstance(v, bool) and _numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError("a number, not a boolean")
        return v

    @field_validator("*")
    @classmethod
    def _no_nul(cls, v):
        # names and paths: a NUL byte is no character of either, and os calls raise on it
        texts = v if isinstance(v, tuple) else (v,)
        if any(isinstance(t, str) and "\x00" in t for t in texts):
            raise ValueError("text must not contain a NUL byte")
        return v


def _numeric(annotation) -> bool:
    """An int or float field (alone or in a union), not a bool one."""
    args = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return bool(set(args) & {int, float}) and bool not in args


MAX_ENGINE_GPUS = 4096  # GPUs of one engine; more is a typo


class VllmSettings(_Section):
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


class RoleParallelism(_Section):
    """How one role shards the model over an engine's GPUs (SGLang's --tp / --ep; DP attention has
    ep ranks, as with --enable-dp-attention --dp-size ep)."""

    tp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)


class Parallelism(_Section):
    """Stage-specific parallelism: a role not named here uses engines.tp and engines.ep. An engine
    is one group of engines.tp x engines.ep GPUs whatever its role, so every role's tp x ep must
    equal it; a switch between layouts empties the engine and reshards its weights."""

    prefill: RoleParallelism | None = None
    decode: RoleParallelism | None = None
    mixed: RoleParallelism | None = None


MAX_ENGINES = 65536  # engines in one run; more is a typo, and a role list that long exhausts memory
ROLE_NAMES = ("prefill", "decode", "mixed")


class EngineGroup(_Section):
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


class EnginesConfig(_Section):
    backend: Literal["emulated", "vllm"] = "emulated"
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

    @model_validator(mode="after")
    def _layouts_fit(self) -> EnginesConfig:
        # whether the gpu and model profiles exist is the resolve step's (rollout/context.py)
        if self.parallelism is None:
            return self
        if self.backend != "emulated":
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
            if self.backend == "vllm" or g.vllm_overrides():
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
            if self.backend == "vllm" or g.vllm_overrides():
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
        """Concurrent requests engine `index` admits: its group's slots, else engines.slots."""
        return self.slots if self.groups is None else self.engine_groups[self.group_of_engine()[index]].slots

    def engine_vllm(self, index: int) -> VllmSettings:
        """The vLLM settings engine `index` starts with: its group's layout over engines.vllm."""
        return self.vllm if self.groups is None else self.group_vllm(self.group_of_engine()[index])

    @model_validator(mode="after")
    def _cost_layout_is_the_vllm_layout(self) -> EnginesConfig:
        """A vLLM engine's cost-model tp and ep are read off the layout it runs, never set apart."""
        if self.backend != "vllm":
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


FamilyName = Literal["swe", "search", "math-tir", "terminal", "coding-agent"]  # agent/families.py FAMILIES
FAMILY_NAMES: tuple[str, ...] = get_args(FamilyName)


class WorkloadConfig(_Section):
    family: FamilyName | None = "swe"
    trace: str | None = None  # JSONL trace to replay instead of a family profile
    # instead of one family, a mix: each prompt's family drawn by weight ({swe: 3, math-tir: 1});
    # sync: the weights move linearly to mix_end's by the last step (a curriculum, a shifting mix)
    mix: dict[str, float] | None = None
    mix_end: dict[str, float] | None = None
    mode: Literal["sync", "async"] = "sync"
    prompts: int = Field(4, ge=1, le=MANY)  # sync: B prompts per step
    group_size: int = Field(4, ge=1, le=MANY)  # sync: G samples per prompt (a GRPO group)
    steps: int = Field(1, ge=1, le=MANY)  # sync: training steps to roll out
    concurrency: int = Field(16, ge=1, le=MANY)  # async: trajectories kept in flight
    trajectories: int | None = Field(None, ge=1, le=2**30)  # async: stop after this many
    duration_s: float | None = Field(None, gt=0)  # async: stop starting new ones after this
    # bounded so scaled token counts stay within the int32 columns of trajectories.parquet
    token_scale: float = Field(1.0, gt=0, le=1000)  # multiplies drawn token counts (tiny real models)
    tool_time_scale: float = Field(1.0, ge=0, le=1000)  # multiplies drawn tool latencies
    # sync: decode lengths drift across steps as a policy learns (RL runs see responses grow
    # several-fold): step s's are drawn decode_growth^(s / (steps - 1)) times step 0's
    decode_growth: float = Field(1.0, gt=0, le=1000)
    max_turns: int | None = Field(None, ge=1, le=65536)  # caps the family's turn count
    max_context: int | None = Field(None, ge=16, le=2**30)  # a trajectory ends before exceeding this
    # the trainer's weight update after each training step (sync: between steps; async: every
    # prompts x group_size finished trajectories): engines stall this long (wall seconds, like tool
    # latencies) and every prefix cache is invalidated; 0: no updates modelled
    weight_update_s: float = Field(0.0, ge=0)
    # async: start a weight update every this many wall seconds instead (a trainer that publishes
    # on a clock, not per batch); None: every prompts x group_size finished trajectories
    weight_update_every_s: float | None = Field(None, gt=0, le=86400)

    @model_validator(mode="before")
    @classmethod
    def _mix_replaces_the_default_family(cls, data):
        if isinstance(data, dict) and data.get("mix") is not None and "family" not in data:
            return data | {"family": None}
        return data

    @field_validator("mix", "mix_end", mode="before")
    @classmethod
    def _no_bool_weight(cls, v):
        if isinstance(v, dict) and (flag := next((k for k, w in v.items() if isinstance(w, bool)), None)):
            raise ValueError(f"weight of {flag!r}: a number, not a boolean")
        return v

    @field_validator("mix", "mix_end")
    @classmethod
    def _mix_weights(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("name at least one family and its weight, e.g. {swe: 3, math-tir: 1}")
        if unknown := [k for k in v if k not in FAMILY_NAMES]:
            raise ValueError(f"unknown task family {unknown[0]!r}; known: {', '.join(FAMILY_NAMES)}")
        if negative := [k for k, w in v.items() if w < 0]:
            raise ValueError(f"weight of {negative[0]!r} is {v[negative[0]]!r}; weights must be >= 0")
        if not any(w > 0 for w in v.values()):
            raise ValueError("every weight is 0; give at least one family a weight above 0")
        return v

    @property
    def label(self) -> str:
        """What the workload draws from, in a line of text: a family, `mix` or `trace`."""
        return "trace" if self.trace else "mix" if self.mix else str(self.family)

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadConfig:
        if self.trace is None and self.family is None and self.mix is None:
            raise ValueError("give a task 'family', a 'mix' or a 'trace' file")
        if self.mix is not None and (self.trace is not None or self.family is not None):
            raise ValueError(f"mix draws each prompt's family: give mix or {'trace' if self.trace else 'family'}, "
                             "not both")
        if self.mix_end is not None and self.mix is None:
            raise ValueError("mix_end is where the mix moves to by the last step: it needs mix (the weights at step 0)")
        if self.mix_end is not None and self.mode != "sync":
            raise ValueError("mix_end shifts the mix across synchronous steps: it needs mode sync")
        if self.mode == "async" and self.trajectories is None and self.duration_s is None:
            raise ValueError("async mode needs 'trajectories' or 'duration_s' to know when to stop")
        if self.weight_update_every_s is not None and self.mode != "async":
            raise ValueError("weight_update_every_s schedules updates during an asynchronous rollout: it needs "
                             "mode async (sync runs update between steps)")
        if self.decode_growth != 1.0 and self.mode != "sync":
            raise ValueError("decode_growth drifts decode lengths across synchronous steps: it needs mode sync")
        if self.prompts * self.group_size > MANY:
            raise ValueError(f"prompts x group_size = {self.prompts * self.group_size:,} trajectories a step; "
                             f"at most {MANY:,}")
        return self


class RuntimeConfig(_Section):
    turn_shape: Literal["in_task", "driver"] = "driver"  # benchmarks/control_plane.py: faster at scale
    processes: bool = False  # workers as processes (Nanny) rather than in the driver process
    # Dask clusters the engines are split over, each its own scheduler, router and controller, a
    # coordinator moving engines between them (live/cells.py); 1: one cluster, as before
    cells: int = Field(1, ge=1, le=MAX_ENGINES)
    tool_workers: int = Field(1, ge=1, le=MAX_WORKERS)
    tool_threads: int = Field(64, ge=1, le=MAX_WORKERS)  # concurrent turns per tool worker
    metrics_interval_s: float = Field(0.5, gt=0)
    control_interval_s: float = Field(1.0, gt=0)  # wall seconds between the policy's decisions
    # the control step's CPU (policy, scheduler call) as a share of one core, at most: after a
    # dearer step the next one waits longer than control_interval_s
    control_cpu_share: float = Field(0.05, gt=0, le=1)
    turn_retries: int = Field(2, ge=0, le=100)  # a turn whose engine or worker failed is re-run elsewhere
    # a later turn appending at most this many tokens is prefilled on the decode engine that holds
    # its context instead of on a prefill engine (no KV shipped); 0: never
    local_prefill_tokens: int = Field(0, ge=0)
    # when a turn leaves its trajectory's engines (and their cached prefix: the new one recomputes
    # the whole context): a number, when they carry more than that many times the least-loaded
    # engine's turns; "cost", when the cost model prices the wait it avoids above the recompute
    # (rollout/placement.py); None: never for load, only when they no longer serve the leg
    sticky_overload: float | Literal["cost"] | None = "cost"
    dashboard_address: str | None = "127.0.0.1:0"  # None disables the dashboard
    # finished trajectories go to disk in parts of this many, or once the oldest has waited
    # output_flush_s; a killed driver loses at most that much work, which --resume re-runs
    output_batch: int = Field(64, ge=1, le=MANY)
    output_flush_s: float = Field(5.0, ge=0)

    @field_validator("sticky_overload", mode="before")
    @classmethod
    def _overload(cls, v):
        # one message for the three forms, not one per branch of the union
        if v is None or v == "cost":
            return v
        try:
            number = float(v)
        except (TypeError, ValueError):
            number = math.nan
        if not number >= 1 or math.isinf(number) or isinstance(v, bool):
            raise ValueError("a number of at least 1, cost, or null")
        return number


def sticky_overload_from(text: str) -> float | str | None:
    """A command-line value of runtime.sticky_overload: a number, `cost` or `none`; ValueError says why."""
    value = None if text.strip().lower() in ("none", "null") else text.strip()
    try:
        return RuntimeConfig(sticky_overload=value).sticky_overload
    except ValidationError as e:
        raise ValueError(f"a number of at least 1, cost, or none; got {text!r}") from e


class SchedulingConfig(_Section):
    """Trajectory-level scheduling from each trajectory's predicted remaining work (control/tail.py);
    each mechanism switches alone, for ablations. Off: every turn is scheduled alike, first come."""

    # engines admit a turn by a key: when it was sent, minus the decode seconds its trajectory is
    # predicted to have left; the longest remainders go first and nothing waits forever
    priority: bool = False
    # the router prices a move by the trajectory's predicted remainder rather than one mean turn:
    # a long trajectory leaves a crowded engine, one near its end stays (needs sticky_overload cost)
    spread: bool = False
    # as a turn's decode ends, the router may pick another engine for the trajectory's next turn
    # and warm it with the context while the tool runs, so the move costs no recompute on the
    # trajectory's path (needs sticky_overload cost; live: turn_shape driver)
    migrate: bool = False
    # as a synchronous step's last trajectories remain (no more than half the engines' count),
    # idle engines merge into wider tensor-parallel ones for them when the cost model prices it
    # faster, weights moved and contexts re-prefilled (control/tail_layout.py). Simulator only:
    # vLLM cannot change an engine's TP in place, and a restart costs more than the tail it cuts
    tail_layout: bool = False
    # simulator only: both read the remainder off the workload instead of predicting it (what
    # prediction leaves on the table; like the oracle policy, never a live run's)
    oracle: bool = False


class SandboxSettings(_Section):
    """Limits of one sandboxed call (python tool, command tools); agent/tools/sandbox.py."""

    wall_s: float = Field(10.0, gt=0)
    cpu_s: int = Field(10, ge=1, le=C_LONG)
    memory_bytes: int = Field(1 << 30, ge=16 << 20, le=C_LONG)
    file_bytes: int = Field(16 << 20, ge=0, le=C_LONG)
    processes: int = Field(32, ge=2, le=C_LONG)  # the launcher counts as one
    output_bytes: int = Field(1 << 20, ge=1024, le=C_LONG)


_BUILTIN_TOOLS = ("python", "calculator", "search")
_DATASETS = ("math-tir", "search", "swe-lite", "arith", "arith-digits")
_SFT_DATASETS = ("arith", "arith-digits")  # with demonstrations (train/sft.py DEMONSTRATIONS)
_DATASET_TOOLS = {"math-tir": {"python"}, "search": {"search"}, "swe-lite": {"python"},
                  "arith": {"calculator"}, "arith-digits": {"calculator"}}


class TaskColumns(_Section):
    """Which column of a Hugging Face dataset fills each task field (agent/datasets/hf.py)."""

    prompt: str  # what the model is asked
    answer: str | None = None  # the reference answer the reward compares; None: ""
    task_id: str | None = None  # None: "<dataset>-<row>"
    calls: str | None = None  # reference tool calls ([{name, arguments}] or its JSON); replay needs them
    tests: str | None = None  # Python snippets (a list of strings) for pass_rate


class EnvironmentConfig(_Section):
    """Real tools in the rollout. Replay: each turn's tool call is taken from a dataset task and
    run on a tool worker; its observation's length becomes the next turn's append. Live: the
    model's generated text is parsed for calls, which run, and their observation is appended."""

    mode: Literal["replay", "live"] = "replay"
    # given: `dataset` is a Hugging Face dataset on disk (a save_to_disk directory, or
    # parquet/jsonl/json/csv files) whose columns these are; declared first, so `dataset` is read with it
    columns: TaskColumns | None = None
    split: str = "train"  # of a dataset saved with several splits
    # math-tir | search | swe-lite, or a JSONL file of tasks (agent/datasets/base.py)
    dataset: str
    tasks: int = Field(64, ge=1, le=MANY)  # tasks generated; prompts cycle over them
    dataset_seed: int | None = None  # None: the pipeline's seed
    tools: tuple[str, ...] = _BUILTIN_TOOLS  # registered names or "package.module:attr"
    reward: str = "exact_match"  # a registered reward (agent/rewards.py) or "package.module:fn"
    max_observation_tokens: int = Field(1024, ge=1)  # longer observations are cut (head and tail)
    chars_per_token: int = Field(4, ge=1)  # how observations are counted without a tokenizer
    tool_timeout_s: float = Field(30.0, gt=0)  # per call, on top of the sandbox's own limits
    sandbox: SandboxSettings = SandboxSettings()
    # live mode
    max_turns: int = Field(8, ge=1)  # the turn cap: the trajectory ends here without an answer
    max_response_tokens: int = Field(256, ge=1)  # per turn; the decode also stops at the model's EOS
    parser: tuple[Literal["hermes", "json"], ...] = ("hermes", "json")  # tool-call formats, in order

    @field_validator("tools")
    @classmethod
    def _tools_named(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for spec in v:
            if spec not in _BUILTIN_TOOLS and ":" not in spec:
                raise ValueError(f"tool {spec!r}: expected one of {list(_BUILTIN_TOOLS)} or 'package.module:attr'")
        if not v:
            raise ValueError("list at least one tool")
        return v

    @field_validator("dataset")
    @classmethod
    def _dataset_known(cls, v: str, info: ValidationInfo) -> str:
        if info.data.get("columns") is not None:
            if v in _DATASETS:
                raise ValueError(f"columns map a Hugging Face dataset on disk; {v!r} is a built-in dataset")
            return v
        if v not in _DATASETS and not v.endswith(".jsonl"):
            raise ValueError(f"dataset {v!r}: expected one of {list(_DATASETS)}, a .jsonl file of tasks, "
                             "or a Hugging Face dataset on disk with columns:")
        return v

    @model_validator(mode="after")
    def _replay_has_calls(self) -> EnvironmentConfig:
        if self.columns is not None and self.mode == "replay" and self.columns.calls is None:
            raise ValueError("columns.calls: replay runs each task's reference tool calls; name the column "
                             "that holds them, or use mode: live")
        return self

    @model_validator(mode="after")
    def _dataset_tools_given(self) -> EnvironmentConfig:
        # Only checkable when every tool is a built-in: a user tool's name is known once loaded.
        needed = _DATASET_TOOLS.get(self.dataset, set())
        if all(t in _BUILTIN_TOOLS for t in self.tools) and not needed <= set(self.tools):
            raise ValueError(f"dataset {self.dataset} calls {sorted(needed)}; add them to tools")
        return self


class TrainConfig(_Section):
    """The RL loop (prorsa/train/learner.py): GRPO on the rollouts, new weights into every
    engine after each step. Sync: one update between steps; async: one every prompts x
    group_size finished trajectories while rollout goes on, no trajectory trained more than
    max_staleness versions behind the policy being trained."""

    algorithm: Literal["grpo"] = "grpo"
    # "package.module:Class" (train/protocol.py PolicyTrainer) trains instead of the built-in GRPO
    # Trainer; it gets the same batches and GRPO advantages, and the fields below it reads itself
    trainer: str | None = Field(None, max_length=500)
    lr: float = Field(1e-4, gt=0, le=1)
    clip_eps: float = Field(0.2, gt=0, le=10)
    kl_coef: float = Field(0.0, ge=0)  # > 0 keeps a frozen reference model for a k3 KL term
    # verl's loss_agg_mode: every generated token weighs the same, or every sequence (train/grpo.py)
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    micro_batch: int = Field(8, ge=1)  # sequences per forward/backward
    # micro-batches whose gradients accumulate into one optimizer update; None: one update per step
    grad_accum: int | None = Field(None, ge=1)
    max_staleness: int = Field(1, ge=0)  # async: versions a trained trajectory may lag the trainer
    sft_steps: int = Field(0, ge=0)  # supervised warm-up on the task's demonstrations before RL
    sft_lr: float = Field(1e-3, gt=0, le=1)
    # the warm-up stops once this share of sampled first turns calls the tool: RL learns from the
    # differences within a group, and a model that always (or never) calls has none to learn from
    sft_target_call_rate: float = Field(0.4, gt=0, le=1)
    keep_checkpoints: int = Field(2, ge=1)  # weight versions kept under RUN_DIR/weights
    seed: int | None = None  # None: the pipeline's seed
    # where the Trainer lives: in the driver, or on a worker of its own (resource trainer: 1) that
    # writes the weights into the run directory, so that directory must be on a shared filesystem
    placement: Literal["driver", "worker"] = "driver"

    @field_validator("trainer")
    @classmethod
    def _trainer_named(cls, v: str | None) -> str | None:
        # the form here; that it imports and has the protocol's methods: rollout/context.py check
        if v is not None and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", v):
            raise ValueError(f'{v!r}: expected "package.module:ClassName"')
        return v


class PartialRolloutConfig(_Section):
    """Synchronous steps that end when enough is done (rollout/partial.py): a step starts
    (1 + over_sample) x prompts GRPO groups and ends once `prompts` of them are whole; the rest
    go on into the next step (carry) or are cancelled. A trajectory whose first turn was sent
    more than max_staleness policy versions before the version a step trains is dropped."""

    # extra groups started per step, as a share of prompts (rounded up to whole groups): 0.25 of
    # 8 prompts starts 10 groups; the first 8 to be whole are trained
    over_sample: float = Field(0.25, ge=0, le=8)
    # True: unfinished trajectories keep running into the next step (under the new weights from
    # their next turn); False: they are cancelled when the step ends
    carry: bool = True
    # None: train.max_staleness with train:, else 1 (a pipeline gives one bound, not two)
    max_staleness: int | None = Field(None, ge=0, le=MANY)


class ExpectConfig(_Section):
    """What a pipeline declares it expects of one trajectory, before anything is observed: means
    over a trajectory (tokens, and tool seconds of the cost model's clock). A prior, not the run's
    future: the policy plans its opening from it and corrects it as turns are observed."""

    prompt_tokens: float = Field(ge=0, le=2**30)  # the first turn's append
    observation_tokens: float = Field(ge=0, le=2**30)  # a later turn's append
    decode_tokens: float = Field(gt=0, le=2**30)  # per turn
    tool_s: float = Field(0.0, ge=0, le=86400)  # per tool call
    turns: float = Field(ge=1, le=65536)  # per trajectory


def _cells_conflict(cfg: PipelineConfig) -> str | None:
    """What a run over cells (live/cells.py run_cells) cannot do yet, naming the field, or None."""
    n, engines, work = cfg.runtime.cells, cfg.engines, cfg.workload
    if n > engines.count:
        return f"need an engine each, but engines.count is {engines.count}"
    if work.mode != "sync" or work.steps != 1:
        # a step is no barrier across cells yet, and an asynchronous stream is not placed on them
        return (f"run one synchronous step; workload.mode is {work.mode}" if work.mode != "sync"
                else f"run one synchronous step; workload.steps is {work.steps}")
    if cfg.train is not None:
        return "do not train; drop train:"
    if engines.groups is not None:
        return "split engines alike; engines.groups is set"
    if engines.backend != "emulated":
        # a cell's runner sends no token ids and waits out no server restart
        return f"run emulated engines only; engines.backend is {engines.backend}"
    if cfg.environment is not None:
        return "replay tool calls as latencies; environment: is set"
    if cfg.partial_rollout is not None:
        return "end a step with its last trajectory; partial_rollout: is set"
    return None


class PipelineConfig(_Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=200)  # a directory name, with a timestamp added
    seed: int = 0
    policy: str = "static:2:1"
    # what adaptive policies may assume before observing anything: an earlier run's directory (its
    # trajectories.parquet; a `prorsa sim --output` folder: every run in it), or declared means;
    # None: they start all-mixed and learn the workload from this run's own turns
    prior: str | ExpectConfig | None = None
    engines: EnginesConfig = EnginesConfig()
    workload: WorkloadConfig = WorkloadConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    environment: EnvironmentConfig | None = None  # None: tool calls replayed as latencies
    train: TrainConfig | None = None  # None: rollout only (weight updates, if any, are modelled)
    # None: a sync step ends with its last trajectory
    partial_rollout: PartialRolloutConfig | None = None
    output_dir: str = "runs"

    @model_validator(mode="after")
    def _groups_open_in_their_roles(self) -> PipelineConfig:
        # the default split names engine counts; with groups the roles are the groups' own
        if "policy" not in self.model_fields_set and self.engines.groups is not None:
            object.__setattr__(self, "policy", "static")
        return self

    @model_validator(mode="after")
    def _live_needs_text(self) -> PipelineConfig:
        if self.environment is not None and self.environment.mode == "live" and self.engines.backend != "vllm":
            raise ValueError("environment.mode live reads the model's text: it needs engines.backend vllm")
        return self

    @model_validator(mode="after")
    def _moves_need_costs(self) -> PipelineConfig:
        for option in ("spread", "migrate"):
            if getattr(self.scheduling, option) and self.runtime.sticky_overload != "cost":
                raise ValueError(f"scheduling.{option} prices moves with the cost model: it needs runtime.sticky_overload cost")
        if self.scheduling.migrate and self.runtime.turn_shape != "driver":
            raise ValueError("scheduling.migrate warms the next engine as the decode ends, which the driver sees only "
                             "in runtime.turn_shape driver")
        return self

    @model_validator(mode="after")
    def _cells_can_run(self) -> PipelineConfig:
        n = self.runtime.cells
        if n > 1 and (conflict := _cells_conflict(self)):
            raise ValueError(f"runtime.cells: {n} cells {conflict}; set runtime.cells 1 or change that field")
        return self

    @model_validator(mode="after")
    def _partial_rollout_fits(self) -> PipelineConfig:
        p = self.partial_rollout
        if p is None:
            return self
        if self.workload.mode != "sync":
            # async keeps its own in-flight count and staleness gate (train.max_staleness)
            raise ValueError(f"partial_rollout ends synchronous steps early: it needs workload.mode sync, "
                             f"not {self.workload.mode}")
        if self.train is not None and p.max_staleness is not None:
            raise ValueError("partial_rollout.max_staleness: with train: the bound is train.max_staleness; "
                             "give it there")
        return self

    @property
    def staleness_bound(self) -> int:
        """Versions a trained trajectory may lag: train.max_staleness when training, else
        partial_rollout.max_staleness (1 when neither is given)."""
        if self.train is not None:
            return self.train.max_staleness
        p = self.partial_rollout
        return 1 if p is None or p.max_staleness is None else p.max_staleness

    @model_validator(mode="after")
    def _train_needs_a_model(self) -> PipelineConfig:
        if self.train is None:
            return self
        if self.engines.backend != "vllm":
            raise ValueError("train: trains the model the engines run: it needs engines.backend vllm")
        if self.environment is None or self.environment.mode != "live":
            raise ValueError("train: learns from the model's own text and rewards: it needs an "
                             "environment with mode live")
        if self.train.sft_steps and self.environment.dataset not in _SFT_DATASETS:
            raise ValueError(f"train.sft_steps: dataset {self.environment.dataset!r} has no demonstrations "
                             f"to warm up on (those with: {list(_SFT_DATASETS)})")
        return self

    def resolve_paths(self, base: Path) -> PipelineConfig:
        """Relative trace, prior and task-file paths are relative to the pipeline file."""
        cfg = self
        if isinstance(cfg.prior, str) and not Path(cfg.prior).is_absolute():
            cfg = cfg.model_copy(update={"prior": str((base / cfg.prior).resolve())})
        if cfg.workload.trace and not Path(cfg.workload.trace).is_absolute():
            trace = str((base / cfg.workload.trace).resolve())
            cfg = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"trace": trace})})
        env = cfg.environment
        on_disk = env is not None and (env.dataset.endswith(".jsonl") or env.columns is not None)
        if on_disk and not Path(env.dataset).is_absolute():
            dataset = str((base / env.dataset).resolve())
            cfg = cfg.model_copy(update={"environment": env.model_copy(update={"dataset": dataset})})
        return cfg

