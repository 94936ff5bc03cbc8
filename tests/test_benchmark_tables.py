"""The benchmark tables in the docs agree with the results files they are generated from
(benchmarks/tables.py: `python3 benchmarks/tables.py` rewrites them, `--check` compares)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "tables.py"


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("benchmark_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def copies(tmp_path, tables):
    """The results directory and both documents, copied where a test may change them."""
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results)
    docs = []
    for doc in tables.DOCS:
        docs.append(tmp_path / doc.relative_to(REPO).as_posix().replace("/", "__"))
        shutil.copy(doc, docs[-1])
    return results, tuple(docs)


def test_every_table_matches_its_results(tables):
    problems = tables.check(tables.RESULTS, tables.DOCS)
    assert not problems, "run `python3 benchmarks/tables.py` to regenerate:\n" + "\n".join(problems)


def test_an_edited_result_is_caught_and_rewritten(tables, copies):
    results, docs = copies
    assert tables.check(results, docs) == []
    paper = results / "paper.json"
    data = json.loads(paper.read_text())
    data["cells"][0]["colocated"] += 10.0  # the first cell's colocated makespan
    paper.write_text(json.dumps(data))

    problems = tables.check(results, docs)
    assert problems and all(": paper: differs from benchmarks/results/paper.json" in p for p in problems)

    assert tables.check(results, docs, write=True) == []
    assert tables.check(results, docs) == []
    assert f"| swe | dense | sync | {data['cells'][0]['colocated']:.2f} s |" in docs[0].read_text()


def test_an_edited_table_is_caught(tables, copies):
    results, docs = copies
    text = docs[0].read_text()
    start = text.index("<!-- table:chaos -->")
    docs[0].write_text(text[:start] + text[start:].replace("+12.5%", "+2.5%", 1))
    problems = tables.check(results, docs)
    assert len(problems) == 1 and ": chaos: differs from" in problems[0]


def test_unreadable_results_unknown_and_unplaced_tables_are_named(tables, copies):
    results, docs = copies
    (results / "fidelity.json").write_text("{not json")
    data = json.loads((results / "chaos.json").read_text())
    del data["faults_by_kind"]
    (results / "chaos.json").write_text(json.dumps(data))
    docs[0].write_text(docs[0].read_text() + "\n<!-- table:nonesuch -->\n<!-- /table:nonesuch -->\n")
    problems = "\n".join(tables.check(results, docs))
    assert "fidelity: benchmarks/results/fidelity.json:" in problems
    assert "chaos: " in problems and "not what the table reads" in problems
    assert "nonesuch: no such table" in problems
    assert tables.check(results, docs[1:]) and "placed in none of" in "\n".join(tables.check(results, docs[1:]))


def test_the_command_line_check_exits_1_and_names_the_table(tables, copies, capsys):
    results, docs = copies
    data = json.loads((results / "drivers-ep.json").read_text())
    data["rows"][0]["prorsa_vs_colocated"] = 0.5
    (results / "drivers-ep.json").write_text(json.dumps(data))
    assert tables.main(["--check", "--results", str(results), *map(str, docs)]) == 1
    err = capsys.readouterr().err
    assert "drivers-ep: differs" in err and "ep-headline: differs" in err
    assert tables.main(["--results", str(results), *map(str, docs)]) == 0
    assert tables.main(["--check", "--results", str(results), *map(str, docs)]) == 0
