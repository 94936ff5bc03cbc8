"""The base of every pipeline section (frozen, unknown keys refused) and the bounds they share."""

from __future__ import annotations

from types import UnionType
from typing import Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


C_LONG = 2**63 - 1  # what an rlimit or a byte count handed to the OS must fit in
# Upper bounds on what multiplies a run's work or memory: past them an input is a typo, and
# accepting it would grow the run until the machine gives out, not fail with a message.
MANY = 2**20  # trajectories of one step, in flight, tasks, steps
MAX_WORKERS = 4096  # tool workers (processes), tool threads per worker


class Section(BaseModel):
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
