"""A cost model wrong by known factors: what a policy plans with when its model is not the engines'.

    ModelScale(prefill, decode, transfer)   throughput factors, 1.0 = exact
    ModelScale.parse("prefill=0.8,decode=1.25")   the command line's form
    scale.of(cost) -> CostModel             `cost` with those throughputs
    scale.of_roles(costs) -> RoleCosts      the same, role by role
    scale * other                           factors composed (a calibration's correction of a
                                            model already wrong)

The roofline's two regimes give the factors their meaning: a prefill step is compute-bound, so
"prefill throughput x0.8" is the peak FLOP/s (every MFU) x0.8; a decode step streams weights and
KV, so "decode throughput x1.25" is the HBM bandwidth x1.25. A step between the two (a small
prefill, a large decode batch) moves by what bounds it, as a real misfit does. `transfer` scales
the links (NVLink and the network): KV transfer, and with it the collectives over them.
Step overheads are not scaled: they are launch and scheduling time, the same in any model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from prorsa.costmodel.layouts import RoleCosts
from prorsa.costmodel.roofline import CostModel

_FIELDS = ("prefill", "decode", "transfer")


@dataclass(frozen=True)
class ModelScale:
    prefill: float = 1.0  # compute throughput of the model over the engines'
    decode: float = 1.0  # memory throughput of the model over the engines'
    transfer: float = 1.0  # link throughput of the model over the engines'

    def __post_init__(self) -> None:
        for name in _FIELDS:
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"model scale {name} must be a positive number, got {value!r}")

    @classmethod
    def parse(cls, text: str) -> ModelScale:
        """"prefill=0.8,decode=1.25" (any of prefill, decode, transfer; the rest 1.0)."""
        fields: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = part.partition("=")
            if not sep or name.strip() not in _FIELDS:
                raise ValueError(f"model scale: got {part!r}; expected NAME=FACTOR with NAME one of {', '.join(_FIELDS)}")
            try:
                fields[name.strip()] = float(value)
            except ValueError:
                raise ValueError(f"model scale {name.strip()}: got {value!r}; expected a number") from None
        return cls(**fields)

    @property
    def exact(self) -> bool:
        return self == ModelScale()

    def __mul__(self, other: ModelScale) -> ModelScale:
        return ModelScale(*(getattr(self, f) * getattr(other, f) for f in _FIELDS))

    def __str__(self) -> str:
        return ",".join(f"{f}={getattr(self, f):g}" for f in _FIELDS if getattr(self, f) != 1.0) or "exact"

    def of(self, cost: CostModel) -> CostModel:
        if self.exact:
            return cost
        g = cost.gpu
        gpu = replace(g, peak_flops=g.peak_flops * self.prefill, peak_flops_fp8=g.peak_flops_fp8 * self.prefill,
                      hbm_bw=g.hbm_bw * self.decode, nvlink_bw=g.nvlink_bw * self.transfer,
                      net_bw=g.net_bw * self.transfer)
        return CostModel(gpu, cost.model, tp=cost.tp, ep=cost.ep, mem_fraction=cost.mem_fraction,
                         switch_prefill_tokens=cost.switch_prefill_tokens, restart_s=cost.restart_s)

    def of_roles(self, costs: RoleCosts) -> RoleCosts:
        if self.exact:
            return costs
        models: dict[int, CostModel] = {}  # roles that share a model keep sharing one, built once
        for c in (costs.prefill, costs.decode, costs.mixed):
            if id(c) not in models:
                models[id(c)] = self.of(c)
        return RoleCosts(*(models[id(c)] for c in (costs.prefill, costs.decode, costs.mixed)))
