"""Progress while a run goes, and the summary table after it.

    Progress(rec, console)   context manager; refresh() on every sample. A terminal gets a rich
                             bar; a log (not a TTY: CI, a pipe) gets a plain line when the run
                             moved (a trajectory, turn or token more, a role changed), at most
                             every few seconds: an idle endpoint (prorsa serve) prints nothing
    summary_rows(summary)    (metric, value) rows, nested fields as their own ("control.intervals")
    summary_table(summary)   a rich Table of those rows
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn
from rich.table import Table

from prorsa.console.clocked import stamp
from prorsa.metrics.recorder import RunRecorder

ROLES = ("prefill", "decode", "mixed")


def _role_counts(rec: RunRecorder) -> dict[str, int]:
    roles = rec.latest_roles()
    return {r: sum(1 for v in roles.values() if v.value == r) for r in ROLES}


def status_line(rec: RunRecorder, elapsed: float) -> str:
    count = _role_counts(rec)
    util = rec.utilisation()
    role_txt = " ".join(f"{r[0].upper()}{n}:{util.get(r, 0):.0%}" for r, n in count.items() if n)
    tok_s = (rec.prefill_tokens + rec.decode_tokens) / elapsed if elapsed > 0 else 0.0
    return f"turns {rec.turns}  tokens {rec.prefill_tokens + rec.decode_tokens} ({tok_s:,.0f}/s)  roles {role_txt}"


def moved(rec: RunRecorder) -> tuple:
    """What a plain progress line is printed again for (the rates and utilisation drift while idle)."""
    return (rec.completed, rec.failed, rec.turns, rec.prefill_tokens + rec.decode_tokens,
            tuple(_role_counts(rec).values()))


class Progress:
    def __init__(self, rec: RunRecorder, console: Console, plain_every_s: float = 5.0) -> None:
        self.rec = rec
        self.console = console
        self.plain = not console.is_terminal
        self.plain_every_s = plain_every_s
        self._t0 = time.monotonic()
        # the console's own clock when it has one (console/clocked.py): every line on one clock
        self._clock = getattr(console, "elapsed", lambda: time.monotonic() - self._t0)
        self._last_plain = -1e9
        self._last_moved: tuple | None = None
        self._bar: RichProgress | None = None

    def __enter__(self) -> Progress:
        if not self.plain:
            self._bar = RichProgress(
                TextColumn("{task.fields[clock]}"), TextColumn("trajectories"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"), console=self.console,
            )
            self._bar.start()
            self._task = self._bar.add_task("rollout", total=self.rec.expected, status="starting",
                                            clock=stamp(self._clock()))
        return self

    def refresh(self) -> None:
        elapsed = time.monotonic() - self._t0
        done = self.rec.completed + self.rec.failed
        line = status_line(self.rec, elapsed)
        if self._bar is not None:
            self._bar.update(self._task, completed=done, status=line, clock=stamp(self._clock()))
            return
        now = moved(self.rec)
        if now != self._last_moved and elapsed - self._last_plain >= self.plain_every_s:
            self._last_plain, self._last_moved = elapsed, now
            total = "?" if self.rec.expected is None else self.rec.expected
            text = f"trajectories {done}/{total}  {line}"
            if not hasattr(self.console, "elapsed"):  # a console without a clock: the line carries one
                text = f"{stamp(elapsed)} {text}"
            self.console.print(text, highlight=False, soft_wrap=True, markup=False)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self.refresh()
            self._bar.stop()


def _cell(value) -> str:
    return f"{value:,.3f}" if isinstance(value, float) else str(value)


def summary_rows(summary: dict, prefix: str = "") -> list[tuple[str, str]]:
    """Every field a row of its own, a nested one named by its path ("reward.mean")."""
    rows: list[tuple[str, str]] = []
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows += summary_rows(value, f"{name}.") if value else [(name, "none")]
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                rows += summary_rows(v, f"{name}[{i}].")
        elif isinstance(value, (list, tuple)):
            rows.append((name, ", ".join(_cell(v) for v in value) or "none"))
        else:
            rows.append((name, _cell(value)))
    return rows


def summary_table(summary: dict) -> Table:
    table = Table(title=f"run {summary['name']}  (policy {summary['policy']})", show_header=False)
    table.add_column("metric", style="bold", no_wrap=True)
    table.add_column("value", justify="right", overflow="fold")
    for name, value in summary_rows({k: v for k, v in summary.items() if k not in ("name", "policy")}):
        table.add_row(name, value)
    return table
