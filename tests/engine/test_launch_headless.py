"""A headless node of an engine spanning nodes runs vLLM's `vllm serve --headless`, not the API
server entry point (which would ignore --headless and serve HTTP)."""

from __future__ import annotations

import sys

import pytest

from prorsa.cluster.nodes import node_args, span_nodes
from prorsa.config.layout import EngineLayout


def test_a_headless_node_goes_to_vllm_serve_with_its_ranks(monkeypatch):
    serve = pytest.importorskip("vllm.entrypoints.cli.serve")
    from prorsa.engine.vllm import _launch

    seen = []
    monkeypatch.setattr(serve.ServeSubcommand, "cmd", staticmethod(seen.append))
    layout = EngineLayout(1, 4, True)
    argv = ["--model", "m", *layout.server_args(), *node_args(span_nodes(layout, 2), 1, "node-a", 13345)]
    monkeypatch.setattr(sys, "argv", ["_launch.py", *argv])
    _launch._serve_headless()
    (args,) = seen
    assert args.headless and args.api_server_count is None  # serve's cmd makes it 0: no API server
    assert (args.data_parallel_size, args.data_parallel_size_local, args.data_parallel_start_rank) == (4, 2, 2)
    assert (args.data_parallel_address, args.data_parallel_rpc_port) == ("node-a", 13345)
