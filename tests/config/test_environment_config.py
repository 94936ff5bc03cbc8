"""The pipeline's environment section: refused with one line naming the field, or resolved."""

import pytest

from prorsa.config.load import ConfigError, load_pipeline
from prorsa.rollout.context import load_run

BASE = "name: t\nengines: {backend: emulated}\nenvironment:\n"


def load(tmp_path, env: str):
    f = tmp_path / "p.yaml"
    f.write_text(BASE + env)
    return load_run(f).cfg


def test_defaults_and_no_environment(tmp_path):
    cfg = load(tmp_path, "  dataset: math-tir\n")
    env = cfg.environment
    assert env.tools == ("python", "calculator", "search") and env.reward == "exact_match"
    f = tmp_path / "q.yaml"
    f.write_text("name: t\n")
    assert load_pipeline(f).environment is None


@pytest.mark.parametrize("env,needle", [
    ("  dataset: math-tir\n  sandboxes: {}\n", "environment.sandboxes: unknown field"),
    ("  dataset: math-tir\n  sandbox: {wall: 1}\n", "environment.sandbox.wall: unknown field"),
    ("  dataset: algebra\n", "environment.dataset: got 'algebra'"),
    ("  dataset: math-tir\n  tools: [shell]\n", "tool 'shell'"),
    ("  dataset: math-tir\n  reward: f1\n", "reward 'f1'"),
    ("  dataset: search\n  tools: [python]\n", "dataset search calls ['search']"),
    ("  dataset: missing.jsonl\n", "environment.dataset: got"),
    ("  dataset: math-tir\n  max_observation_tokens: 0\n", "environment.max_observation_tokens"),
    ("  dataset: math-tir\n  mode: live\n", "needs engines.backend vllm"),
    ("  dataset: math-tir\n  parser: [xml]\n", "environment.parser.0"),
    # user code that will not import is refused before any worker tries (and prints tracebacks)
    ("  dataset: math-tir\n  tools: [python, calculator, no_such_pkg.tools:lookup]\n",
     "environment.tools: cannot import 'no_such_pkg.tools'"),
    ("  dataset: math-tir\n  tools: [python, calculator, 'json:no_such_name']\n",
     "environment.tools: 'json' has no attribute 'no_such_name'"),
    ("  dataset: math-tir\n  reward: no_such_pkg.rewards:f\n", "environment.reward: cannot import"),
    ("  dataset: math-tir\n  reward: 'json:__name__'\n", "environment.reward: reward 'json:__name__' is not callable"),
])
def test_bad_sections_are_refused(tmp_path, env, needle):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, env)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_user_tools_and_task_files_resolve(tmp_path, monkeypatch):
    (tmp_path / "tasks.jsonl").write_text("")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "tools.py").write_text("def lookup(key: str) -> str:\n    return key\n")
    (tmp_path / "mypkg" / "rewards.py").write_text("def f(task, response):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load(tmp_path, "  dataset: tasks.jsonl\n  tools: [mypkg.tools:lookup]\n  reward: mypkg.rewards:f\n")
    assert cfg.environment.dataset == str((tmp_path / "tasks.jsonl").resolve())
    assert cfg.environment.tools == ("mypkg.tools:lookup",)
