import json
import math
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from prorsa.train.samples import Sample
from prorsa.train.trainer import POLICY_FILE, Trainer, TrainerConfig


def _samples(n=4, length=40, prompt=24, seed=0, old=None):
    """Groups of two, rewards 1 and 0: advantages +1 and -1 in every group."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        ids = tuple(r.randrange(16, 2000) for _ in range(length))
        mask = (0,) * prompt + (1,) * (length - prompt)
        lp = tuple(math.nan if m else 0.0 for m in mask) if old is None else old[i]
        out.append(Sample(ids, mask, lp, float(i % 2 == 0), f"g{i // 2}", 0, f"t{i}"))
    return out


def _generated_logprob(trainer, samples):
    return [float((lp * torch.tensor(s.loss_mask)).sum()) for lp, s in zip(trainer.logprobs(samples), samples)]


def test_a_step_raises_the_logprob_of_positively_advantaged_sequences(tiny_dir):
    trainer = Trainer(tiny_dir, TrainerConfig(lr=1e-3, micro_batch=2))
    samples = _samples()
    before = _generated_logprob(trainer, samples)
    stats = trainer.step(samples)
    after = _generated_logprob(trainer, samples)
    assert stats.version == trainer.version == 1 and stats.updates == 1
    assert stats.tokens == sum(s.generated_tokens for s in samples) and stats.ratio_mean == pytest.approx(1.0)
    for s, b, a in zip(samples, before, after):
        assert (a > b) if s.reward == 1.0 else (a < b), (s.traj_id, b, a)


def test_every_token_clipped_leaves_the_weights_alone(tiny_dir):
    trainer = Trainer(tiny_dir, TrainerConfig(lr=1e-3, micro_batch=4))
    base = _samples()
    now = [lp.tolist() for lp in trainer.logprobs(base)]
    # A > 0 with ratio e (above 1 + eps) and A < 0 with ratio 1/e (below 1 - eps): both clipped
    old = [tuple((x - 1.0 if s.reward else x + 1.0) if m else 0.0 for x, m in zip(lp, s.loss_mask))
           for lp, s in zip(now, base)]
    samples = _samples(old=old)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    stats = trainer.step(samples)
    assert stats.clip_fraction == pytest.approx(1.0)
    assert all(torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items())


def test_gradient_accumulation_matches_one_big_batch(tiny_dir):
    samples = _samples()
    a = Trainer(tiny_dir, TrainerConfig(lr=1e-3, micro_batch=1, grad_accum=4))
    b = Trainer(tiny_dir, TrainerConfig(lr=1e-3, micro_batch=4))
    sa, sb = a.step(samples), b.step(samples)
    assert sa.updates == sb.updates == 1 and sa.grad_norm == pytest.approx(sb.grad_norm, rel=1e-4)
    wb = b.model.state_dict()
    # AdamW's first step moves a weight by about lr * g / (|g| + eps): where a gradient is as small
    # as eps, float rounding in the summation order moves it by up to a few 1e-6 (1 element in
    # 65536 on one run); a wrong accumulation moves it by the order of lr (1e-3)
    for k, v in a.model.state_dict().items():
        torch.testing.assert_close(v, wb[k], rtol=1e-4, atol=1e-5)
    # two updates of two samples each: a different path
    c = Trainer(tiny_dir, TrainerConfig(lr=1e-3, micro_batch=1, grad_accum=2))
    assert c.step(samples).updates == 2


def test_kl_reference_only_when_asked(tiny_dir):
    assert Trainer(tiny_dir, TrainerConfig()).reference is None
    trainer = Trainer(tiny_dir, TrainerConfig(lr=1e-3, micro_batch=2, grad_accum=1, kl_coef=0.1))
    first = trainer.step(_samples())  # the first update sees the policy equal to its reference
    assert first.updates == 2 and first.kl > 0.0  # the second update's policy has moved


def test_save_writes_a_model_that_reloads_with_the_same_logits(tiny_dir, tmp_path):
    trainer = Trainer(tiny_dir, TrainerConfig(lr=1e-3, micro_batch=4))
    trainer.step(_samples())
    out = trainer.save(tmp_path / "policy")
    trainer.step(_samples(seed=1))
    out = trainer.save(tmp_path / "policy")  # over the first save: swapped whole
    assert json.loads((out / POLICY_FILE).read_text()) == {"policy_version": 2}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {p.name for p in out.iterdir()}
    assert [p.name for p in tmp_path.iterdir()] == ["policy"]  # no temporary directories left
    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = torch.tensor([list(_samples()[0].token_ids)])
    trainer.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, trainer.model(input_ids=ids).logits)
    assert Trainer(out).version == 2  # versions continue from a saved policy


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="clip_eps"):
        TrainerConfig(clip_eps=1.5)
    with pytest.raises(ValueError, match="grad_accum"):
        TrainerConfig(grad_accum=0)
