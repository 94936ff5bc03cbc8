import pytest
import torch

from prorsa.agent.datasets import make_dataset
from prorsa.agent.live_episode import ChatFormat
from prorsa.agent.tools.registry import make_tool
from prorsa.agent.tools.toolbox import Toolbox
from prorsa.train.evaluate import EvalDraws, first_turn_eval
from prorsa.train.sft import DEMONSTRATIONS, SftPlan, demonstration_sample, run_sft
from prorsa.train.trainer import Trainer, TrainerConfig

SCHEMAS = Toolbox([make_tool("calculator")]).schemas()


@pytest.fixture(scope="module")
def fmt(tiny_dir):
    return ChatFormat.load(tiny_dir)


def test_a_demonstration_is_the_chat_template_with_only_the_assistant_trained(fmt):
    task = make_dataset("arith", 1)[0]
    s = demonstration_sample(task, DEMONSTRATIONS["arith"](task), fmt, SCHEMAS)
    expression = task.calls[0].arguments["expression"]
    chat = [{"role": "user", "content": task.prompt},
            {"role": "assistant", "content": "",
             "tool_calls": [{"function": {"name": "calculator", "arguments": {"expression": expression}}}]},
            {"role": "tool", "content": task.answer},
            {"role": "assistant", "content": f"The answer is \\boxed{{{task.answer}}}."}]
    rendered = fmt.tokenizer.apply_chat_template(chat, tools=SCHEMAS, tokenize=False)
    assert fmt.tokenizer.decode(s.token_ids) + "\n" == rendered
    trained = fmt.tokenizer.decode([i for i, m in zip(s.token_ids, s.loss_mask) if m])
    call = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'
    assert trained == f"{call}<|im_end|>The answer is \\boxed{{{task.answer}}}.<|im_end|>"


def _first_token_call_probability(trainer, fmt, tasks):
    call_id = fmt.tokenizer.convert_tokens_to_ids("<tool_call>")
    trainer.model.eval()
    with torch.no_grad():
        p = [torch.softmax(trainer.model(input_ids=torch.tensor([fmt.prompt_ids(t.prompt, SCHEMAS)])).logits[0, -1], -1)
             [call_id].item() for t in tasks]
    trainer.model.train()
    return sum(p) / len(p)


def test_a_few_sft_steps_make_the_tool_call_the_likely_first_token(tiny_dir, fmt):
    trainer = Trainer(tiny_dir, TrainerConfig(lr=3e-3, micro_batch=8))
    held_out = make_dataset("arith", 4, seed=1)
    before = _first_token_call_probability(trainer, fmt, held_out)
    result = run_sft(trainer, make_dataset("arith", 32), held_out, DEMONSTRATIONS["arith"], fmt, SCHEMAS,
                     SftPlan(steps=6, eval_every=0, target_call_rate=None))
    after = _first_token_call_probability(trainer, fmt, held_out)
    assert result.steps == 6 and result.stats[-1].policy_loss < result.stats[0].policy_loss / 2
    assert before < 1e-3 and after > 0.2, (before, after)  # measured: 8e-6 -> 0.32


@pytest.mark.slow
def test_sft_raises_the_sampled_call_rate_from_zero_and_stops_at_the_target(tiny_dir, fmt):
    trainer = Trainer(tiny_dir, TrainerConfig(lr=3e-3, micro_batch=8))
    held_out = make_dataset("arith", 4, seed=1)
    result = run_sft(trainer, make_dataset("arith", 64), held_out, DEMONSTRATIONS["arith"], fmt, SCHEMAS,
                     SftPlan(steps=40, eval_every=4, target_call_rate=0.25, samples_per_task=4))
    first, last = result.evals[0][1], result.evals[-1][1]
    assert first.call_rate == 0.0 and last.call_rate >= 0.25 and result.stopped_early
    # the warmed-up model is still far from always calling: RL has something to learn
    again = first_turn_eval(trainer.model, fmt, make_dataset("arith", 8, seed=2), SCHEMAS, EvalDraws(4, seed=9))
    assert 0.0 < again.call_rate < 1.0
