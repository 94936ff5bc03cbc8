"""examples/api_rollout.py runs as a user would run it (emulated engines, a time-scaled pipeline)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = """\
name: example
policy: prorsa
engines: {backend: emulated, count: 3, slots: 8, time_scale: 0.05}
workload: {family: swe, prompts: 2, group_size: 2, max_turns: 3, token_scale: 0.2, tool_time_scale: 0.05}
runtime: {metrics_interval_s: 0.1, dashboard_address: null}
"""


def test_the_example_rolls_out_two_batches_around_a_weight_push(tmp_path):
    (tmp_path / "p.yaml").write_text(PIPELINE)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "api_rollout.py"), str(tmp_path / "p.yaml"),
                           "--batches", "2"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out
    lines = proc.stdout.splitlines()
    push = lines.index("pushed weights: policy version 1")
    rows = [(i, int(m.group(1)), int(m.group(2))) for i, line in enumerate(lines)
            if (m := re.match(r"^  s(\d+)-p\d+-g\d+: completed, .* version (\d+)$", line))]
    assert [(batch, v) for _, batch, v in rows] == [(0, 0)] * 4 + [(1, 1)] * 4  # each batch whole, tagged
    assert all((i < push) == (batch == 0) for i, batch, _ in rows)  # the push between the batches
    assert re.search(r"^batch 1: 4 trajectories, \d+ tokens decoded", proc.stdout, re.M), out
