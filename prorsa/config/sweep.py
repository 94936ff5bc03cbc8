"""The sweep file (configs/sweeps/*.yaml): a base pipeline and the axes to grid over.

    SweepSpec                  the file as a frozen pydantic model; unknown keys are errors
    ModelChoice                one value of the model axis: a profile name, optionally its tp/ep
    load_sweep(path, overrides)  parse and validate -> SweepSpec, or one ConfigError line;
                               overrides (the command line's) go over the file's overrides:
    is_sweep(data)             a file's top-level mapping is a sweep's, not a pipeline's

    name: paper                          # default: the file's stem
    base: ../../pipelines/sim-paper.yaml # relative to this file
    axes:                                # each a list; a missing axis keeps the base's value
      policy: [colocated, "static:*", prorsa]
      workload: [swe, search]            # overrides workload.family
      model: [qwen3-8b, {name: qwen3-30b-a3b, ep: 8}]
      gpu: [h200]
      n_gpus: [32]                       # engines.count = n_gpus / (tp x ep)
      mode: [sync, async]
      seed: [0, 1]
    overrides: {workload.prompts: 64}    # dotted pipeline keys, fixed for every point
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prorsa.config.load import ConfigError, describe, read_mapping

# the pipeline key each axis sets: an override of it would be overwritten at every point
AXIS_KEYS = {"policy": "policy", "workload": "workload.family", "model": "engines.model",
             "gpu": "engines.gpu", "n_gpus": "engines.count", "mode": "workload.mode", "seed": "seed"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelChoice(_Strict):
    name: str  # cost-model profile (configs/models)
    tp: int | None = Field(None, ge=1)  # None: the base pipeline's engines.tp
    ep: int | None = Field(None, ge=1)  # None: the base pipeline's engines.ep

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


class Axes(_Strict):
    policy: list[str] | None = None  # policy specs; static:* is every static split
    workload: list[str] | None = None  # task family names
    model: list[ModelChoice] | None = None
    gpu: list[str] | None = None  # hardware profile names
    n_gpus: list[int] | None = None
    mode: list[Literal["sync", "async"]] | None = None
    seed: list[int] | None = None

    @field_validator("*")
    @classmethod
    def _distinct(cls, values: list | None) -> list | None:
        if values is None:
            return None
        if not values:
            raise ValueError("an axis needs at least one value")
        labels = [v.name if isinstance(v, ModelChoice) else v for v in values]
        dup = next((x for i, x in enumerate(labels) if x in labels[:i]), None)
        if dup is not None:
            raise ValueError(f"{dup!r} appears twice")
        if any(isinstance(x, int) and not isinstance(x, bool) and x < 0 for x in labels):
            raise ValueError("values must not be negative")
        return values

    @field_validator("n_gpus")
    @classmethod
    def _some_gpus(cls, values: list[int] | None) -> list[int] | None:
        if values and min(values) < 1:
            raise ValueError("n_gpus must be >= 1")
        return values


class SweepSpec(_Strict):
    name: str = Field("sweep", pattern=r"^[A-Za-z0-9_.-]+$")
    base: str  # pipeline file; load_sweep resolves it against the sweep file's directory
    axes: Axes = Axes()
    overrides: dict[str, Any] = {}  # dotted pipeline keys, e.g. workload.prompts: 64

    @model_validator(mode="after")
    def _overrides_clear_of_axes(self) -> SweepSpec:
        for axis, key in AXIS_KEYS.items():
            if key in self.overrides and getattr(self.axes, axis) is not None:
                raise ValueError(f"override {key} is set by the {axis} axis; drop one of them")
        return self


def is_sweep(data: dict[str, Any]) -> bool:
    """A sweep names its base, axes or overrides; a file without them is still one when an axis
    holds a list (`policy: [a, b]`: the README's shape before `axes:`), which no pipeline field
    of that name does. `prorsa validate` asks this, so it reads such a file as `prorsa sweep` does."""
    if {"base", "axes", "overrides"} & data.keys():
        return True
    return any(isinstance(data.get(axis), list) for axis in AXIS_KEYS)


def load_sweep(path: str | Path, overrides: dict[str, Any] | None = None) -> SweepSpec:
    path = Path(path)
    data = read_mapping(path)
    given = data.get("overrides", {})
    if overrides and isinstance(given, dict):  # a bad overrides: in the file is the schema's to report
        data = data | {"overrides": given | overrides}
    try:
        spec = SweepSpec.model_validate({"name": path.stem} | data)
    except ValidationError as e:
        errs = e.errors()
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise ConfigError(f"{path}: {describe(errs[0], SweepSpec)}{more}") from None
    base = (path.parent / spec.base).resolve()
    if not base.is_file():
        raise ConfigError(f"{path}: base: got {spec.base!r}; no such pipeline file")
    return spec.model_copy(update={"base": str(base)})
