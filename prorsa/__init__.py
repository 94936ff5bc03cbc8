"""Prorsa: agentic RL rollout with prefill/decode disaggregation on Dask.

    prorsa.Rollout, prorsa.Trajectory, prorsa.Turn   the Python API (prorsa/api/), imported on
                                                     first use so that `import prorsa` loads
                                                     neither dask nor the engines
"""

from __future__ import annotations

from typing import Any

__all__ = ["Rollout", "Trajectory", "Turn"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from prorsa import api

        return getattr(api, name)
    raise AttributeError(f"module 'prorsa' has no attribute {name!r}")
