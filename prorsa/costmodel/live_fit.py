"""Fitting a hardware profile to a live rollout: what `prorsa calibrate` cannot see (pure: no I/O).

    turn_times(rows)                 a run's per-turn timings, from its trajectories' records
    refit(gpu, live, sim) -> LiveFit one correction step of the profile towards the live run
    LiveFit.profile_yaml(header)     the corrected profile as a hardware profile file's text

`prorsa calibrate` times one engine alone on its core. A live run shares the machine: on a small
CPU box three engines, the scheduler, the driver and the tool worker take turns on two cores, so an
engine's steps run slower than measured alone, and every leg spends time in Dask and HTTP that no
engine step accounts for. Both are measured here by comparing the live run's turn records with
the simulator's replay of the same workload under the same policy:

    share       engine time simulated / engine time measured (prefill + decode): the fraction of
                its calibrated speed an engine gets in this deployment; compute rates and
                bandwidth are multiplied by it, the fixed step cost divided by it (vLLM CPU
                engines: the host load of a sequence in flight is divided by it instead, below)
    dispatch    time per leg outside any engine (a turn's wall time less its queue, prefill,
                transfer, decode and tool time, plus its queue), live minus simulated
    transfer    a KV pull's time, live minus simulated, added to the fixed cost of one pull

The simulated side depends on the profile being fitted (slower engines queue more), so the caller
repeats: simulate with the corrected profile, refit, until the corrections are small. `live` may
pool the turns of several runs of one pipeline (a noisy machine); benchmarks/fidelity_vllm.py
checks the fit on runs with another seed. vLLM CPU engines are simulated on a shared host
(engine/core_share.py): their slowdown follows the load, so the share is fitted as each sequence
in flight's load on the host, not as one factor that would slow a lone engine in a step's tail as
much as a crowded one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prorsa.costmodel.profiles import GpuProfile

_FIRST_HOST_LOAD = 0.1  # cores per sequence in flight
_PHASES = ("queue_s", "prefill_s", "transfer_s", "decode_s", "tool_s")


@dataclass(frozen=True)
class TurnTimes:
    engine_s: float  # prefill + decode: time the turn's legs spent computing on engines
    outside_s: float  # wall time not accounted for by any phase, plus queueing
    transfer_s: float
    legs: int  # 2 when a prefill leg ran on its own engine, else 1


def turn_times(rows: Iterable[dict], unit: float = 1.0) -> list[TurnTimes]:
    """Per-turn timings from trajectory records (the trajectories.parquet rows of a run), in the
    cost model's seconds: a live run's are wall seconds, `unit` of them to a body second (emulated
    engines at a time scale)."""
    out = []
    for row in rows:
        for t in row["turns"]:
            phases = {k: (t.get(k) or 0.0) / unit for k in _PHASES}
            wall = (t["end_s"] - t["start_s"]) / unit
            out.append(TurnTimes(engine_s=phases["prefill_s"] + phases["decode_s"],
                                 outside_s=wall - sum(phases.values()) + phases["queue_s"],
                                 transfer_s=phases["transfer_s"],
                                 legs=2 if t.get("prefill_engine") else 1))
    return out


@dataclass(frozen=True)
class LiveFit:
    gpu: GpuProfile  # the profile after this correction
    share: float  # this step's multiplier on the engines' speed
    dispatch_delta_s: float  # this step's addition to dispatch_latency_s
    transfer_delta_s: float  # this step's addition to net_latency_s

    def converged(self, tol: float = 0.02) -> bool:
        scale = max(self.gpu.dispatch_latency_s, 1e-3)
        return abs(self.share - 1) < tol and abs(self.dispatch_delta_s) < tol * scale

    def profile_yaml(self, header: Sequence[str] = ()) -> str:
        lines = [f"# {h}" for h in header]
        for f in dataclasses.fields(self.gpu):
            value = getattr(self.gpu, f.name)
            if f.name != "name":
                lines.append(f"{f.name}: {value:.6g}" if isinstance(value, float) else f"{f.name}: {value}")
        return "\n".join(lines) + "\n"


def refit(gpu: GpuProfile, live: Sequence[TurnTimes], sim: Sequence[TurnTimes], host: bool = False) -> LiveFit:
    """One correction of `gpu` (the profile `sim` was simulated with) towards `live`. With `host`
    (vLLM CPU engines, which the simulator puts on one shared host) the engines' share goes into
    the host load of a sequence in flight, which slows engines only while the host is crowded;
    otherwise into their speed."""
    if not live or not sim:
        raise ValueError("no turns to fit: both runs must hold finished turns")
    # per turn, so that live repeats of the run pooled together fit as one run does
    share = (sum(t.engine_s for t in sim) / len(sim)) / max(sum(t.engine_s for t in live) / len(live), 1e-12)
    # per leg, on the whole run's totals: the makespan is a sum of such times, not a median of them
    dispatch = (sum(t.outside_s for t in live) / sum(t.legs for t in live)
                - sum(t.outside_s for t in sim) / sum(t.legs for t in sim))
    pulls_live = [t.transfer_s for t in live if t.legs == 2]
    pulls_sim = [t.transfer_s for t in sim if t.legs == 2]
    transfer = (sum(pulls_live) / len(pulls_live) - sum(pulls_sim) / len(pulls_sim)
                if pulls_live and pulls_sim else 0.0)
    if host:
        # from a small load where none is set: a factor cannot move zero
        speed = {"host_load_per_sequence": (gpu.host_load_per_sequence or _FIRST_HOST_LOAD) / share}
    else:
        speed = {"peak_flops": gpu.peak_flops * share, "peak_flops_fp8": gpu.peak_flops_fp8 * share,
                 "hbm_bw": gpu.hbm_bw * share, "step_overhead_s": gpu.step_overhead_s / share}
    corrected = dataclasses.replace(gpu, **speed, dispatch_latency_s=max(0.0, gpu.dispatch_latency_s + dispatch),
                                    net_latency_s=max(0.0, gpu.net_latency_s + transfer))
    return LiveFit(corrected, share, corrected.dispatch_latency_s - gpu.dispatch_latency_s,
                   corrected.net_latency_s - gpu.net_latency_s)
