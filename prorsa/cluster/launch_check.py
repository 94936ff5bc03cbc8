"""Whether a run's engines fit where they would start, asked before anything starts.

    check_launch(resolved, cluster, source, show)   ConfigError when they do not fit; `show`: print
                                                    the launch plan (launch_plan.py) as well

A local run puts every engine on this machine; batch jobs are given theirs, and an engine larger
than one job's `engines.gpus` is planned over several nodes (nodes.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from prorsa.cluster.devices import DevicePlanError
from prorsa.cluster.launch_plan import launch_plan, print_plan
from prorsa.cluster.nodes import spanning_engines
from prorsa.config.cluster import AddressSpec, ClusterSpec, LocalSpec, PbsSpec, SlurmSpec
from prorsa.config.load import ConfigError
from prorsa.engine.registry import backend_of, hosted_engines
from prorsa.roles import Role

if TYPE_CHECKING:
    from prorsa.rollout.context import RunContext


def check_launch(resolved: RunContext, cluster: ClusterSpec | None, source: str, show: Console | None = None) -> None:
    local = cluster is None or isinstance(cluster, LocalSpec)
    node_gpus = cluster.job("engines").gpus if isinstance(cluster, SlurmSpec | PbsSpec) else None
    engines = hosted_engines(resolved.cfg)
    try:
        if show is None and not local:  # batch jobs: one per node of an engine spanning nodes
            spans = spanning_engines(engines, node_gpus)
            if spans and isinstance(cluster, AddressSpec):
                # a running scheduler's workers are engines, tools and the trainer: none is a further node
                i, span = next(iter(spans.items()))
                raise ConfigError(f"{source}: engine-{i} spans {span.nodes} nodes of "
                                  f"{engines.vllm.node_ranks} ranks (engines.vllm.node_ranks); engines spanning "
                                  "nodes are launched on a local cluster or batch jobs, not on a running scheduler")
            return
        if show is None and not backend_of(engines).launches_servers:
            return
        plans = launch_plan(engines, _initial_roles(resolved), local, node_gpus=node_gpus)
    except DevicePlanError as e:
        raise ConfigError(f"{source}: {e}") from None
    if show is not None:
        print_plan(plans, show)


def _initial_roles(resolved: RunContext) -> list[Role]:
    from prorsa.control.policy import make_policy

    return make_policy(resolved.cfg.policy, resolved.policy).initial_roles(resolved.cfg.engines.count)
