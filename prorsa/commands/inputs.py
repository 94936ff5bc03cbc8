"""What a command is given, resolved or refused before anything starts.

    load_pipeline(path, overrides) -> RunContext   the pipeline with its schema and cross-checks
    with_options(items, **options) -> dict         KEY=VALUE arguments, the named options over them
    prior_path(path) -> str | None                 --prior as an absolute path
    cluster_from(value) -> ClusterSpec | None      --cluster: a cluster file or a scheduler address
    node_shape(gpus_per_node, devices) -> NodeShape | None   --gpus-per-node / --devices: a plan's node
    check_engines(cfg, pipeline)                   what the engines need here (vLLM: the package, a model)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prorsa.commands.errors import fail, or_fail
from prorsa.config.load import ConfigError

if TYPE_CHECKING:
    from prorsa.cluster.launch_plan import NodeShape
    from prorsa.config.cluster import ClusterSpec
    from prorsa.config.pipeline import PipelineConfig
    from prorsa.rollout.context import RunContext


def load_pipeline(path: str, overrides: dict) -> RunContext:
    """The pipeline resolved (rollout/context.py): schema and cross-checks, or one error line."""
    from prorsa.rollout.context import load_run

    return or_fail(load_run, path, overrides)


def with_options(items: tuple[str, ...], **options) -> dict:
    """KEY=VALUE arguments (hydra's form: workload.prompts=64), then the named options over them."""
    from prorsa.config.load import parse_overrides

    given = or_fail(parse_overrides, items)
    return given | {k: v for k, v in options.items() if v is not None}


def prior_path(path: str | None) -> str | None:
    return None if path is None else str(Path(path).resolve())


def cluster_from(value: str | None) -> ClusterSpec | None:
    """None: no --cluster, the command's own LocalCluster."""
    from prorsa.config.cluster import cluster_option

    try:
        return cluster_option(value) if value else None
    except ConfigError as e:
        fail(str(e))


def node_shape(gpus_per_node: int | None, devices: str | None) -> NodeShape | None:
    """The GPU node a plan is for, as given; None: this machine's (engines.devices, CUDA_VISIBLE_DEVICES, NVML)."""
    from prorsa.cluster.launch_plan import NodeShape

    if devices is None:
        return None if gpus_per_node is None else NodeShape(tuple(map(str, range(gpus_per_node))),
                                                             f"--gpus-per-node {gpus_per_node}")
    listed = tuple(d.strip() for d in devices.split(","))
    if not all(listed):
        fail(f"--devices: got {devices!r}; expected GPUs separated by commas, e.g. 0,1,2,3")
    if gpus_per_node is not None and gpus_per_node != len(listed):
        fail(f"--gpus-per-node {gpus_per_node} but --devices lists {len(listed)} GPUs; give one of them")
    return NodeShape(listed, f"--devices {devices}")


def check_engines(cfg: PipelineConfig, pipeline: str) -> None:
    from prorsa.engine.registry import backend_of

    if missing := backend_of(cfg.engines).unavailable():
        fail(f"{pipeline}: {missing}")
