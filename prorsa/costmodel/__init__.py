"""Step-time cost model per GPU and model: prefill, decode, mixed steps, KV transfer, role switch.

Profiles (configs/hardware/*.yaml, configs/models/*.yaml) load into frozen records; CostModel
resolves them into constants once and answers step-time questions without I/O; RoleCosts holds
one per role where roles lay an engine's GPUs out differently (engines.parallelism).
"""

from prorsa.costmodel.layouts import RoleCosts
from prorsa.costmodel.profiles import GpuProfile, ModelProfile, config_dir, load_gpu, load_model
from prorsa.costmodel.roofline import CostModel

__all__ = ["CostModel", "GpuProfile", "ModelProfile", "RoleCosts", "config_dir", "load_gpu", "load_model"]
