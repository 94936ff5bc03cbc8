"""Progress while a run goes, and the summary table after it.

    Progress(rec, console)   context manager; refresh() on every sample. A terminal gets a rich
                             bar; a log (not a TTY: CI, a pipe) gets a plain line every few seconds
    summary_table(summary)   a rich Table of summary.json
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn
from rich.table import Table

from prorsa.metrics.recorder import RunRecorder


def status_line(rec: RunRecorder, elapsed: float) -> str:
    roles = rec.latest_roles()
    count = {r: sum(1 for v in roles.values() if v.value == r) for r in ("prefill", "decode", "mixed")}
    util = rec.utilisation()
    role_txt = " ".join(f"{r[0].upper()}{n}:{util.get(r, 0):.0%}" for r, n in count.items() if n)
    tok_s = (rec.prefill_tokens + rec.decode_tokens) / elapsed if elapsed > 0 else 0.0
    return f"turns {rec.turns}  tokens {rec.prefill_tokens + rec.decode_tokens} ({tok_s:,.0f}/s)  roles {role_txt}"


class Progress:
    def __init__(self, rec: RunRecorder, console: Console, plain_every_s: float = 5.0) -> None:
        self.rec = rec
        self.console = console
        self.plain = not console.is_terminal
        self.plain_every_s = plain_every_s
        self._t0 = time.monotonic()
        self._last_plain = -1e9
        self._bar: RichProgress | None = None

    def __enter__(self) -> Progress:
        if not self.plain:
            self._bar = RichProgress(
                TextColumn("trajectories"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=self.console,
            )
            self._bar.start()
            self._task = self._bar.add_task("rollout", total=self.rec.expected, status="starting")
        return self

    def refresh(self) -> None:
        elapsed = time.monotonic() - self._t0
        done = self.rec.completed + self.rec.failed
        line = status_line(self.rec, elapsed)
        if self._bar is not None:
            self._bar.update(self._task, completed=done, status=line)
        elif elapsed - self._last_plain >= self.plain_every_s:
            self._last_plain = elapsed
            total = "?" if self.rec.expected is None else self.rec.expected
            self.console.print(f"[{elapsed:6.1f}s] trajectories {done}/{total}  {line}",
                               highlight=False, soft_wrap=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self.refresh()
            self._bar.stop()


def summary_table(summary: dict) -> Table:
    table = Table(title=f"run {summary['name']}  (policy {summary['policy']})", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if key in ("name", "policy"):
            continue
        table.add_row(key, f"{value:,.3f}" if isinstance(value, float) else str(value))
    return table
