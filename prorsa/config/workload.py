"""The workload section (the trajectories a run draws) and the means a pipeline may declare of one."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, field_validator, model_validator

from prorsa.config.section import MANY, Section


FamilyName = Literal["swe", "search", "math-tir", "terminal", "coding-agent"]  # agent/families.py FAMILIES
FAMILY_NAMES: tuple[str, ...] = get_args(FamilyName)


class WorkloadConfig(Section):
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
    # latencies) and every prefix cache is invalidated; 0: no updates modelled; "auto": priced by the
    # cost model from the bytes an update moves into an engine (all its weights over its node's link:
    # CostModel.weight_update_time), for a pipeline that knows its model but not its update time
    weight_update_s: Annotated[float, Field(ge=0)] | Literal["auto"] = 0.0
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


class ExpectConfig(Section):
    """What a pipeline declares it expects of one trajectory, before anything is observed: means
    over a trajectory (tokens, and tool seconds of the cost model's clock). A prior, not the run's
    future: the policy plans its opening from it and corrects it as turns are observed."""

    prompt_tokens: float = Field(ge=0, le=2**30)  # the first turn's append
    observation_tokens: float = Field(ge=0, le=2**30)  # a later turn's append
    decode_tokens: float = Field(gt=0, le=2**30)  # per turn
    tool_s: float = Field(0.0, ge=0, le=86400)  # per tool call
    turns: float = Field(ge=1, le=65536)  # per trajectory
