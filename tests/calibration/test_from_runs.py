"""The simulator's dispatch latency, and a profile corrected to a run whose true profile is known:
a "live" run simulated with a slowed-down profile stands in for the machine, so the fit's
prediction of another seed can be checked against the truth."""

from __future__ import annotations

import dataclasses

import pyarrow.parquet as pq
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.config.pipeline import PipelineConfig
from prorsa.costmodel import load_gpu
from prorsa.costmodel.live_fit import LiveFit
from prorsa.calibration.from_runs import fit_to_run, simulate_with

BASE = {
    "name": "fit", "seed": 3, "policy": "static:2:1",
    "engines": {"backend": "emulated", "count": 3, "slots": 16, "gpu": "cpu", "model": "tiny"},
    "workload": {"family": "swe", "mode": "sync", "prompts": 4, "group_size": 4, "steps": 2, "max_turns": 4,
                 "token_scale": 0.1, "max_context": 1536, "tool_time_scale": 0.5},
}


def cfg(seed: int) -> PipelineConfig:
    return PipelineConfig.model_validate(BASE | {"seed": seed})


def _profile(tmp_path, name: str, **changes) -> str:
    gpu = dataclasses.replace(load_gpu("cpu"), **changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(LiveFit(gpu, 1.0, 0.0, 0.0).profile_yaml())
    return str(path)


def test_every_leg_waits_the_profiles_dispatch_latency(tmp_path):
    plain, plain_rows = simulate_with(cfg(3), "cpu", tmp_path / "plain")
    slow, rows = simulate_with(cfg(3), _profile(tmp_path, "slow", dispatch_latency_s=0.25), tmp_path / "slow")
    turns = [t for r in rows for t in r["turns"]]
    assert len(turns) == sum(len(r["turns"]) for r in plain_rows)
    for t in turns:
        legs = 2 if t["prefill_engine"] else 1
        assert t["end_s"] - t["start_s"] >= legs * 0.25 + t["decode_s"] + t["tool_s"] - 1e-9
    assert slow > plain + 4 * 0.25  # at least the longest trajectory's legs, one after another


def test_a_profile_fitted_to_one_run_predicts_another_seed(tmp_path):
    cpu = load_gpu("cpu")  # the machine: engines at 60% of their calibrated speed, 200 ms a leg in transit
    truth = _profile(tmp_path, "truth", peak_flops=cpu.peak_flops * 0.6, hbm_bw=cpu.hbm_bw * 0.6,
                     step_overhead_s=cpu.step_overhead_s / 0.6, dispatch_latency_s=0.2, net_latency_s=0.03)
    simulate_with(cfg(3), truth, tmp_path / "machine")
    live_rows = pq.read_table(tmp_path / "machine" / "trajectories.parquet").to_pylist()
    fits = fit_to_run(cfg(3), live_rows, tmp_path)
    assert fits[-1].converged()
    fitted = fits[-1].gpu
    assert abs(fitted.dispatch_latency_s - 0.2) < 0.04 and abs(fitted.net_latency_s - 0.03) < 0.01
    assert abs(fitted.peak_flops / cpu.peak_flops - 0.6) < 0.06
    held_out, _ = simulate_with(cfg(4), truth, tmp_path / "machine-4")
    predicted, _ = simulate_with(cfg(4), str(tmp_path / "cpu-live.yaml"), tmp_path / "predicted-4")
    base, _ = simulate_with(cfg(4), "cpu", tmp_path / "base-4")
    assert abs(predicted / held_out - 1) < 0.05 < abs(base / held_out - 1)


def test_a_time_scaled_emulated_run_is_fitted_in_body_seconds(tmp_path):
    """Emulated engines at a time scale record wall seconds; the fit compares them with the
    simulator's body seconds, so a run at a quarter of real time finds the same dispatch time."""
    scaled = PipelineConfig.model_validate(BASE | {
        "engines": BASE["engines"] | {"time_scale": 0.25},
        "workload": BASE["workload"] | {"tool_time_scale": 0.5 * 0.25}})  # tools on the engines' clock
    truth = _profile(tmp_path, "truth", dispatch_latency_s=0.2)
    simulate_with(scaled, truth, tmp_path / "machine")
    body_rows = pq.read_table(tmp_path / "machine" / "trajectories.parquet").to_pylist()
    keys = ("start_s", "end_s", "queue_s", "prefill_s", "transfer_s", "decode_s", "tool_s")
    wall_rows = [r | {"turns": [t | {k: (t[k] or 0.0) * 0.25 for k in keys} for t in r["turns"]]} for r in body_rows]
    fitted = fit_to_run(scaled, wall_rows, tmp_path)[-1].gpu
    assert abs(fitted.dispatch_latency_s - 0.2) < 0.04
    assert abs(fitted.peak_flops / load_gpu("cpu").peak_flops - 1) < 0.06


def test_vllm_cpu_engines_are_fitted_by_their_load_on_the_host(tmp_path):
    """The machine: three vLLM CPU engines on two cores, each sequence in flight taking a third of
    a core elsewhere on the host. The fit finds that load, not a uniform slowdown, and predicts
    another seed from it."""
    def vllm_cfg(seed: int) -> PipelineConfig:
        engines = BASE["engines"] | {"backend": "vllm", "vllm": {"model": "tiny", "device": "cpu", "cores_per_engine": 1}}
        return PipelineConfig.model_validate(BASE | {"seed": seed, "engines": engines})

    cpu = load_gpu("cpu")
    truth = _profile(tmp_path, "truth", host_load_per_sequence=0.3, dispatch_latency_s=0.2)
    simulate_with(vllm_cfg(3), truth, tmp_path / "machine")
    live_rows = pq.read_table(tmp_path / "machine" / "trajectories.parquet").to_pylist()
    fits = fit_to_run(vllm_cfg(3), live_rows, tmp_path)
    fitted = fits[-1].gpu
    assert fits[-1].converged() and abs(fitted.host_load_per_sequence - 0.3) < 0.05
    assert fitted.peak_flops == cpu.peak_flops and abs(fitted.dispatch_latency_s - 0.2) < 0.04
    held_out, _ = simulate_with(vllm_cfg(4), truth, tmp_path / "machine-4")
    predicted, _ = simulate_with(vllm_cfg(4), str(tmp_path / "cpu-live.yaml"), tmp_path / "predicted-4")
    assert abs(predicted / held_out - 1) < 0.05


def test_prorsa_calibrate_from_run_writes_the_corrected_profile(tmp_path):
    cpu = load_gpu("cpu")
    truth = _profile(tmp_path, "truth", dispatch_latency_s=0.3)
    run_dir = tmp_path / "run"
    simulate_with(cfg(3), truth, run_dir)  # a finished run of the pipeline below, on a slower "machine"
    (run_dir / "pipeline.json").write_text(cfg(3).model_dump_json())
    out = tmp_path / "fitted.yaml"
    r = CliRunner().invoke(main, ["calibrate", "--from-run", str(run_dir), "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert "corrected" in r.output and "correction 1:" in r.output
    fitted = load_gpu(str(out))
    assert abs(fitted.dispatch_latency_s - 0.3) < 0.05 and abs(fitted.peak_flops / cpu.peak_flops - 1) < 0.1


def test_prorsa_calibrate_from_run_refuses_what_is_not_a_finished_run(tmp_path):
    (tmp_path / "pipeline.json").write_text(cfg(3).model_dump_json())
    r = CliRunner().invoke(main, ["calibrate", "--from-run", str(tmp_path)])
    assert r.exit_code == 2 and "error:" in r.output and "summary.json" in r.output and "Traceback" not in r.output
    (tmp_path / "pipeline.json").write_text(cfg(3).model_dump_json().replace('"count":3', '"count":"many"'))
    r = CliRunner().invoke(main, ["calibrate", "--from-run", str(tmp_path)])
    assert r.exit_code == 2 and "pipeline.json" in r.output and "engines.count" in r.output, r.output


def test_prorsa_calibrate_pools_runs_of_one_pipeline_and_refuses_others(tmp_path):
    truth = _profile(tmp_path, "truth", dispatch_latency_s=0.3)
    runs = []
    for name, seed in (("a", 3), ("b", 3), ("other-seed", 4)):
        runs.append(tmp_path / name)
        simulate_with(cfg(seed), truth, runs[-1])
        (runs[-1] / "pipeline.json").write_text(cfg(seed).model_dump_json())
    out = tmp_path / "fitted.yaml"
    r = CliRunner().invoke(main, ["calibrate", "--from-run", str(runs[0]), "--from-run", str(runs[1]),
                                  "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert "(median)" in r.output and abs(load_gpu(str(out)).dispatch_latency_s - 0.3) < 0.05
    r = CliRunner().invoke(main, ["calibrate", "--from-run", str(runs[0]), "--from-run", str(runs[2])])
    assert r.exit_code == 2 and "other-seed" in r.output and "same pipeline" in r.output, r.output


def test_a_correction_that_cannot_reproduce_its_runs_is_refused_and_nothing_is_written(tmp_path):
    import json

    from prorsa.costmodel.profiles import config_dir

    truth = _profile(tmp_path, "truth", dispatch_latency_s=0.3)
    run_dir = tmp_path / "run"
    simulate_with(cfg(3), truth, run_dir)
    (run_dir / "pipeline.json").write_text(cfg(3).model_dump_json())
    # a summary 300x shorter than its turns: a time-scaled run, as `prorsa run` on scaled engines writes
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["makespan_s"] /= 300
    (run_dir / "summary.json").write_text(json.dumps(summary))
    before = sorted(p.name for p in (config_dir() / "hardware").iterdir())
    r = CliRunner().invoke(main, ["calibrate", "--from-run", str(run_dir)])
    assert r.exit_code == 2, r.output
    assert "beyond the 20% a fit may miss its own runs by); nothing written" in r.output, r.output
    assert not list(run_dir.glob("*-live.yaml"))
    assert sorted(p.name for p in (config_dir() / "hardware").iterdir()) == before


def test_a_correction_is_written_beside_the_first_run_unless_told(tmp_path):
    truth = _profile(tmp_path, "truth", dispatch_latency_s=0.3)
    run_dir = tmp_path / "run"
    simulate_with(cfg(3), truth, run_dir)
    (run_dir / "pipeline.json").write_text(cfg(3).model_dump_json())
    r = CliRunner().invoke(main, ["calibrate", "--from-run", str(run_dir)])
    assert r.exit_code == 0, r.output
    [written] = run_dir.glob("*-live.yaml")
    assert abs(load_gpu(str(written)).dispatch_latency_s - 0.3) < 0.05
