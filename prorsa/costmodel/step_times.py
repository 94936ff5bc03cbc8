"""Fitting a GPU profile to a step-time file of benchmarks/gpu_profile.py (a decoder stack timed in
plain PyTorch on the device, no serving engine): `prorsa calibrate --from-measurements FILE`.

    StepTimes                       a measurement file's samples and what they were taken on
    load_step_times(path)           read and check a file -> StepTimes
    measured_model(times, model)    the model profile as measured (the file's dtype, its shape checked)
    calibrate_from_file(path, gpu, hardware_path, model, model_path, command)   fit and write; table lines

What is kept and what is fitted. The datasheet values of the base GPU profile (peak FLOP/s, HBM
size and bandwidth, links) stay; the fit (calibrate.py) turns into the efficiencies against them:
mfu_attn and bw_efficiency in the hardware profile, mfu_linear in the model profile. The step
overhead stays the base profile's: the stack has no scheduler, so its fitted per-step floor is only
the device's (reported in a comment beside the field).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from prorsa.costmodel.calibrate import Fit, StepSample, fit
from prorsa.costmodel.profile_writer import (FIT_MEDIAN_BOUND, check_fit, error_rows, error_summary,
                                             set_fields, write_texts)
from prorsa.costmodel.profiles import GpuProfile, ModelProfile, load_gpu, load_model
from prorsa.costmodel.profiles import _resolve as profile_path

SCHEMA = "prorsa-step-times/1"  # benchmarks/gpu_profile.py writes it
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_SHAPE_FIELDS = ("layers", "hidden", "q_heads", "kv_heads", "head_dim", "vocab")  # file and profile alike


@dataclass(frozen=True)
class StepTimes:
    samples: tuple[StepSample, ...]
    model: dict  # the architecture measured (benchmarks/gpu_profile.py's Shape)
    dtype: str
    date: str
    device: str
    torch: str
    command: str
    layers_measured: int


def load_step_times(path: Path) -> StepTimes:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable measurement file: {err}") from None
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema is not {SCHEMA!r} (a file of benchmarks/gpu_profile.py)")
    if raw.get("dtype") not in _DTYPE_BYTES:
        raise ValueError(f"{path}: dtype {raw.get('dtype')!r}; expected one of {', '.join(_DTYPE_BYTES)}")
    try:
        samples = tuple(StepSample(s["kind"], int(s["batch"]), int(s["new"]), float(s["context"]),
                                   float(s["seconds"]), tuple(map(float, s.get("repeats", ()))))
                        for s in raw["samples"])
        return StepTimes(samples, dict(raw["model"]), raw["dtype"], str(raw["date"]), str(raw["device"]),
                         str(raw["torch"]), str(raw.get("command", "")), int(raw["layers_measured"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: malformed measurement file: {err!r}") from None


def measured_model(times: StepTimes, model: ModelProfile) -> ModelProfile:
    """`model` in the file's dtype (float32 on CPU streams 4 bytes a weight), after checking that
    the file measured this architecture."""
    for key in _SHAPE_FIELDS:
        if times.model.get(key) != getattr(model, key):
            raise ValueError(f"the file measured {key} = {times.model.get(key)}; profile {model.name} "
                             f"has {getattr(model, key)}")
    if model.is_moe:
        raise ValueError(f"{model.name}: the stack is dense; calibration fits dense models only")
    size = _DTYPE_BYTES[times.dtype]
    return dataclasses.replace(model, weight_bytes=size, kv_dtype_bytes=size, mfu_linear=1.0)


def _efficiencies(result: Fit, gpu: GpuProfile) -> dict[str, float]:
    """The fitted rates as fractions of the base profile's datasheet peaks."""
    out = {"mfu_linear": result.linear_flops / gpu.peak_flops, "mfu_attn": result.attn_flops / gpu.peak_flops,
           "bw_efficiency": result.mem_bw / gpu.hbm_bw}
    for key, value in out.items():
        if not 0 < value <= 1:
            raise ValueError(f"the fit gives {key} = {value:.3g} of {gpu.name}'s datasheet peak: the "
                             "measurements do not fit that profile (another device, or a bad run)")
    return out


def hardware_text(base_text: str, result: Fit, gpu: GpuProfile, times: StepTimes, source: str,
                  command: str) -> str:
    """The base profile's fields with the fitted ones replaced, a header saying where the fit came
    from, and the measured-vs-predicted table (comments: profiles.py refuses unknown keys)."""
    eff = _efficiencies(result, gpu)
    bw = ("[F] achieved fraction of hbm_bw streaming weights and KV" if result.identified["mem_bw"] else
          "[F] lower bound: no measured step was memory-bound")
    body = set_fields(base_text, {
        "mfu_attn": (f"{eff['mfu_attn']:.4g}", f"[F] attention at {result.attn_flops:.3g} FLOP/s"),
        "bw_efficiency": (f"{eff['bw_efficiency']:.4g}", bw),
        "step_overhead_s": (f"{gpu.step_overhead_s:.4g}",
                            f"[E] kept from {gpu.name}: the engine's scheduling; the bare stack's "
                            f"fitted floor is {1e3 * result.step_overhead_s:.3g} ms"),
    })
    kept = [ln for ln in body.splitlines() if not ln.startswith("#")]
    predicted = result.predict(times.samples)
    med, worst = error_summary(times.samples, predicted)
    scaled = (f", {times.layers_measured} of {times.model['layers']} layers timed and scaled"
              if times.layers_measured < times.model["layers"] else "")
    return "\n".join([
        f"# {gpu.name}: the base profile's datasheet values, efficiencies [F] fitted to {source}:",
        f"# a {times.model['profile']} stack with random weights in {times.dtype}{scaled},",
        f"# measured {times.date} on {times.device}, torch {times.torch},",
        f"# by `{times.command}`;", f"# fitted by `{command}`.",
        "# Tags: [S] public source, [D] derived, [E] estimate, [F] fitted to the measurements below.",
        *kept,
        "#",
        "# Measurements (the stack's step times, median of the repeats) and what this profile predicts:",
        *(f"#   {row}" for row in error_rows(times.samples, predicted)),
        f"# Median absolute error {100 * med:.1f}%, max {100 * worst:.1f}%; memory-bound at "
        f"{result.memory_bound} of {len(times.samples)} points.",
    ]) + "\n"


def calibrate_from_file(path: Path, gpu: str, hardware_path: Path, model: str, model_path: Path,
                        command: str, max_miss: float = FIT_MEDIAN_BOUND) -> list[str]:
    """Fit the file's samples, write the hardware profile (the base `gpu` with its efficiencies
    fitted) and the model profile (`model` with mfu_linear fitted); the measured-vs-predicted table."""
    times = load_step_times(path)
    base = load_gpu(gpu)
    profile = load_model(model)
    result = fit(times.samples, measured_model(times, profile))
    eff = _efficiencies(result, base)
    source = Path(path).name
    base_text = profile_path(gpu, "hardware").read_text()
    check_fit(times.samples, result.predict(times.samples), max_miss)
    write_texts({
        Path(hardware_path): hardware_text(base_text, result, base, times, source, command),
        Path(model_path): set_fields(profile_path(model, "models").read_text(), {"mfu_linear": (
            f"{eff['mfu_linear']:.4g}", f"[F] linear layers on {base.name}, fitted to {source}")}),
    })
    predicted = result.predict(times.samples)
    med, worst = error_summary(times.samples, predicted)
    return error_rows(times.samples, predicted) + [
        f"median absolute error {100 * med:.1f}%, max {100 * worst:.1f}%",
        f"mfu_linear {eff['mfu_linear']:.3f}, mfu_attn {eff['mfu_attn']:.3f}, bw_efficiency "
        f"{eff['bw_efficiency']:.3f}{'' if result.identified['mem_bw'] else ' (a bound only)'}; the stack's "
        f"step floor {1e3 * result.step_overhead_s:.3g} ms (step_overhead_s kept at "
        f"{base.step_overhead_s:g})",
        f"wrote {hardware_path} and {model_path}",
    ]

