"""partial_rollout: in the pipeline schema: what it takes, the staleness bound it resolves to, and
one error line for each bad value."""

import pytest

from prorsa.config.load import ConfigError
from prorsa.config.pipeline import PipelineConfig
from prorsa.rollout.context import load_run

LIVE_TRAIN = {"engines": {"backend": "vllm"}, "environment": {"mode": "live", "dataset": "arith"}}


@pytest.mark.parametrize("text,needles", [
    ("partial_rollout: {over_sample: -0.5}\n", ["partial_rollout.over_sample", "-0.5", "greater than or equal to 0"]),
    ("partial_rollout: {over_sample: many}\n", ["partial_rollout.over_sample", "'many'", "valid number"]),
    ("partial_rollout: {carry: sometimes}\n", ["partial_rollout.carry", "'sometimes'", "boolean"]),
    ("partial_rollout: {max_staleness: -1}\n", ["partial_rollout.max_staleness", "-1"]),
    ("partial_rollout: {overs_ample: 1}\n", ["partial_rollout.overs_ample", "unknown field"]),
    ("workload: {mode: async, trajectories: 8}\npartial_rollout: {}\n",
     ["partial_rollout", "needs workload.mode sync", "async"]),
])
def test_a_bad_value_is_one_line_naming_the_field(tmp_path, text, needles):
    f = tmp_path / "bad.yaml"
    f.write_text("name: t\n" + text)
    with pytest.raises(ConfigError) as err:
        load_run(f)
    msg = str(err.value)
    assert "\n" not in msg and str(f) in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_the_staleness_bound_is_the_trainers_when_training():
    cfg = PipelineConfig.model_validate({"name": "t", "partial_rollout": {"max_staleness": 3}})
    assert cfg.staleness_bound == 3
    assert PipelineConfig.model_validate({"name": "t", "partial_rollout": {}}).staleness_bound == 1
    trained = PipelineConfig.model_validate({"name": "t", **LIVE_TRAIN, "train": {"max_staleness": 2},
                                             "partial_rollout": {"over_sample": 0.5}})
    assert trained.staleness_bound == 2
    with pytest.raises(ValueError, match="give it there"):  # one bound, not two
        PipelineConfig.model_validate({"name": "t", **LIVE_TRAIN, "train": {},
                                       "partial_rollout": {"max_staleness": 0}})


def test_cells_refuse_it():
    with pytest.raises(ValueError, match="partial_rollout: is set"):
        PipelineConfig.model_validate({"name": "t", "engines": {"count": 4}, "runtime": {"cells": 2},
                                       "partial_rollout": {}})


def test_serve_refuses_it_in_one_line(tmp_path):
    from click.testing import CliRunner

    from prorsa.cli import main

    (tmp_path / "p.yaml").write_text("name: t\npartial_rollout: {}\n")
    out = CliRunner().invoke(main, ["serve", str(tmp_path / "p.yaml")])
    assert out.exit_code != 0 and "partial_rollout: prorsa serve has no steps" in out.output
    assert "Traceback" not in out.output
