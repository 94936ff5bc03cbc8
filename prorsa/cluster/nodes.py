"""Engines larger than a node: one vLLM server's DP-attention ranks spread over several nodes.

    span_nodes(layout, node_gpus, ...) -> NodeSpan | None     how an engine splits over nodes of
                                                              node_gpus GPUs; None: it fits one node;
                                                              DevicePlanError: it cannot be split
    NodeSpan.start_rank(k), .local_dp                         the DP ranks node k hosts
    node_args(span, k, address, rpc_port) -> [str]            the DP arguments node k's server adds
    spanning_engines(cfg, node_gpus) -> {index: NodeSpan}     the engines of a run that span nodes
    follower_name(index, k)                                   the Dask worker of engine index's node k
    follower_of(name) -> (index, k) | None                    the engine and node of a follower's name

vLLM runs DP attention across nodes with its mp backend: the first node (the leader) runs the
API server and its own local ranks, each further node runs `--headless` (engine cores only, no
API server) with the ranks from `--data-parallel-start-rank` on; all of them meet at the
leader's `--data-parallel-address`:`--data-parallel-rpc-port`. Only DP ranks cross nodes: a
rank's tensor-parallel group stays on one node (its all-reduces run every layer, on NVLink).

    tp1 x dp16 on 8-GPU nodes:  node 0 (leader)  ranks 0-7   --data-parallel-size-local 8
                                node 1 (headless) ranks 8-15  --data-parallel-start-rank 8

The node size is the GPUs one engine job books (the cluster file's `engines.gpus`). A run on
one machine has no further node, except as a rehearsal: CPU engines with `engines.vllm.node_ranks`
span "nodes" of that many ranks, each node a worker of its own (cluster/span_host.py), all on
127.0.0.1, launched exactly as the nodes of a GPU cluster would be.
"""

from __future__ import annotations

from dataclasses import dataclass

from prorsa.config.engines import EnginesConfig
from prorsa.config.layout import EngineLayout
from prorsa.cluster.devices import DevicePlanError, engine_layouts
from prorsa.engine.registry import backend_of

NODE_GPUS_FIELD = "engines.gpus"  # where the cluster file declares a node's GPUs (one engine job's)
NODE_RANKS_FIELD = "engines.vllm.node_ranks"  # where a pipeline declares a CPU "node"'s ranks


def _unit(node_field: str) -> str:
    return "ranks" if node_field == NODE_RANKS_FIELD else "GPUs"


@dataclass(frozen=True)
class NodeSpan:
    layout: EngineLayout  # the whole engine's layout: dp counts every rank on every node
    nodes: int  # nodes the engine takes: node 0 the leader, the rest headless
    local_dp: int  # DP ranks on each node (each of tp GPUs)

    def start_rank(self, node: int) -> int:
        """The first global DP rank on `node`."""
        if not 0 <= node < self.nodes:
            raise IndexError(f"node {node} of {self.nodes}")
        return node * self.local_dp


def span_nodes(layout: EngineLayout, node_gpus: int, field: str = "engines.vllm",
               node_field: str = NODE_GPUS_FIELD) -> NodeSpan | None:
    """`field`: the pipeline section that set the layout, `node_field` the setting that set the node
    size (GPUs, or CPU ranks), both named in a refusal."""
    if layout.gpus <= node_gpus:
        return None
    if layout.tp > node_gpus:
        raise DevicePlanError(f"{field}: tensor_parallel_size {layout.tp} is larger than a node's {node_gpus} "
                              f"{_unit(node_field)} ({node_field}); only data-parallel ranks span nodes")
    nodes = -(-layout.gpus // node_gpus)
    if layout.dp % nodes:
        raise DevicePlanError(f"{field}: data_parallel_size {layout.dp} does not divide evenly over the {nodes} nodes "
                              f"of {node_gpus} {_unit(node_field)} that tp {layout.tp} x dp {layout.dp} = "
                              f"{layout.gpus} {_unit(node_field)} takes ({node_field})")
    return NodeSpan(layout, nodes, layout.dp // nodes)


def node_args(span: NodeSpan, node: int, address: str, rpc_port: int | str) -> list[str]:
    """What node `node`'s server adds to the engine's layout arguments (which carry the global
    --data-parallel-size): its local ranks, and where the ranks meet. vLLM infers the leader's
    start rank (0); a headless node's must be given."""
    args = ["--data-parallel-size-local", str(span.local_dp)]
    if node > 0:
        args = ["--headless", *args, "--data-parallel-start-rank", str(span.start_rank(node))]
    return args + ["--data-parallel-address", address, "--data-parallel-rpc-port", str(rpc_port)]


def spanning_engines(cfg: EnginesConfig, node_gpus: int | None) -> dict[int, NodeSpan]:
    """Engine index -> its span, for the engines larger than a node; {} without a node size. The
    size: `node_gpus` for GPU engines, engines.vllm.node_ranks for CPU ones."""
    backend = backend_of(cfg)
    if not backend.launches_servers:  # only a server's ranks span nodes
        return {}
    node_field = NODE_GPUS_FIELD if backend.on_gpus else NODE_RANKS_FIELD
    size = node_gpus if backend.on_gpus else cfg.vllm.node_ranks
    if size is None:
        return {}
    field = "engines.groups" if cfg.groups is not None else "engines.vllm"
    spans = {i: span_nodes(layout, size, field, node_field) for i, layout in enumerate(engine_layouts(cfg))}
    return {i: s for i, s in spans.items() if s is not None}


def follower_name(index: int, node: int) -> str:
    """Not `engine-...`: the scheduler, the router and the metrics take those for engines to send
    legs to, and a follower serves none (its ranks are reached through the leader's API)."""
    return f"node-{node}-of-engine-{index}"



def follower_of(name) -> tuple[int, int] | None:
    """(engine index, node) of a worker named by follower_name; None for any other name."""
    parts = str(name).split("-")
    if len(parts) != 5 or parts[0] != "node" or parts[2:4] != ["of", "engine"] \
            or not (parts[1].isdigit() and parts[4].isdigit()):
        return None
    return int(parts[4]), int(parts[1])
