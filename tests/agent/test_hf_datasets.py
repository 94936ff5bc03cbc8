"""Tasks from a Hugging Face dataset made here on disk, mapped by the pipeline's `columns`; a bad
mapping or a missing column is one error line naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from prorsa.agent.datasets.hf import DatasetError, hf_tasks
from prorsa.config.load import ConfigError
from prorsa.config.pipeline import TaskColumns
from prorsa.rollout.context import load_run

ROOT = Path(__file__).resolve().parents[2]
ROWS = {
    "question": ["What is 2 + 3?", "What is 4 * 5?", "What is 9 - 7?"],
    "solution": ["5", "20", "2"],
    "uid": ["q-a", "q-b", "q-c"],
    "family": ["x", "x", "y"],
    "tool_calls": [json.dumps([{"name": "calculator", "arguments": {"expression": e}}])
                   for e in ("2 + 3", "4 * 5", "9 - 7")],
}
COLUMNS = TaskColumns(prompt="question", answer="solution", task_id="uid", calls="tool_calls")


@pytest.fixture(autouse=True)
def quiet():
    datasets.disable_progress_bars()


def _saved(tmp_path: Path) -> Path:
    datasets.Dataset.from_dict(ROWS).save_to_disk(str(tmp_path / "arith-hf"))
    return tmp_path / "arith-hf"


def test_a_saved_dataset_maps_to_tasks_row_by_row(tmp_path):
    tasks = hf_tasks(_saved(tmp_path), COLUMNS)
    assert [t.task_id for t in tasks] == ROWS["uid"]
    assert [t.prompt for t in tasks] == ROWS["question"] and [t.answer for t in tasks] == ROWS["solution"]
    assert [t.calls[0].arguments["expression"] for t in tasks] == ["2 + 3", "4 * 5", "9 - 7"]
    assert {t.family for t in tasks} == {"arith-hf"}


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".csv"])
def test_data_files_load_with_their_builder(tmp_path, suffix):
    ds = datasets.Dataset.from_dict(ROWS)
    path = tmp_path / f"data{suffix}"
    {".parquet": ds.to_parquet, ".jsonl": ds.to_json, ".csv": ds.to_csv}[suffix](str(path))
    tasks = hf_tasks(path, TaskColumns(prompt="question", answer="solution"))
    assert [t.prompt for t in tasks] == ROWS["question"]
    assert [t.task_id for t in tasks] == ["data-0", "data-1", "data-2"]  # no id column: name and row
    assert all(t.calls == () for t in tasks)


def test_a_split_of_a_dataset_dict(tmp_path):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(ROWS),
                               "test": datasets.Dataset.from_dict({k: v[:1] for k, v in ROWS.items()})})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert len(hf_tasks(tmp_path / "dd", COLUMNS, split="test")) == 1
    with pytest.raises(DatasetError, match=r"^split: no split 'dev' .*its splits: test, train"):
        hf_tasks(tmp_path / "dd", COLUMNS, split="dev")


@pytest.mark.parametrize("columns,field", [
    (TaskColumns(prompt="prompt"), "columns.prompt: no column 'prompt'"),
    (TaskColumns(prompt="question", answer="answer"), "columns.answer: no column 'answer'"),
    (TaskColumns(prompt="solution", calls="question"), "columns.calls: row 0: expected a list"),
    (TaskColumns(prompt="question", task_id="solution", tests="uid"), "columns.tests: row 0"),
    (TaskColumns(prompt="question", task_id="family"), "columns.task_id: 'x' names more than one row"),
])
def test_a_mapping_that_does_not_fit_names_the_field(tmp_path, columns, field):
    with pytest.raises(DatasetError) as e:
        hf_tasks(_saved(tmp_path), columns)
    assert str(e.value).startswith(field) and "\n" not in str(e.value)


def _pipeline(tmp_path: Path, env: str) -> Path:
    f = tmp_path / "p.yaml"
    f.write_text("name: t\nengines: {backend: emulated}\nenvironment:\n  tools: [calculator]\n" + env)
    return f


def test_a_pipeline_reads_the_dataset_relative_to_its_file(tmp_path):
    _saved(tmp_path)
    cfg = load_run(_pipeline(tmp_path, "  dataset: arith-hf\n  columns: {prompt: question, calls: tool_calls}\n")).cfg
    assert cfg.environment.dataset == str(tmp_path / "arith-hf")


@pytest.mark.parametrize("env,needle", [
    ("  dataset: arith-hf\n  columns: {prompt: q, calls: tool_calls}\n", "environment.columns.prompt: no column 'q'"),
    ("  dataset: nowhere\n  columns: {prompt: q, calls: c}\n", "environment.dataset: "),
    ("  dataset: arith\n  columns: {prompt: q, calls: c}\n", "environment.dataset: got 'arith'"),
    ("  dataset: arith-hf\n  columns: {prompt: question}\n", "environment: columns.calls: replay runs"),
    ("  dataset: arith-hf\n  columns: {question: q}\n", "environment.columns.prompt: missing"),
    ("  dataset: arith-hf\n", "environment.dataset: got 'arith-hf'"),
])
def test_bad_mappings_are_one_line_naming_the_field(tmp_path, env, needle):
    _saved(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_run(_pipeline(tmp_path, env))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_prorsa_validate_says_it_in_one_error_line(tmp_path):
    _saved(tmp_path)
    f = _pipeline(tmp_path, "  dataset: arith-hf\n  columns: {prompt: question, answer: answer, calls: tool_calls}\n")
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "validate", str(f)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "columns.answer" in line]
    assert len(lines) == 1 and "no column 'answer'" in lines[0], proc.stdout + proc.stderr
