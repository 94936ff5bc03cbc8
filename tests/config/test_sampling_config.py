"""The pipeline's `sampling:` section: vLLM's sampling parameters, checked where they are read."""

import pytest

from prorsa.config.pipeline import PipelineConfig
from prorsa.rollout.context import sampling_of
from prorsa.sampling import Sampling


def test_the_default_samples_as_vllm_does():
    assert sampling_of(PipelineConfig(name="t")) == Sampling()


def test_a_pipeline_s_sampling_becomes_the_turns_record():
    cfg = PipelineConfig.model_validate({"name": "t", "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                                                   "min_p": 0.05, "repetition_penalty": 1.1}})
    assert sampling_of(cfg) == Sampling(temperature=0.6, top_p=0.95, top_k=20, min_p=0.05, repetition_penalty=1.1)


@pytest.mark.parametrize("field, value", [("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("top_k", -2),
                                          ("min_p", 1.5), ("presence_penalty", 3), ("repetition_penalty", 0),
                                          ("typical_p", 0.1)])
def test_out_of_range_or_unknown_fields_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"sampling.{field}|{field}"):
        PipelineConfig.model_validate({"name": "t", "sampling": {field: value}})
