"""Fitted profiles as YAML text that profiles.py loads, with the measurements they came from.

    Provenance                      when, by which command, on what machine the samples were taken
    error_rows(samples, predicted)  measured vs predicted per sample -> table rows (strings)
    error_summary(samples, predicted)  median and max absolute relative error
    hardware_yaml(fit, kv_capacity_tokens, samples, provenance)   configs/hardware/<name>.yaml
    model_yaml(fields, mfu_linear, provenance, hardware)           configs/models/<name>.yaml
    model_path_for(hardware_path, name)   where the model profile goes beside a hardware profile
    write_profiles(measured, hardware_path, model_path, provenance) -> Fit   fit and write both
    write_texts({path: text})       write files atomically
    set_fields(text, {key: (value, note)})   a profile's text with some fields replaced

profiles.py refuses unknown keys, so the raw measurements and the table live in comments beside
the fitted values: the file stays a plain profile and still says where its numbers came from.
Tags: [F] fitted to the measurements in the file, [D] derived, [E] estimate, [S] public source.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prorsa.costmodel.calibrate import Fit, StepSample, fit, model_fields_from_hf
from prorsa.costmodel.profiles import ModelProfile

MEM_FRACTION = 0.9  # CostModel's default: hbm_bytes is sized so its KV capacity is the engine's


@dataclass(frozen=True)
class Provenance:
    date: str  # when the samples were taken, ISO 8601
    command: str  # the command that took them
    machine: str  # CPU model, cores, what was measured on
    conditions: str  # e.g. the load average while measuring: other work slows every step


def error_rows(samples: Sequence[StepSample], predicted: Sequence[float]) -> list[str]:
    rows = [f"{'kind':8}{'batch':>6}{'new':>6}{'context':>8}{'measured ms':>13}{'predicted ms':>14}"
            f"{'error':>8}  repeats ms"]
    for s, p in zip(samples, predicted):
        reps = " ".join(f"{1e3 * r:.1f}" for r in s.repeats)
        rows.append(f"{s.kind:8}{s.batch:6d}{s.new:6d}{s.context:8.0f}{1e3 * s.seconds:13.2f}"
                    f"{1e3 * p:14.2f}{100 * (p / s.seconds - 1):+7.1f}%  {reps}")
    return rows


def error_summary(samples: Sequence[StepSample], predicted: Sequence[float]) -> tuple[float, float]:
    err = np.abs(np.asarray(predicted) / np.array([s.seconds for s in samples]) - 1)
    return float(np.median(err)), float(err.max())


# A fitted profile must predict the median measured step within this. The shipped fits miss by a
# median 3.2% (configs/hardware/cpu.yaml, one vLLM CPU engine) and under 2% on step times made
# from known constants (tests/costmodel); a median past 15% means the roofline did not explain the
# steps (a machine loaded while it measured, a file of another stack), and is not written.
FIT_MEDIAN_BOUND = 0.15


def check_fit(samples: Sequence[StepSample], predicted: Sequence[float],
              bound: float = FIT_MEDIAN_BOUND) -> None:
    """ValueError, before anything is written, when the fit misses its own measurements by a
    median past `bound` (a fraction)."""
    med, worst = error_summary(samples, predicted)
    if med > bound:
        raise ValueError(f"the fitted profile misses the measured step times by a median {100 * med:.0f}% "
                         f"(max {100 * worst:.0f}%), beyond the {100 * bound:.0f}% a fit may miss by; "
                         "nothing written (measure again on a quiet machine, or allow more with "
                         "--max-fit-miss)")


def _field(key: str, value: str, note: str) -> str:
    return f"{key + ': ' + value:<31}# {note}"


def _header(title: str, prov: Provenance) -> list[str]:
    return [f"# {title}", f"# Measured {prov.date} by `{prov.command}`",
            f"# on {prov.machine}; {prov.conditions}."]


def hardware_yaml(fit: Fit, kv_capacity_tokens: int, samples: Sequence[StepSample],
                  prov: Provenance) -> str:
    g = fit.gpu_fields()
    weights = fit.model.params_total * fit.model.weight_bytes
    hbm = (kv_capacity_tokens * fit.model.kv_bytes_per_token + weights) / MEM_FRACTION
    bw_note = ("[F] achieved bytes/s streaming weights and KV" if fit.identified["mem_bw"] else
               "[F] lower bound: no measured step was memory-bound; any higher value fits as well")
    lines = _header(f"A CPU core running one vLLM CPU engine ({fit.model.name} model), fitted by "
                    "prorsa calibrate.", prov) + [
        "# Tags: [F] fitted to the measurements below, [D] derived, [E] estimate. Fitted at tp = 1:",
        "# one engine per core, one step at a time.",
        _field("peak_flops", f"{g['peak_flops']:.4g}", "[F] the faster achieved compute rate "
               f"(attention {fit.attn_flops:.3g}, linear {fit.linear_flops:.3g} FLOP/s)"),
        _field("peak_flops_fp8", f"{g['peak_flops']:.4g}", "[E] no fp8 path on CPU: as peak_flops"),
        _field("hbm_bytes", f"{hbm:.4g}", f"[D] the engine's KV cache ({kv_capacity_tokens} tokens) "
               f"plus weights, over mem_fraction {MEM_FRACTION}"),
        _field("hbm_bw", f"{g['hbm_bw']:.4g}", bw_note),
        _field("bw_efficiency", "1.0", "[D] hbm_bw is already the achieved bandwidth"),
        _field("mfu_attn", f"{g['mfu_attn']:.4g}", "[F] attention's share of peak_flops"),
        _field("step_overhead_s", f"{g['step_overhead_s']:.4g}",
               "[F] fixed cost per engine step (scheduling, sampling, process hand-offs)"),
        _field("nvlink_bw", "2.0e+9", "[E] unused at tp = 1; host-memory copy rate between processes"),
        _field("nvlink_efficiency", "1.0", "[E] unused at tp = 1"),
        _field("net_bw", "1.5e+9", "[E] KV pulled over NIXL through host memory (1.3-2 GiB/s "
               "between Dask workers; not measured by calibrate)"),
        _field("net_latency_s", "0.005", "[E] fixed cost of one NIXL KV pull (not measured by calibrate)"),
        _field("collective_latency_s", "0.0", "[E] unused at tp = 1"),
        _field("gpus_per_node", "2", "[E] engines pinned one per core on the measuring machine"),
        _field("dispatch_latency_s", "0.0", "[E] one engine alone, requests sent by calibrate itself; "
               "a live run's is fitted by prorsa calibrate --from-run"),
        _field("weight_load_bw", "1.5e+8", "[F] bytes/s of the memory-path weight update past its fixed cost "
               "(benchmarks/results/weight-sync-paths.json, shapes 0.5b and 1.5b; not measured by calibrate)"),
        "#",
        "# Measurements (vLLM per-request timings: prefill = scheduled to first token of a",
        "# max_tokens=1 request; decode = first to last token over the steps between; the median of",
        "# the repeats) and what this profile predicts for them:",
    ]
    predicted = fit.predict(samples)
    lines += [f"#   {row}" for row in error_rows(samples, predicted)]
    med, worst = error_summary(samples, predicted)
    lines.append(f"# Median absolute error {100 * med:.1f}%, max {100 * worst:.1f}%; "
                 f"memory-bound at {fit.memory_bound} of {len(samples)} points.")
    return "\n".join(lines) + "\n"


def model_yaml(fields: dict, mfu_linear: float, prov: Provenance, hardware: str) -> str:
    lines = _header("The tiny random Llama of the vLLM CPU engines (prorsa model make-tiny): its "
                    "config.json, and mfu_linear fitted with the hardware profile.", prov)
    lines += [f"# [D] from the model's config.json; [F] fitted together with configs/hardware/{hardware}.yaml."]
    for key, value in fields.items():
        lines.append(_field(key, f"{value:.7g}" if isinstance(value, float) else str(value), "[D]"))
    lines.append(_field("mfu_linear", f"{mfu_linear:.4g}", f"[F] linear layers' share of {hardware}'s peak_flops"))
    return "\n".join(lines) + "\n"


def model_path_for(hardware_path: Path, name: str) -> Path:
    """configs/hardware/X.yaml -> configs/models/<name>.yaml; anywhere else, beside it."""
    hardware_path = Path(hardware_path)
    if hardware_path.parent.name == "hardware":
        return hardware_path.parent.parent / "models" / f"{name}.yaml"
    return hardware_path.parent / f"{name}.yaml"


_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


def write_profiles(measured, hardware_path: Path, model_path: Path, prov: Provenance,
                   max_miss: float = FIT_MEDIAN_BOUND) -> Fit:
    """Fit the samples of a measure.Measured and write both profiles (each atomically)."""
    dtype_bytes = _DTYPE_BYTES.get(measured.dtype)
    if dtype_bytes is None:
        raise ValueError(f"dtype {measured.dtype!r}: give the engine an explicit dtype "
                         f"({', '.join(_DTYPE_BYTES)}) so the profile knows its bytes per weight")
    fields = model_fields_from_hf(json.loads((Path(measured.model_dir) / "config.json").read_text()),
                                  dtype_bytes)
    model_path, hardware_path = Path(model_path), Path(hardware_path)
    result = fit(measured.samples, ModelProfile(name=model_path.stem, mfu_linear=1.0, **fields))
    for key, value in result.gpu_fields().items():
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"the fit gave {key} = {value}: the measurements do not determine it")
    check_fit(measured.samples, result.predict(measured.samples), max_miss)
    texts = {hardware_path: hardware_yaml(result, measured.kv_capacity_tokens, measured.samples, prov),
             model_path: model_yaml(fields, result.mfu_linear(), prov, hardware_path.stem)}
    write_texts(texts)
    return result


def write_texts(texts: dict[Path, str]) -> None:
    """Each file written whole or not at all: a simulator reading it meanwhile sees one version."""
    for path, text in texts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def set_fields(text: str, values: dict[str, tuple[str, str]]) -> str:
    """A profile's text with the lines of `values`' keys replaced by (value, note); every other
    line, comments included, is kept. A key missing from the text is an error."""
    lines, seen = text.splitlines(), set()
    for i, line in enumerate(lines):
        key = line.split("#", 1)[0].partition(":")[0].strip()
        if key in values:
            lines[i] = _field(key, *values[key])
            seen.add(key)
    missing = sorted(set(values) - seen)
    if missing:
        raise ValueError(f"the profile has no field {missing[0]!r}")
    return "\n".join(lines) + "\n"
