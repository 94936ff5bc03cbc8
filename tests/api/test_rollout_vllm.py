"""prorsa.Rollout on vLLM CPU engines (the tiny model, PD split): real token ids, masks and
logprobs come back, and weights pushed from a state dict and from a checkpoint directory are
reloaded in place between batches."""

from __future__ import annotations

import math

import pytest

import prorsa
from prorsa.engine.registry import resolve_model_dir

pytestmark = pytest.mark.vllm  # slow, and skipped without vLLM (tests/conftest.py)

PIPELINE = """\
name: api-vllm
seed: 1
policy: static:1:1
engines:
  backend: vllm
  count: 2
  slots: 4
  gpu: cpu
  model: tiny
  # a loaded CI machine starts two CPU servers slowly
  vllm: {model: tiny, dtype: float32, device: cpu, max_model_len: 1024, cores_per_engine: 1, start_timeout_s: 900}
workload: {family: swe, prompts: 1, group_size: 2, max_turns: 2, token_scale: 0.05, max_context: 512,
           tool_time_scale: 0.1}
runtime: {tool_workers: 1, metrics_interval_s: 0.5, dashboard_address: null}
"""


def test_real_engines_return_trainable_sequences_and_take_new_weights(tmp_path):
    from safetensors.torch import load_file

    (tmp_path / "p.yaml").write_text(PIPELINE)
    with prorsa.Rollout(tmp_path / "p.yaml", run_dir=tmp_path / "run") as r:
        first = r.generate()
        assert len(first) == 2 and all(t.status == "completed" and t.policy_version == 0 for t in first)
        for t in first:
            assert len(t.token_ids) == len(t.loss_mask) == len(t.rollout_logprobs) > 0
            generated = [lp for lp, m in zip(t.rollout_logprobs, t.loss_mask) if m]
            assert len(generated) == sum(x.decode_tokens for x in t.turns) > 0
            assert all(math.isfinite(lp) and lp <= 0 for lp in generated)
            assert t.turns[0].prefill_engine == "engine-0" and t.turns[0].decode_engine == "engine-1"
        base = resolve_model_dir(r.cfg.engines)
        assert r.update_weights(lambda: load_file(str(base / "model.safetensors"))) == 1
        assert r.update_weights(base) == 2  # a checkpoint directory, loaded as it is
        again = r.generate()
        assert all(t.status == "completed" and t.policy_version == 2 for t in again)
