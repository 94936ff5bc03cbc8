"""A vLLM engine's layout (tensor, data, expert parallelism) and the cost-model tp/ep read off it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prorsa.config.layout import EngineLayout
from prorsa.config.load import ConfigError
from prorsa.config.pipeline import EnginesConfig, VllmSettings
from prorsa.rollout.context import resolve
from prorsa.config.pipeline import PipelineConfig


def _engines(**vllm) -> EnginesConfig:
    return EnginesConfig(backend="vllm", model="qwen3-30b-a3b", vllm={"device": "cuda", **vllm})


def test_layout_gpus_cost_and_server_args():
    layout = EngineLayout(tp=2, dp=4, expert_parallel=True)
    assert (layout.gpus, layout.cost_tp, layout.cost_ep) == (8, 2, 4)
    assert layout.server_args() == ["--tensor-parallel-size", "2", "--data-parallel-size", "4",
                                    "--enable-expert-parallel"]
    assert EngineLayout().server_args() == ["--tensor-parallel-size", "1"]
    assert layout.describe() == "tp2 x dp4 ep"


def test_cost_tp_and_ep_are_derived_from_the_vllm_layout():
    e = _engines(tensor_parallel_size=2, data_parallel_size=4, enable_expert_parallel=True)
    assert (e.tp, e.ep) == (2, 4)
    assert (_engines().tp, _engines().ep) == (1, 1)
    # written both ways and agreeing (a run's pipeline.json read back) is accepted
    again = EnginesConfig.model_validate(e.model_dump())
    assert (again.tp, again.ep) == (2, 4)


@pytest.mark.parametrize(("given", "field"), [({"tp": 2}, "tp: got 2"), ({"ep": 8}, "ep: got 8")])
def test_cost_layout_set_apart_and_disagreeing_is_refused(given, field):
    with pytest.raises(ValidationError, match=field) as err:
        EnginesConfig(backend="vllm", vllm={"device": "cuda", "data_parallel_size": 2}, **given)
    assert "vllm." in str(err.value)  # names the field that decides


def test_emulated_engines_keep_their_own_tp_and_ep():
    e = EnginesConfig(tp=2, ep=8, vllm={"data_parallel_size": 1})
    assert (e.tp, e.ep) == (2, 8)


def test_expert_parallel_needs_more_than_one_gpu():
    with pytest.raises(ValidationError, match="enable_expert_parallel spreads the experts"):
        VllmSettings(device="cuda", enable_expert_parallel=True)
    assert VllmSettings(device="cuda", tensor_parallel_size=2, enable_expert_parallel=True).layout.gpus == 2


def test_data_parallel_on_the_cpu_engine_needs_a_core_per_rank():
    assert VllmSettings(device="cpu", data_parallel_size=2, enable_expert_parallel=True,
                        cores_per_engine=2).layout.gpus == 2
    assert VllmSettings(device="cpu", data_parallel_size=2, cores_per_engine=0).layout.dp == 2
    with pytest.raises(ValidationError, match="cores_per_engine 1: a CPU engine of tensor_parallel_size 1 x "
                                              "data_parallel_size 2 runs 2 ranks"):
        VllmSettings(device="cpu", data_parallel_size=2)


def test_devices_listed_must_be_distinct_gpus_of_a_cuda_engine():
    assert _engines().model_copy().devices is None
    assert EnginesConfig(backend="vllm", vllm={"device": "cuda"}, devices=[0, "GPU-ab"]).devices == ("0", "GPU-ab")
    with pytest.raises(ValidationError, match="GPU 1 is listed twice"):
        EnginesConfig(backend="vllm", vllm={"device": "cuda"}, devices=[0, 1, 1])
    with pytest.raises(ValidationError, match="devices: GPUs for engines on device cuda"):
        EnginesConfig(backend="vllm", devices=[0])
    with pytest.raises(ValidationError, match="GPU indices are 0 or more"):
        EnginesConfig(backend="vllm", vllm={"device": "cuda"}, devices=[-1])


def _pipeline(**vllm) -> PipelineConfig:
    return PipelineConfig(name="t", policy="colocated",
                          engines={"backend": "vllm", "gpu": "h100", "model": "qwen3-8b",
                                   "vllm": {"device": "cuda", **vllm}})


def test_a_dense_model_takes_no_dp_attention_or_expert_parallelism():
    with pytest.raises(ConfigError, match="engines.vllm: data_parallel_size 2 .the cost model's ep.: .*dense"):
        resolve(_pipeline(data_parallel_size=2))
    with pytest.raises(ConfigError, match="enable_expert_parallel: qwen3-8b is dense"):
        resolve(_pipeline(tensor_parallel_size=2, enable_expert_parallel=True))
    assert resolve(_pipeline(tensor_parallel_size=2)).costs.mixed.layout == (2, 1)


def test_every_backend_the_schema_names_has_its_traits_and_the_registry_makes_it():
    """engines.backend's choices, the config's BACKENDS and the engine registry name the same
    backends: a new backend is declared in all three or the config cannot check what it may do."""
    import typing

    from prorsa.config.engines import BACKENDS
    from prorsa.engine import registry

    choices = set(typing.get_args(EnginesConfig.model_fields["backend"].annotation))
    assert choices == set(BACKENDS)
    assert BACKENDS["vllm"].weights and not BACKENDS["emulated"].weights
    assert choices == set(registry.BACKENDS)
