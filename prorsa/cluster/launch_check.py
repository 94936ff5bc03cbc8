"""Whether a run's engines fit where they would start, asked before anything starts.

    check_launch(resolved, cluster, source, plan, shape) -> [EngineLaunch] | None
                        ConfigError when they do not fit; `plan`: the launch plan (launch_plan.py),
                        for the nodes of `shape` where given (--gpus-per-node), to print

A local run puts every engine on this machine; batch jobs are given theirs, and an engine larger
than one job's `engines.gpus` is planned over several nodes (nodes.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prorsa.cluster.devices import DevicePlanError
from prorsa.cluster.launch_plan import EngineLaunch, NodeShape, launch_plan
from prorsa.cluster.nodes import spanning_engines
from prorsa.config.cluster import AddressSpec, ClusterSpec, LocalSpec, PbsSpec, SlurmSpec
from prorsa.config.load import ConfigError
from prorsa.engine.registry import backend_of, hosted_engines
from prorsa.roles import Role

if TYPE_CHECKING:
    from prorsa.rollout.context import RunContext


def check_launch(resolved: RunContext, cluster: ClusterSpec | None, source: str, plan: bool = False,
                 shape: NodeShape | None = None) -> list[EngineLaunch] | None:
    """The plan where `plan` is asked for; refusals never print half a plan: the caller prints it."""
    local = cluster is None or isinstance(cluster, LocalSpec)
    node_gpus = cluster.job("engines").gpus if isinstance(cluster, SlurmSpec | PbsSpec) else None
    if shape is not None and not local:  # the node a batch job books
        node_gpus = len(shape.devices)
    engines = hosted_engines(resolved.cfg)
    try:
        if not plan and not local:  # batch jobs: one per node of an engine spanning nodes
            spans = spanning_engines(engines, node_gpus)
            if spans and isinstance(cluster, AddressSpec):
                # a running scheduler's workers are engines, tools and the trainer: none is a further node
                i, span = next(iter(spans.items()))
                raise ConfigError(f"{source}: engine-{i} spans {span.nodes} nodes of "
                                  f"{engines.vllm.node_ranks} ranks (engines.vllm.node_ranks); engines spanning "
                                  "nodes are launched on a local cluster or batch jobs, not on a running scheduler")
            return None
        if not plan and not backend_of(engines).launches_servers:
            return None
        plans = launch_plan(engines, _initial_roles(resolved), local, node_gpus=node_gpus, shape=shape)
    except DevicePlanError as e:
        raise ConfigError(f"{source}: {e}") from None
    return plans if plan else None


def _initial_roles(resolved: RunContext) -> list[Role]:
    from prorsa.control.policy import make_policy

    return make_policy(resolved.cfg.policy, resolved.policy).initial_roles(resolved.cfg.engines.count)
