"""How one vLLM engine lays the model over its GPUs, and what the cost model reads of it.

    EngineLayout(tp, dp, expert_parallel)   one engine's layout (frozen); an engine group carries one
      .gpus                                 GPUs one engine takes: tp x dp
      .cost_tp, .cost_ep                    the cost model's tp and ep for this layout
      .server_args()                        the vLLM server arguments that lay it out
    GroupSpec                               one engine group resolved (EnginesConfig.engine_groups):
                                            count, roles, the cost model's tp/ep, slots, vLLM layout

The cost model's `ep` counts DP-attention ranks of tp GPUs each that step in lockstep (an engine is
tp x ep GPUs there; an MoE layer's experts are spread over all of them). vLLM's DP attention is
that: `--data-parallel-size dp` ranks of `--tensor-parallel-size tp` GPUs, whose MoE layers
exchange tokens every step; `--enable-expert-parallel` shards the experts over the tp x dp GPUs
instead of tensor-slicing each one. Either way the cost model prices dp ranks of tp GPUs and
experts/(tp x dp) per GPU, so cost tp = tp and cost ep = dp.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLayout:
    tp: int = 1  # --tensor-parallel-size: GPUs of one DP rank
    dp: int = 1  # --data-parallel-size: DP-attention ranks of one engine (one server)
    expert_parallel: bool = False  # --enable-expert-parallel: experts sharded over tp x dp GPUs

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def cost_tp(self) -> int:
        return self.tp

    @property
    def cost_ep(self) -> int:
        return self.dp

    def server_args(self) -> list[str]:
        args = ["--tensor-parallel-size", str(self.tp)]
        if self.dp > 1:
            args += ["--data-parallel-size", str(self.dp)]
        if self.expert_parallel:
            args.append("--enable-expert-parallel")
        return args

    def describe(self) -> str:
        """`tp2 x dp4 ep`: what a plan table shows."""
        return f"tp{self.tp}" + (f" x dp{self.dp}" if self.dp > 1 else "") + (" ep" if self.expert_parallel else "")


@dataclass(frozen=True)
class GroupSpec:
    count: int  # engines in the group
    roles: tuple[str, ...]  # the roles they may take; with `declared`, the first is their opening role
    tp: int  # the cost model's layout of each engine
    ep: int
    slots: int  # concurrent requests each admits
    vllm: EngineLayout | None  # the server layout (vLLM backend); None for emulated groups
    declared: bool  # from engines.groups; False: the implicit group of engines alike

    @property
    def gpus(self) -> int:
        """GPUs of one engine."""
        return self.tp * self.ep
