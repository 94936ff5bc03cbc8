"""Each policy's arguments as a typed record; the colon shorthand parses into it.

    POLICY_ARGS                     policy name -> its record (built-ins here; a policy registered
                                    with control.policy.register(name, args=...) adds its own)
    parse_policy(spec) -> (name, args | None)   "prorsa:4:2" or {"name": "prorsa", "horizon_s": 4}
    shorthand(name, args) -> str    the colon form, the fields given up to the last one written
    policy_spec(value) -> str       what a pipeline's `policy:` holds, checked: the shorthand

A pipeline names its policy either way:

    policy: prorsa:4:2                      # positional, in the record's field order
    policy: {name: prorsa, horizon_s: 4, hysteresis: 2}

and either is checked when the pipeline is read, naming the argument that is wrong, rather than when
the run builds its policy (after its cluster has started). The shorthand stays what runs, logs and
results name a policy by.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class PolicyArgs(BaseModel):
    """A policy's arguments: its fields in shorthand order, each with its default."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @classmethod
    def from_parts(cls, parts: Sequence[str]) -> PolicyArgs:
        names = list(cls.model_fields)
        if len(parts) > len(names):
            raise ValueError(f"takes at most {len(names)} argument{'s' * (len(names) != 1)}")
        return cls.model_validate(dict(zip(names, parts)))

    def parts(self) -> tuple[str, ...]:
        """The fields up to the last one written, as the shorthand writes them."""
        names = list(type(self).model_fields)
        given = [i for i, n in enumerate(names) if n in self.model_fields_set]
        return tuple(_word(getattr(self, n)) for n in names[:given[-1] + 1]) if given else ()


class NoArgs(PolicyArgs):
    """colocated (it takes no arguments)."""


class StaticArgs(PolicyArgs):
    """static:P:D[:M]; with engines.groups, `static` alone: each group's opening role."""

    prefill: int | None = Field(None, ge=0)
    decode: int | None = Field(None, ge=0)
    mixed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _whole_split(self) -> StaticArgs:
        if (self.prefill is None) != (self.decode is None):
            raise ValueError("a static split names prefill and decode engines both")
        return self


class ReactiveArgs(PolicyArgs):
    """reactive[:queue_tokens[:kv_util[:cooldown_s[:prefill_share]]]]."""

    queue_tokens: float = Field(4096.0, gt=0)  # prefill tokens waiting per prefill-serving engine
    kv_util: float = Field(0.8, gt=0, le=1)  # share of decode engines' KV in use
    cooldown_s: float = Field(5.0, ge=0)
    prefill_share: float = Field(0.5, ge=0, le=1)  # of the engines that start as prefill


class ProrsaArgs(PolicyArgs):
    """prorsa[:horizon_s[:hysteresis[:max_switches[:votes[:min_gain]]]]] (the oracle's too)."""

    horizon_s: float = Field(4.0, gt=0)  # the forecast's horizon
    hysteresis: float = Field(2.0, ge=0)  # a goal's switch costs count this many times over
    max_switches: int = Field(1, ge=0)  # per control interval
    votes: int = Field(2, ge=1)  # plans in a row a new goal must win
    # 0.15: the forecast's and the fluid model's errors move a split's predicted cost by ~10%, and
    # a switch on noise costs a drain (benchmarks/paper.py, the tuning set: 0.05 lost up to 9%)
    min_gain: float = Field(0.15, ge=0)


POLICY_ARGS: dict[str, type[PolicyArgs]] = {
    "colocated": NoArgs, "static": StaticArgs, "reactive": ReactiveArgs, "prorsa": ProrsaArgs, "oracle": ProrsaArgs,
}


def parse_policy(spec: str | Mapping[str, Any]) -> tuple[str, PolicyArgs | None]:
    """(name, its arguments checked), None for a policy with no record; ValueError naming the
    argument that is wrong."""
    if isinstance(spec, Mapping):
        rest = dict(spec)
        name = rest.pop("name", None)
        if not isinstance(name, str):
            raise ValueError("a policy written as a mapping needs name: (colocated, static, prorsa, ...)")
        model = POLICY_ARGS.get(name)
        if model is None:
            raise ValueError(f"policy {name!r} takes no mapping of arguments; write it as {name}:ARG:...")
        return name, _checked(model, lambda: model.model_validate(rest))
    name, *parts = str(spec).split(":")
    model = POLICY_ARGS.get(name)
    return name, None if model is None else _checked(model, lambda: model.from_parts(parts))


def shorthand(name: str, args: PolicyArgs | None) -> str:
    return ":".join((name, *(args.parts() if args is not None else ())))


def policy_spec(value: str | Mapping[str, Any]) -> str:
    """A pipeline's `policy:` as the shorthand; a string is kept as written once its arguments check."""
    name, args = parse_policy(value)
    return value if isinstance(value, str) else shorthand(name, args)


def _checked(model: type[PolicyArgs], build) -> PolicyArgs:
    """build(), its first error as one line: the argument, what is wrong, the policy's usage."""
    usage = (model.__doc__ or "").split(";")[0].split(" (")[0].strip().rstrip(".")
    try:
        return build()
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"]))
        msg = first["msg"].removeprefix("Value error, ")
        raise ValueError(f"{where + ': ' if where else ''}{msg} (usage: {usage})") from None
    except ValueError as e:
        raise ValueError(f"{e} (usage: {usage})") from None


def _word(x: object) -> str:
    """A float as short as reads back the same (4096, 0.15, 0.1234567), anything else as str."""
    if isinstance(x, float):
        return f"{x:g}" if float(f"{x:g}") == x else repr(x)
    return str(x)
