"""The policy contract: how engine roles are chosen.

A policy is a pure function of a snapshot (no clock, no I/O, no engine handles): the live Dask
plugin and the simulator each build the snapshot and carry out the decision, so one policy object
runs in both bodies.

    initial_roles(n_engines)   once, before the first turn: the roles engines start in
    decide(snapshot)           every control interval: a target role map (possibly unchanged)

Register a policy with `@register("name")`; the pipeline names it as `policy: name[:args]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from prorsa.roles import Role


@dataclass(frozen=True)
class EngineSnapshot:
    engine_id: str
    role: Role  # observed role
    queued: int  # requests waiting for admission
    active: int  # sequences admitted
    kv_tokens: int  # KV tokens held
    kv_capacity: int


@dataclass(frozen=True)
class Snapshot:
    time_s: float  # seconds since the rollout began (the body's clock)
    engines: tuple[EngineSnapshot, ...]
    trajectories_by_state: dict[str, int] = field(default_factory=dict)  # lifecycle state -> count


@dataclass(frozen=True)
class Decision:
    targets: dict[str, Role]  # engine_id -> wanted role; engines not named keep theirs
    reason: str = ""  # why, for the decision log


class Policy(Protocol):
    name: str

    def initial_roles(self, n_engines: int) -> list[Role]: ...

    def decide(self, snapshot: Snapshot) -> Decision: ...


POLICIES: dict[str, Callable[..., Policy]] = {}


def register(name: str) -> Callable[[Callable[..., Policy]], Callable[..., Policy]]:
    def deco(factory: Callable[..., Policy]) -> Callable[..., Policy]:
        POLICIES[name] = factory
        return factory

    return deco


def make_policy(spec: str) -> Policy:
    """`colocated`, `static:2:1`, `static:2:1:1` ... -> a policy object."""
    name, *args = spec.split(":")
    if name not in POLICIES:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown policy {name!r}; known: {known}")
    try:
        return POLICIES[name](*args)
    except (TypeError, ValueError) as e:
        usage = POLICIES[name].__doc__.strip().splitlines()[0] if POLICIES[name].__doc__ else ""
        raise ValueError(f"bad policy {spec!r}: {usage}") from e


class _FixedRoles:
    """Roles set once; decide() never changes them."""

    name: str
    roles: list[Role]

    def initial_roles(self, n_engines: int) -> list[Role]:
        if len(self.roles) != n_engines:
            raise ValueError(f"policy {self.name} assigns {len(self.roles)} engines, the run has {n_engines}")
        return list(self.roles)

    def decide(self, snapshot: Snapshot) -> Decision:
        return Decision(targets={})


@register("colocated")
class Colocated(_FixedRoles):
    """Every engine does both phases (chunked prefill co-batched with decode): the baseline."""

    def __init__(self) -> None:
        self.name = "colocated"
        self.roles = []

    def initial_roles(self, n_engines: int) -> list[Role]:
        return [Role.MIXED] * n_engines


@register("static")
class Static(_FixedRoles):
    """static:P:D[:M], a fixed split of P prefill, D decode and M mixed engines (P, D >= 1 or M >= 1)."""

    def __init__(self, prefill: str, decode: str, mixed: str = "0") -> None:
        p, d, m = int(prefill), int(decode), int(mixed)
        if min(p, d, m) < 0 or (m == 0 and (p == 0 or d == 0)):
            raise ValueError("a static split needs a prefill and a decode engine, or mixed ones")
        self.name = f"static:{p}:{d}" + (f":{m}" if m else "")
        self.roles = [Role.PREFILL] * p + [Role.DECODE] * d + [Role.MIXED] * m
