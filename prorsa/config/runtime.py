"""The runtime section (workers, intervals, where a turn goes) and the trajectory scheduling switches."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, ValidationError, field_validator

from prorsa.config.engines import MAX_ENGINES
from prorsa.config.section import MANY, MAX_WORKERS, Section


class RuntimeConfig(Section):
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


class SchedulingConfig(Section):
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
