"""The environment section: real tools, the dataset of tasks they run on, and the sandbox's limits."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from prorsa.config.section import C_LONG, MANY, Section


class SandboxSettings(Section):
    """Limits of one sandboxed call (python tool, command tools); agent/tools/sandbox.py."""

    wall_s: float = Field(10.0, gt=0)
    cpu_s: int = Field(10, ge=1, le=C_LONG)  # of the whole call, and of each process in it
    memory_bytes: int = Field(1 << 30, ge=16 << 20, le=C_LONG)  # of the whole call, and of each process
    file_bytes: int = Field(16 << 20, ge=0, le=C_LONG)  # the largest one file
    scratch_bytes: int = Field(64 << 20, ge=1 << 20, le=C_LONG)  # all the call's files (its tmpfs)
    processes: int = Field(32, ge=2, le=C_LONG)  # the launcher counts as one
    cpus: float = Field(1.0, gt=0, le=4096)  # CPUs busy at once (only where a cgroup v2 is delegated)
    output_bytes: int = Field(1 << 20, ge=1024, le=C_LONG)
    cgroup: str | None = None  # a delegated cgroup v2 directory (None: the tool worker's own, if delegated)


_BUILTIN_TOOLS = ("python", "calculator", "search")
_DATASETS = ("math-tir", "search", "swe-lite", "arith", "arith-digits")
SFT_DATASETS = ("arith", "arith-digits")  # with demonstrations (train/sft.py DEMONSTRATIONS)
_DATASET_TOOLS = {"math-tir": {"python"}, "search": {"search"}, "swe-lite": {"python"},
                  "arith": {"calculator"}, "arith-digits": {"calculator"}}


class TaskColumns(Section):
    """Which column of a Hugging Face dataset fills each task field (agent/datasets/hf.py)."""

    prompt: str  # what the model is asked
    answer: str | None = None  # the reference answer the reward compares; None: ""
    task_id: str | None = None  # None: "<dataset>-<row>"
    calls: str | None = None  # reference tool calls ([{name, arguments}] or its JSON); replay needs them
    tests: str | None = None  # Python snippets (a list of strings) for pass_rate


class EnvironmentConfig(Section):
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
