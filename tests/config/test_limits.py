"""Inputs that would hang or run away are refused at the door, with one line naming the field."""

from __future__ import annotations

import pytest

import prorsa.config.load as load
from prorsa.config.load import MAX_FILE_BYTES, ConfigError, load_pipeline


def refused(tmp_path, text: str) -> str:
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_pipeline(f)
    msg = str(err.value)
    assert msg.startswith(f"{f}: ") and "\n" not in msg
    return msg


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path, monkeypatch):
    lines = ["name: t", 'l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]  # 9^9 values
    # Counted, not timed: the check must visit each node of the document once (about a hundred
    # here), never once per use of an alias (9^9), and nothing may be built from the document.
    visits, built = [0], []
    count = load._expanded

    def counted(node, memo):
        visits[0] += 1
        assert visits[0] < 1000, "the check walks the expanded document"
        return count(node, memo)

    monkeypatch.setattr(load, "_expanded", counted)
    monkeypatch.setattr(load._Loader, "construct_document", lambda self, node: built.append(node))
    assert "values once its aliases are expanded" in refused(tmp_path, "\n".join(lines) + "\n")
    assert built == [] and visits[0] > 0


def test_aliases_within_the_bound_still_work(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: t\nworkload: &w {prompts: 2, group_size: 2}\n")
    assert load_pipeline(f).workload.prompts == 2


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    assert "line 3: key 'seed' given twice" in refused(tmp_path, "name: t\nseed: 1\nseed: 2\n")
    assert "key 'count' given twice" in refused(tmp_path, "name: t\nengines:\n  count: 2\n  count: 3\n")


def test_a_file_too_big_to_be_settings_is_refused_unread(tmp_path):
    msg = refused(tmp_path, "name: t\nx: '" + "a" * MAX_FILE_BYTES + "'\n")
    assert f"at most {MAX_FILE_BYTES:,}" in msg


@pytest.mark.parametrize("text,needles", [
    ("engines: {count: true}", ["engines.count", "not a boolean"]),
    ("workload: {prompts: false}", ["workload.prompts", "not a boolean"]),
    ("workload: {token_scale: true}", ["workload.token_scale", "not a boolean"]),
    ("workload: {prompts: 1000000000}", ["workload.prompts", "1000000000", "less than or equal to 1048576"]),
    ("workload: {prompts: 2048, group_size: 1024}", ["prompts x group_size = 2,097,152"]),
    ("runtime: {tool_workers: 1000000}", ["runtime.tool_workers", "less than or equal to 4096"]),
    ("workload: {mode: async, trajectories: 100000000000}", ["workload.trajectories"]),
    ("environment: {dataset: math-tir, sandbox: {memory_bytes: 1000000000000000000000000000000}}",
     ["environment.sandbox.memory_bytes", "less than or equal to 9223372036854775807"]),
])  # fmt: skip
def test_counts_that_multiply_work_are_bounded(tmp_path, text, needles):
    msg = refused(tmp_path, f"name: t\n{text}\n")
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_a_bool_field_still_takes_a_bool(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: t\nruntime: {processes: true}\n")
    assert load_pipeline(f).runtime.processes is True


def test_a_merge_key_may_be_overridden(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: t\nworkload:\n  <<: {prompts: 2, group_size: 2}\n  prompts: 3\n")
    w = load_pipeline(f).workload
    assert (w.prompts, w.group_size) == (3, 2)
