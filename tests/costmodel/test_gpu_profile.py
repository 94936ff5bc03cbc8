"""The GPU step-time script (benchmarks/gpu_profile.py) on CPU at tiny scale, and fitting its files
(`prorsa calibrate --from-measurements`): a file made from known constants gives them back."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from prorsa.cli import main as cli
from prorsa.costmodel import CostModel, load_gpu, load_model
from prorsa.costmodel.calibrate import StepSample, model_fields_from_hf, predict
from prorsa.costmodel.step_times import SCHEMA, load_step_times

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_profile.py"
SMALL = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 64, "vocab_size": 1024, "intermediate_size": 512, "tie_word_embeddings": False}


@functools.cache
def script():
    spec = importlib.util.spec_from_file_location("gpu_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_profile"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def small_profile(path: Path) -> Path:
    fields = model_fields_from_hf(SMALL, 4) | {"mfu_linear": 1.0}
    path.write_text("".join(f"{k}: {v}\n" for k, v in fields.items()))
    return path


def test_the_script_reads_the_qwen3_8b_shape_from_its_profile():
    shape = script().model_shape("qwen3-8b")
    assert (shape.layers, shape.hidden, shape.q_heads, shape.kv_heads, shape.head_dim) == (36, 4096, 32, 8, 128)
    assert shape.intermediate == 12288  # Qwen3-8B config.json intermediate_size
    assert shape.vocab == 151936


def test_quick_grid_on_cpu_times_grow_with_the_work(tmp_path: Path):
    out = tmp_path / "steps.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--device", "cpu", "--layers", "1",
                          "--model", str(small_profile(tmp_path / "small.yaml")), "--output", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "times scaled to 2 layers" in run.stdout
    rec = json.loads(out.read_text())
    assert rec["schema"] == SCHEMA and rec["dtype"] == "float32" and rec["device_type"] == "cpu"
    assert rec["date"][:4].isdigit() and rec["torch"] and rec["device"]
    assert (rec["layers_measured"], rec["layers_scaled_to"]) == (1, 2)
    assert rec["model"]["intermediate"] == 512 and not rec["skipped"]
    t = {(s["kind"], s["batch"], s["new"], s["context"]): s for s in rec["samples"]}
    assert len(t) == 8
    for s in t.values():
        assert s["seconds"] == pytest.approx(2 * s["stack_s"] + s["head_s"])
        assert len(s["repeats"]) == 3 and not s["graph"]
    sec = {k: s["seconds"] for k, s in t.items()}
    for cached in (0, 512):
        assert sec["prefill", 1, 512, cached] > 2 * sec["prefill", 1, 16, cached]
    assert sec["decode", 16, 1, 2048] > 1.5 * sec["decode", 1, 1, 2048]
    assert sec["decode", 16, 1, 2048] > 1.5 * sec["decode", 16, 1, 64]
    times = load_step_times(out)  # what calibrate reads back
    assert len(times.samples) == 8 and times.layers_measured == 1


def synthetic_file(path: Path, cost: CostModel) -> list[StepSample]:
    """A measurement file of the script's default grid, its times from `cost`."""
    gp = script()
    shapes = [("prefill", 1, n, c) for n, c in gp.DEFAULT_PREFILL]
    shapes += [("decode", b, 1, c) for b, c in gp.DEFAULT_DECODE]
    samples = [StepSample(kind, b, n, c, 1.0) for kind, b, n, c in shapes]
    samples = [dataclasses.replace(s, seconds=predict(cost, s)) for s in samples]
    record = dict(schema=SCHEMA, date="2026-01-01T00:00+00:00", command="python benchmarks/gpu_profile.py",
                  device="a synthetic device", torch="2.x", dtype="bfloat16", layers_measured=36,
                  model=dataclasses.asdict(gp.model_shape("qwen3-8b")),
                  samples=[dict(kind=s.kind, batch=s.batch, new=s.new, context=s.context, seconds=s.seconds,
                                repeats=[s.seconds]) for s in samples])
    path.write_text(json.dumps(record))
    return samples


def test_fitting_a_file_from_known_constants_gives_them_back(tmp_path: Path):
    truth_gpu = dataclasses.replace(load_gpu("h200"), mfu_attn=0.45, bw_efficiency=0.85, step_overhead_s=2e-4)
    truth = CostModel(truth_gpu, dataclasses.replace(load_model("qwen3-8b"), mfu_linear=0.65))
    samples = synthetic_file(tmp_path / "steps.json", truth)
    hardware = tmp_path / "configs" / "hardware" / "h200.yaml"
    res = CliRunner().invoke(cli, ["calibrate", "--from-measurements", str(tmp_path / "steps.json"),
                                   "--gpu", "h200", "--model", "qwen3-8b", "--output", str(hardware)])
    assert res.exit_code == 0, res.output

    gpu, model = load_gpu(str(hardware)), load_model(str(tmp_path / "configs" / "models" / "qwen3-8b.yaml"))
    assert gpu.mfu_attn == pytest.approx(0.45, rel=0.02)
    assert gpu.bw_efficiency == pytest.approx(0.85, rel=0.02)
    assert model.mfu_linear == pytest.approx(0.65, rel=0.02)
    base = load_gpu("h200")
    assert (gpu.peak_flops, gpu.hbm_bw, gpu.nvlink_bw, gpu.step_overhead_s) == \
        (base.peak_flops, base.hbm_bw, base.nvlink_bw, base.step_overhead_s)  # datasheet and [E] kept
    assert "fitted floor is 0.2 ms" in hardware.read_text()
    # with the stack's floor as overhead, the written profiles reproduce the file
    fitted = CostModel(dataclasses.replace(gpu, step_overhead_s=2e-4), model)
    assert [predict(fitted, s) for s in samples] == pytest.approx([s.seconds for s in samples], rel=0.02)


def test_a_file_of_another_architecture_or_schema_is_refused(tmp_path: Path):
    synthetic_file(tmp_path / "steps.json", CostModel.from_names("h200", "qwen3-8b"))
    res = CliRunner().invoke(cli, ["calibrate", "--from-measurements", str(tmp_path / "steps.json"),
                                   "--gpu", "h200", "--model", "qwen3-32b", "--output", str(tmp_path / "h.yaml")])
    assert res.exit_code == 2 and "the file measured layers = 36" in res.output
    (tmp_path / "other.json").write_text(json.dumps({"schema": "something else"}))
    with pytest.raises(ValueError, match="schema"):
        load_step_times(tmp_path / "other.json")
    res = CliRunner().invoke(cli, ["calibrate", "--from-measurements", str(tmp_path / "steps.json")])
    assert res.exit_code == 2 and "--gpu" in res.output


def test_a_fit_that_misses_its_own_measurements_is_refused_and_nothing_is_written(tmp_path: Path):
    synthetic_file(tmp_path / "steps.json", CostModel.from_names("h200", "qwen3-8b"))
    record = json.loads((tmp_path / "steps.json").read_text())
    for i, s in enumerate(record["samples"]):  # every other step 3x slower: no roofline explains it
        s["seconds"] = s["repeats"][0] = s["seconds"] * (3.0 if i % 2 else 1.0)
    (tmp_path / "steps.json").write_text(json.dumps(record))
    res = CliRunner().invoke(cli, ["calibrate", "--from-measurements", str(tmp_path / "steps.json"),
                                   "--gpu", "h200", "--model", "qwen3-8b"])
    assert res.exit_code == 2, res.output
    assert "beyond the 15% a fit may miss by; nothing written" in res.output and "Traceback" not in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.json"]
    median = int(re.search(r"by a median (\d+)%", res.output).group(1))
    res = CliRunner().invoke(cli, ["calibrate", "--from-measurements", str(tmp_path / "steps.json"),
                                   "--gpu", "h200", "--model", "qwen3-8b", "--max-fit-miss", str(median - 2)])
    assert res.exit_code == 2 and f"beyond the {median - 2}% a fit may miss by" in res.output, res.output
    res = CliRunner().invoke(cli, ["calibrate", "--from-measurements", str(tmp_path / "steps.json"),
                                   "--gpu", "h200", "--model", "qwen3-8b", "--max-fit-miss", str(median + 2)])
    assert res.exit_code == 0, res.output  # allowed more, it writes, and says it was allowed more
    assert f"--max-fit-miss {median + 2}" in (tmp_path / "h200-fitted.yaml").read_text()


def test_a_fit_goes_beside_its_measurements_unless_told_never_over_a_shipped_profile(tmp_path: Path):
    from prorsa.costmodel.profiles import config_dir

    shipped = (config_dir() / "hardware" / "h200.yaml").read_text()
    synthetic_file(tmp_path / "steps.json", CostModel.from_names("h200", "qwen3-8b"))
    res = CliRunner().invoke(cli, ["calibrate", "--from-measurements", str(tmp_path / "steps.json"),
                                   "--gpu", "h200", "--model", "qwen3-8b"])
    assert res.exit_code == 0, res.output
    assert (config_dir() / "hardware" / "h200.yaml").read_text() == shipped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h200-fitted.yaml", "qwen3-8b.yaml", "steps.json"]
