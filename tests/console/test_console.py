"""The console's rules: one clock on every line, tables whole in a pipe, progress only when the
run moved, nested summary fields as rows of their own, `prorsa sim --format csv|json`."""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path

from rich.table import Table

from prorsa.console.clocked import ClockedConsole, command_console
from prorsa.console.progress import Progress, summary_rows, summary_table
from prorsa.loads import EngineLoad
from prorsa.metrics.recorder import RunRecorder
from prorsa.roles import Role

REPO = Path(__file__).resolve().parents[2]
STAMP = re.compile(r"^\[ *(\d+\.\d) s\] ")


def clocked(width: int = 200) -> ClockedConsole:
    return ClockedConsole(file=io.StringIO(), width=width)


def test_every_line_of_text_carries_the_consoles_clock_and_tables_do_not():
    console = clocked()
    console.print("first")
    time.sleep(0.15)
    console.print("second [not markup]", markup=False)
    table = Table("metric", "value")
    table.add_row("makespan_s", "1.0")
    console.print(table)
    lines = console.file.getvalue().splitlines()
    times = [float(m[1]) for m in map(STAMP.match, lines[:2])]
    assert lines[0].endswith(" first") and lines[1].endswith(" second [not markup]")
    assert times[1] > times[0]  # one clock, going forward
    assert not any(STAMP.match(line) for line in lines[2:]) and "makespan_s" in "".join(lines[2:])


def test_a_console_in_a_pipe_is_wide_enough_for_any_table():
    console = command_console()  # pytest's stdout is no terminal
    assert not console.is_terminal and console.width >= 1000
    table = Table("policy", "makespan, simulated s", "vs colocated", "switches", "prefix hit", "recomputed tok",
                  "wall s to simulate", "a long column name past eighty columns")
    table.add_row("colocated", "18.24", "1.000", "0", "81.1%", "7,402", "0.1", "x")
    out = io.StringIO()
    console.file = out
    console.print(table)
    assert "colocated " in out.getvalue() and "…" not in out.getvalue()
    assert "a long column name past eighty columns" in out.getvalue()


def _recorder() -> RunRecorder:
    rec = RunRecorder(engines=["engine-0", "engine-1"], slots=4, expected=8)
    rec.sample(0.0, [EngineLoad("engine-0", Role.MIXED), EngineLoad("engine-1", Role.MIXED)])
    return rec


def test_plain_progress_is_printed_again_only_when_the_run_moved():
    rec = _recorder()
    console = clocked()
    with Progress(rec, console, plain_every_s=0.0) as progress:
        for _ in range(5):  # idle: an endpoint with no client
            progress.refresh()
        rec.turns, rec.decode_tokens = 1, 12
        progress.refresh()
        progress.refresh()
        rec.sample(1.0, [EngineLoad("engine-0", Role.PREFILL), EngineLoad("engine-1", Role.MIXED)])
        progress.refresh()
    lines = console.file.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert all(STAMP.match(line) for line in lines)
    assert "turns 0" in lines[0] and "turns 1  tokens 12" in lines[1] and "P1" in lines[2] and "P1" not in lines[1]


def test_nested_summary_fields_are_rows_of_their_own():
    summary = {"name": "q", "policy": "prorsa", "makespan_s": 12.5, "trajectories_failed": 0,
               "reward": {"mean": 0.25, "by_family": {"swe": 0.5}}, "control": {"intervals": 12},
               "tail_merges": [{"at_s": 3.0}], "empty": {}, "none_yet": []}
    rows = dict(summary_rows(summary))
    assert rows["reward.mean"] == "0.250" and rows["reward.by_family.swe"] == "0.500"
    assert rows["control.intervals"] == "12" and rows["makespan_s"] == "12.500"
    assert rows["tail_merges[0].at_s"] == "3.000" and rows["empty"] == rows["none_yet"] == "none"
    assert not any("{" in v for v in rows.values())
    out = io.StringIO()
    ClockedConsole(file=out, width=120).print(summary_table(summary))
    assert "reward.by_family.swe" in out.getvalue() and "{'" not in out.getvalue()


def _sim(fmt: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prorsa.cli", "sim", str(REPO / "pipelines" / "quickstart.yaml"),
                           "--policy", "colocated,static:2:1", "--format", fmt, "workload.steps=1"],
                          capture_output=True, text=True, timeout=300)


def test_sim_writes_its_comparison_as_csv_or_json_alone_on_stdout_and_tells_the_rest_on_stderr():
    as_csv, as_json, as_table = _sim("csv"), _sim("json"), _sim("table")
    assert as_csv.returncode == as_json.returncode == as_table.returncode == 0, as_csv.stderr + as_json.stderr
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    records = json.loads(as_json.stdout)
    assert [r["policy"] for r in rows] == [r["policy"] for r in records] == ["colocated", "static:2:1"]
    assert float(rows[1]["makespan_s"]) == records[1]["makespan_s"] > 0
    assert records[0]["vs_colocated"] == 1.0 and records[1]["best_static"] is True
    assert "simulating quickstart" in as_csv.stderr and STAMP.match(as_csv.stderr)
    # the table: simulated seconds named as such, every line of text on the one clock
    assert "simulated seconds" in as_table.stdout and "body" not in as_table.stdout
    said = [line for line in as_table.stdout.splitlines() if line.startswith("[")]
    assert len(said) == 3 and all(STAMP.match(line) for line in said), as_table.stdout
    assert "colocated: " in said[1] and " simulated s, 0 switches (" in said[1] and "wall s to simulate" in said[1]


def test_log_records_are_on_the_consoles_clock():
    from prorsa.console.clocked import ClockFormatter

    console = clocked()
    console.print("said")
    record = logging.LogRecord("prorsa.cluster.engine_host", logging.INFO, __file__, 1, "engine-0 started", (), None)
    line = ClockFormatter().format(record)
    said = float(STAMP.match(console.file.getvalue())[1])
    assert STAMP.match(line) and line.endswith(" prorsa.cluster.engine_host INFO engine-0 started"), line
    assert abs(float(STAMP.match(line)[1]) - said) < 1.0  # one origin, not the time of day
