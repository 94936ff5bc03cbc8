"""The pipeline file (pipelines/*.yaml) as pydantic models: PipelineConfig and its cross-section checks.

Immutable once loaded (frozen models); unknown keys are errors, so a typo never silently falls
back to a default. Each component receives only its own section; each section's model lives in
a module of its own (engines, workload, runtime, environment, training; section: their base).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from prorsa.config.engines import (
    MAX_ENGINE_GPUS,
    MAX_ENGINES,
    ROLE_NAMES,
    EngineGroup,
    EnginesConfig,
    Parallelism,
    RoleParallelism,
    SamplingConfig,
    VllmSettings,
)
from prorsa.config.environment import SFT_DATASETS, EnvironmentConfig, SandboxSettings, TaskColumns
from prorsa.config.policies import policy_spec
from prorsa.config.runtime import RuntimeConfig, SchedulingConfig, sticky_overload_from
from prorsa.config.section import C_LONG, MANY, MAX_WORKERS, Section
from prorsa.config.training import PartialRolloutConfig, TrainConfig
from prorsa.config.workload import FAMILY_NAMES, ExpectConfig, FamilyName, WorkloadConfig

# the schema was one module: tests, benchmarks and user code import any section's names from here
__all__ = [
    "C_LONG", "FAMILY_NAMES", "MANY", "MAX_ENGINES", "MAX_ENGINE_GPUS", "MAX_WORKERS", "ROLE_NAMES",
    "EngineGroup", "EnginesConfig", "EnvironmentConfig", "ExpectConfig", "FamilyName", "Parallelism",
    "PartialRolloutConfig", "PipelineConfig", "RoleParallelism", "RuntimeConfig", "SamplingConfig", "SandboxSettings",
    "SchedulingConfig", "TaskColumns", "TrainConfig", "VllmSettings", "WorkloadConfig", "sticky_overload_from",
]


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
    if engines.traits.weights:
        # a cell's runner sends no token ids and waits out no server restart
        return f"run emulated engines only; engines.backend is {engines.backend}"
    if cfg.environment is not None:
        return "replay tool calls as latencies; environment: is set"
    if cfg.partial_rollout is not None:
        return "end a step with its last trajectory; partial_rollout: is set"
    return None


class PipelineConfig(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=200)  # a directory name, with a timestamp added
    seed: int = 0
    # the shorthand (prorsa:4:2) or a mapping ({name: prorsa, horizon_s: 4}); held as the shorthand,
    # each argument checked against the policy's record (config/policies.py)
    policy: str = "static:2:1"
    # what adaptive policies may assume before observing anything: an earlier run's directory (its
    # trajectories.parquet; a `prorsa sim --output` folder: every run in it), or declared means;
    # None: they start all-mixed and learn the workload from this run's own turns
    prior: str | ExpectConfig | None = None
    engines: EnginesConfig = EnginesConfig()
    sampling: SamplingConfig = SamplingConfig()
    workload: WorkloadConfig = WorkloadConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    environment: EnvironmentConfig | None = None  # None: tool calls replayed as latencies
    train: TrainConfig | None = None  # None: rollout only (weight updates, if any, are modelled)
    # None: a sync step ends with its last trajectory
    partial_rollout: PartialRolloutConfig | None = None
    output_dir: str = "runs"

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_checked(cls, value: object) -> object:
        return policy_spec(value) if isinstance(value, (str, dict)) else value

    @model_validator(mode="after")
    def _groups_open_in_their_roles(self) -> PipelineConfig:
        # the default split names engine counts; with groups the roles are the groups' own
        if "policy" not in self.model_fields_set and self.engines.groups is not None:
            object.__setattr__(self, "policy", "static")
        return self

    @model_validator(mode="after")
    def _live_needs_text(self) -> PipelineConfig:
        if self.environment is not None and self.environment.mode == "live" and not self.engines.traits.weights:
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
        if p.overlap and not p.carry:
            raise ValueError("partial_rollout.overlap starts the next step's groups before this step ends, and "
                             "carry: false would cancel them as it ends; set carry: true")
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
        if not self.engines.traits.weights:
            raise ValueError("train: trains the model the engines run: it needs engines.backend vllm")
        if self.environment is None or self.environment.mode != "live":
            raise ValueError("train: learns from the model's own text and rewards: it needs an "
                             "environment with mode live")
        if self.train.sft_steps and self.environment.dataset not in SFT_DATASETS:
            raise ValueError(f"train.sft_steps: dataset {self.environment.dataset!r} has no demonstrations "
                             f"to warm up on (those with: {list(SFT_DATASETS)})")
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
