"""Hardware and model profiles for the cost model: frozen records loaded from configs/.

    config_dir()        where profiles live: $PRORSA_CONFIG_DIR, else the repository's configs/
    load_gpu(name)      configs/hardware/<name>.yaml -> GpuProfile
    load_model(name)    configs/models/<name>.yaml   -> ModelProfile

A name may also be a path to a YAML file. Every field is required (but dispatch_latency_s, added
later: profiles written before it mean 0) and every key must be known, so a typo never falls back
to a default; a bad file raises ValueError naming the file and the field.
Each YAML field carries a comment with its source: [S] public source, [D] derived, [E] estimate.
Profiles are read once, when a CostModel is built; nothing here is on the simulator's hot path.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

import prorsa


@dataclass(frozen=True)
class GpuProfile:
    name: str  # profile name (the file's stem)
    peak_flops: float  # dense bf16 tensor FLOP/s
    peak_flops_fp8: float  # dense fp8 tensor FLOP/s (used when a model's weights are 1 byte)
    hbm_bytes: float  # device memory, bytes
    hbm_bw: float  # device memory bandwidth, bytes/s
    bw_efficiency: float  # eta: achieved fraction of hbm_bw in weight/KV streaming
    mfu_attn: float  # achieved fraction of peak in attention
    step_overhead_s: float  # fixed cost per engine step (scheduling, launch, sampling)
    nvlink_bw: float  # NVLink bandwidth per direction per GPU, bytes/s
    nvlink_efficiency: float  # achieved fraction of nvlink_bw
    net_bw: float  # effective inter-node bandwidth per GPU (one NIC per GPU), bytes/s
    net_latency_s: float  # fixed cost of one KV transfer across nodes (handshake, metadata)
    collective_latency_s: float  # fixed cost of one all-reduce / all-to-all call
    gpus_per_node: int  # GPUs sharing one NVLink domain
    # time a request spends outside the engine per leg (the runtime's scheduling, the HTTP round
    # trip): what the simulator adds to every prefill and decode leg
    dispatch_latency_s: float = 0.0
    # a CPU profile's only (a "GPU" is then one core, gpus_per_node the host's cores): cores' worth
    # of the host a busy engine keeps busy, its compute and its server's processes with its part of
    # the driver, scheduler and tools; the simulator slows busy engines by the busy ones' total
    # over the host's cores when that exceeds 1 (engine/core_share.py)
    host_load_per_sequence: float = 0.0
    # bytes/s at which an engine takes in new weights whatever its link brings: vLLM's in-place
    # reload processes every layer it loads again (on CPU it repacks each linear weight for oneDNN);
    # 0: no bound but the link's (CostModel.weight_update_time)
    weight_load_bw: float = 0.0


@dataclass(frozen=True)
class ModelProfile:
    name: str  # profile name (the file's stem)
    layers: int  # L, transformer blocks
    hidden: int  # h, model width
    q_heads: int  # Hq, attention query heads
    kv_heads: int  # KV heads (GQA)
    head_dim: int  # dh
    vocab: int  # V, vocabulary (lm_head rows)
    params_total: float  # all parameters (memory footprint)
    params_embedding: float  # input embedding table: resident but not streamed per step
    params_active: float  # matmul parameters one token passes through in the blocks (no lm_head)
    experts: int  # E, routed experts per layer; 0 for a dense model
    experts_per_token: int  # k, routed experts per token; 0 for a dense model
    expert_params: float  # parameters of one routed expert in one layer; 0 for a dense model
    weight_bytes: int  # bytes per weight (2 = bf16, 1 = fp8)
    kv_dtype_bytes: int  # bytes per KV element
    mfu_linear: float  # achieved fraction of peak in the linear layers (lower for MoE)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head, in the KV dtype."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes


_T = TypeVar("_T", GpuProfile, ModelProfile)

# Fields that may be zero (a dense model has no experts; a latency may be neglected).
_MAY_BE_ZERO = {"experts", "experts_per_token", "expert_params", "params_embedding",
                "net_latency_s", "collective_latency_s", "step_overhead_s", "dispatch_latency_s",
                "host_load_per_sequence", "weight_load_bw"}
# Fractions must lie in (0, 1].
_FRACTIONS = {"bw_efficiency", "mfu_attn", "nvlink_efficiency", "mfu_linear"}


def config_dir() -> Path:
    """$PRORSA_CONFIG_DIR when set, else configs/ beside the package (the repository's)."""
    env = os.environ.get("PRORSA_CONFIG_DIR")
    return Path(env) if env else Path(prorsa.__file__).resolve().parents[1] / "configs"


def load_gpu(name: str) -> GpuProfile:
    return _load(GpuProfile, _resolve(name, "hardware"))


def load_model(name: str) -> ModelProfile:
    model = _load(ModelProfile, _resolve(name, "models"))
    _check_model(model, _resolve(name, "models"))
    return model


def _resolve(name: str, kind: str) -> Path:
    if name.endswith((".yaml", ".yml")):
        return Path(name)
    return config_dir() / kind / f"{name}.yaml"


def _load(cls: type[_T], path: Path) -> _T:
    if not path.is_file():
        raise ValueError(f"{path}: no such {cls.__name__} file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of fields, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "name"}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"{path}: unknown field {unknown[0]!r}; expected fields: {sorted(fields)}")
    values: dict[str, Any] = {"name": path.stem}
    for key, field in fields.items():
        if key not in raw:
            if field.default is dataclasses.MISSING:
                raise ValueError(f"{path}: missing field {key!r}")
            continue
        values[key] = _number(path, key, raw[key], field.type)
    return cls(**values)


def _number(path: Path, key: str, value: Any, type_name: Any) -> int | float:
    want_int = type_name in (int, "int")
    if isinstance(value, str) and not want_int:  # YAML 1.1 reads "1e9" (no sign) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    ok = isinstance(value, int) if want_int else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        kind = "an integer" if want_int else "a number"
        raise ValueError(f"{path}: field {key!r} = {value!r}: expected {kind}")
    if value < 0 or (value == 0 and key not in _MAY_BE_ZERO):
        raise ValueError(f"{path}: field {key!r} = {value!r}: expected a positive value")
    if key in _FRACTIONS and value > 1:
        raise ValueError(f"{path}: field {key!r} = {value!r}: expected a fraction in (0, 1]")
    return int(value) if want_int else float(value)


def _check_model(m: ModelProfile, path: Path) -> None:
    """Cross-field consistency: a dense model has no expert fields, an MoE model has all three."""
    expert_fields = {"experts": m.experts, "experts_per_token": m.experts_per_token,
                     "expert_params": m.expert_params}
    if any(expert_fields.values()) and not all(expert_fields.values()):
        zero = next(k for k, v in expert_fields.items() if not v)
        raise ValueError(f"{path}: field {zero!r} is 0 but other expert fields are set")
    if m.experts_per_token > m.experts:
        raise ValueError(f"{path}: field 'experts_per_token' = {m.experts_per_token} exceeds "
                         f"experts = {m.experts}")
    if m.params_active > m.params_total:
        raise ValueError(f"{path}: field 'params_active' exceeds params_total")
    if m.layers * m.experts * m.expert_params + m.params_embedding > m.params_total:
        raise ValueError(f"{path}: field 'expert_params' x experts x layers exceeds params_total")
