"""Correcting a hardware profile to a live run's turn records (costmodel/live_fit.py)."""

from __future__ import annotations

import dataclasses

import pytest

from prorsa.costmodel import load_gpu
from prorsa.costmodel.live_fit import TurnTimes, refit, turn_times


def _turn(start, end, prefill_engine="engine-0", **phases):
    return {"start_s": start, "end_s": end, "prefill_engine": prefill_engine,
            **{k: phases.get(k, 0.0) for k in ("queue_s", "prefill_s", "transfer_s", "decode_s", "tool_s")}}


def test_turn_times_split_a_turn_into_engine_time_and_time_outside():
    rows = [{"turns": [_turn(1.0, 3.0, queue_s=0.1, prefill_s=0.2, transfer_s=0.05, decode_s=1.0, tool_s=0.4),
                       _turn(3.0, 3.5, prefill_engine="", prefill_s=0.1, decode_s=0.2)]}]
    first, second = turn_times(rows)
    assert first.engine_s == pytest.approx(1.2) and first.transfer_s == 0.05 and first.legs == 2
    assert first.outside_s == pytest.approx(2.0 - 1.75 + 0.1)  # the unaccounted gap, plus the queue
    assert second.legs == 1 and second.outside_s == pytest.approx(0.2)


def test_a_time_scaled_runs_wall_seconds_become_body_seconds():
    rows = [{"turns": [_turn(1.0, 1.5, queue_s=0.025, prefill_s=0.05, decode_s=0.25, tool_s=0.1)]}]
    (wall,), (body,) = turn_times(rows), turn_times(rows, unit=0.25)
    assert body.engine_s == pytest.approx(4 * wall.engine_s) == pytest.approx(1.2)
    assert body.outside_s == pytest.approx(4 * wall.outside_s) == pytest.approx(0.4)


def test_refit_recovers_a_known_slowdown_and_dispatch_time():
    gpu = load_gpu("cpu")
    sim = [TurnTimes(engine_s=1.0 + i % 3, outside_s=0.01 * i, transfer_s=0.005, legs=2) for i in range(20)]
    live = [TurnTimes(engine_s=t.engine_s / 0.5, outside_s=t.outside_s + 2 * 0.15, transfer_s=0.04, legs=2)
            for t in sim]
    fit = refit(gpu, live, sim)
    assert fit.share == pytest.approx(0.5)
    assert fit.dispatch_delta_s == pytest.approx(0.15) and fit.gpu.dispatch_latency_s == pytest.approx(0.15)
    assert fit.transfer_delta_s == pytest.approx(0.035)
    assert fit.gpu.peak_flops == pytest.approx(gpu.peak_flops / 2) and fit.gpu.hbm_bw == pytest.approx(gpu.hbm_bw / 2)
    assert fit.gpu.step_overhead_s == pytest.approx(gpu.step_overhead_s * 2)
    assert not fit.converged() and refit(fit.gpu, live, live).converged()


def test_refit_on_a_shared_host_moves_the_load_per_sequence_not_the_speed():
    gpu = dataclasses.replace(load_gpu("cpu"), host_load_per_sequence=0.2)
    sim = [TurnTimes(engine_s=1.0, outside_s=0.0, transfer_s=0.0, legs=1)] * 4
    fit = refit(gpu, [TurnTimes(engine_s=1.5, outside_s=0.0, transfer_s=0.0, legs=1)] * 4, sim, host=True)
    assert fit.gpu.host_load_per_sequence == pytest.approx(0.3)
    assert (fit.gpu.peak_flops, fit.gpu.hbm_bw, fit.gpu.step_overhead_s) == (gpu.peak_flops, gpu.hbm_bw, gpu.step_overhead_s)
    unset = refit(load_gpu("cpu"), [TurnTimes(2.0, 0.0, 0.0, 1)], [TurnTimes(1.0, 0.0, 0.0, 1)], host=True)
    assert unset.gpu.host_load_per_sequence > 0  # a profile without a load starts from one


def test_the_corrected_profile_is_a_profile_file(tmp_path):
    gpu = dataclasses.replace(load_gpu("cpu"), dispatch_latency_s=0.2)
    fit = refit(gpu, [TurnTimes(1.0, 0.4, 0.0, 2)], [TurnTimes(1.0, 0.4, 0.0, 2)])
    path = tmp_path / "fitted.yaml"
    path.write_text(fit.profile_yaml(["a header"]))
    assert path.read_text().startswith("# a header\n")
    assert dataclasses.replace(load_gpu(str(path)), name="cpu") == gpu


def test_refit_refuses_runs_without_turns():
    with pytest.raises(ValueError, match="no turns"):
        refit(load_gpu("cpu"), [], [TurnTimes(1.0, 0.0, 0.0, 1)])
