"""Each engine backend answers, for its engines section, what the rest of prorsa asks of it;
the schema's backend names and the registry's are the same."""

from __future__ import annotations

import importlib.util
import typing

import pytest

from prorsa.config.engines import EnginesConfig
from prorsa.config.pipeline import PipelineConfig
from prorsa.engine.registry import BACKENDS, backend_of
from prorsa.report.rundata import _time_unit
from prorsa.rollout.context import time_unit


def test_every_backend_the_schema_allows_is_registered():
    assert set(BACKENDS) == set(typing.get_args(EnginesConfig.model_fields["backend"].annotation))


def test_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="engines.backend: unknown backend 'other'"):
        backend_of(EnginesConfig().model_copy(update={"backend": "other"}))


def test_emulated_engines_need_nothing_and_run_scaled():
    engines = EnginesConfig(time_scale=0.1)
    b = backend_of(engines)
    assert (b.name, b.time_scaled, b.launches_servers, b.measurable, b.vllm_layout) == ("emulated", True, False, False, False)
    assert (b.on_gpus, b.pins_cores, b.start_timeout_s) == (False, False, 0.0)
    assert b.model_dir() is None and b.unavailable() is None
    assert b.portable() is engines and b.admitting_by_priority() is engines


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_vllm_engines_are_servers_on_their_device(device):
    b = backend_of(EnginesConfig(backend="vllm", vllm={"device": device, "start_timeout_s": 42.0}))
    assert (b.name, b.time_scaled, b.launches_servers, b.measurable, b.vllm_layout) == ("vllm", False, True, True, True)
    assert (b.on_gpus, b.pins_cores, b.start_timeout_s) == (device == "cuda", device == "cpu", 42.0)
    assert b.admitting_by_priority().vllm.scheduling_policy == "priority"


def test_vllm_names_what_it_lacks(tmp_path, monkeypatch):
    b = backend_of(EnginesConfig(backend="vllm", vllm={"model": str(tmp_path / "none")}))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else object())
    assert b.unavailable() == ("engines.backend is vllm but vLLM is not installed "
                               "(run ./setup.sh, or use --engine emulated)")
    monkeypatch.undo()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert b.unavailable() == f"engines.vllm.model: {tmp_path / 'none'} is not a model directory (no config.json)"
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert backend_of(EnginesConfig(backend="vllm", vllm={"model": str(tmp_path / "m")})).unavailable() is None


@pytest.mark.parametrize(("backend", "unit"), [("emulated", 0.1), ("vllm", 1.0)])
def test_a_stored_run_and_a_resolved_pipeline_read_time_scale_alike(backend, unit):
    cfg = PipelineConfig(name="p", engines=EnginesConfig(backend=backend, time_scale=0.1))
    assert time_unit(cfg) == _time_unit(cfg.model_dump(mode="json")) == unit
    assert _time_unit({"engines": {"time_scale": 0.1}}) == 1.0  # no backend stored: unscaled, as before
