import json

import pytest
from click.testing import CliRunner

from prorsa.cli import main


@pytest.mark.parametrize("args,field", [
    (["--task", "math-tir"], "--task"),
    (["--model", "."], "--model"),
])
def test_bad_input_is_one_error_line_naming_the_field(tmp_path, args, field):
    result = CliRunner().invoke(main, ["sft", *args, "--output", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"error: {field}") and len(result.output.strip().splitlines()) == 1


def test_an_output_directory_in_use_is_refused(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    result = CliRunner().invoke(main, ["sft", "--output", str(tmp_path)])
    assert result.exit_code == 2 and result.output.startswith("error: --output")


@pytest.mark.slow
def test_sft_writes_a_model_directory(tiny_dir, tmp_path):
    out = tmp_path / "warm"
    result = CliRunner().invoke(main, ["sft", "--model", str(tiny_dir), "--steps", "2", "--eval-every", "1",
                                       "--target-rate", "1", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "2 steps (all steps): tool-call rate 0.00" in result.output and f"wrote {out}" in result.output
    assert json.loads((out / "policy.json").read_text()) == {"policy_version": 2}
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
