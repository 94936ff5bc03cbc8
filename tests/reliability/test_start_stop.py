"""A run's start and stop through the real command: bad places for runs are refused by validate,
Ctrl-C ends a start that hangs, and a start that fails or is interrupted leaves no
half-made run directory behind."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from prorsa.live.interrupt import HARD_STOP_S

from runs import finish, output, prorsa, start, wait_for, write_pipeline


# How long a signalled process may take to end before the test calls it hung. The hard stop ends it
# HARD_STOP_S after the signal at the latest; this is a guard against a hang, not a speed bound.
HANG_S = HARD_STOP_S + 50.0


def one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.parametrize("output_dir,needle", [
    ("{tmp}/p.yaml", "is a file, not a directory"),
    ("/proc/x", "cannot make a directory there"),
    ("{tmp}/" + "d" * 300, "cannot make a directory there (File name too long)"),
])  # fmt: skip
def test_validate_refuses_an_output_dir_no_run_can_be_made_in(tmp_path, output_dir, needle):
    pipeline = write_pipeline(tmp_path / "p.yaml", extra=f"output_dir: {output_dir.format(tmp=tmp_path)}\n")
    proc = prorsa("validate", str(pipeline))
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    assert line.startswith(f"error: {pipeline}: output_dir: got ") and needle in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml", "trace.jsonl"]  # the probe is gone


@pytest.mark.parametrize("command", ["sim", "sweep"])
def test_sim_and_sweep_refuse_an_output_no_results_can_go_to_before_they_start(tmp_path, command):
    pipeline = write_pipeline(tmp_path / "p.yaml")  # the file in the way
    sweep = Path(__file__).resolve().parents[2] / "configs" / "sweeps" / "paper.yaml"
    target = pipeline if command == "sim" else sweep
    proc = prorsa(command, str(target), "--output", str(pipeline / "out"), timeout=60)
    assert proc.returncode == 2
    assert one_error_line(proc.stderr) == f"error: --output: got '{tmp_path}/p.yaml/out'; {tmp_path}/p.yaml is a file, " \
                                          "not a directory"


@pytest.mark.parametrize("command", ["run", "sim", "sweep", "sft"])
def test_every_output_option_refuses_a_file_with_one_line(tmp_path, command):
    pipeline = write_pipeline(tmp_path / "p.yaml")  # the file in the way
    sweep = Path(__file__).resolve().parents[2] / "configs" / "sweeps" / "paper.yaml"
    target = {"run": [str(pipeline)], "sim": [str(pipeline)], "sweep": [str(sweep)], "sft": []}[command]
    proc = prorsa(command, *target, "--output", str(pipeline), timeout=60)
    assert proc.returncode == 2
    assert one_error_line(proc.stderr) == f"error: --output: got '{pipeline}'; {pipeline} is a file, not a directory"


def test_validate_answers_an_alias_bomb_with_one_line(tmp_path):
    # That the bomb is refused without being expanded is counted in tests/config/test_limits.py;
    # here the command's answer, with a timeout that only catches a hang.
    lines = ["name: t", "l0: &l0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]  # 9^9 values
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    proc = prorsa("validate", str(bomb), timeout=120)
    assert proc.returncode == 2
    assert "values once its aliases are expanded" in one_error_line(proc.stderr)


class _SilentScheduler:
    """A scheduler address that accepts connections and never answers."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener, self.port, self.held = listener, listener.getsockname()[1], []

    def connected(self) -> None:
        """Returns once the command has connected (a guard raises after HANG_S, not a speed
        bound); the connection is held open, so the command waits on its answer."""
        self.held.append(self.listener.accept()[0])


@contextlib.contextmanager
def _silent_scheduler() -> Iterator[_SilentScheduler]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(HANG_S)
        silent = _SilentScheduler(listener)
        try:
            yield silent
        finally:
            for conn in silent.held:
                conn.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_start_that_fails_leaves_no_run_directory(tmp_path):
    pipeline = write_pipeline(tmp_path / "p.yaml")
    out = tmp_path / "runs"
    proc = prorsa("run", str(pipeline), f"output_dir={out}", "--cluster", f"tcp://127.0.0.1:{_free_port()}")
    assert proc.returncode == 2
    assert "cannot connect to" in one_error_line(proc.stderr)
    assert not out.exists() or list(out.iterdir()) == []


def _interrupt_the_start(tmp_path, extra_args: tuple[str, ...], pipeline_runtime: str,
                         inside: Callable[[], object]) -> str:
    """`inside()` returns once the start is well under way (after the run folder is made)."""
    pipeline = write_pipeline(tmp_path / "p.yaml", runtime=pipeline_runtime)
    out = tmp_path / "runs"
    proc = start("run", str(pipeline), f"output_dir={out}", *extra_args)
    try:
        wait_for(lambda: next(out.glob("rel-*"), None), 60, proc)
        inside()
        assert proc.poll() is None, "the start ended before it was interrupted"
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        text = finish(proc, timeout=HANG_S)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    print(f"ended {took:.1f} s after SIGINT")
    assert proc.returncode == 2
    line = one_error_line(text)
    assert line.startswith("error: interrupted before any trajectory was saved"), line
    assert list(out.iterdir()) == []  # nothing was saved: no run directory is left to resume
    return line


def test_ctrl_c_ends_a_start_stuck_on_a_silent_scheduler(tmp_path):
    # a scheduler address that accepts connections and never answers: the start waits on it
    with _silent_scheduler() as silent:  # inside the start once it has connected
        _interrupt_the_start(tmp_path, ("--cluster", f"tcp://127.0.0.1:{silent.port}"), "", silent.connected)


@pytest.mark.slow
def test_ctrl_c_ends_a_start_of_thousands_of_tool_workers(tmp_path):
    # in-process workers are built without yielding to the event loop, a batch at a time; a
    # cleanup that closes thousands of half-started workers is cut short by the hard stop
    _interrupt_the_start(tmp_path, (), ", tool_workers: 4096", lambda: time.sleep(8.0))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_a_sweep_waiting_on_a_silent_scheduler_with_one_line(tmp_path, signum):
    sweep = Path(__file__).resolve().parents[2] / "configs" / "sweeps" / "paper.yaml"
    with _silent_scheduler() as silent:
        proc = start("sweep", str(sweep), "--output", str(tmp_path / "sw"), "--cluster", f"tcp://127.0.0.1:{silent.port}")
        try:
            silent.connected()  # the grid is loaded and the client connected: it waits on the scheduler
            assert proc.poll() is None, output(proc)
            os.kill(proc.pid, signum)
            text = finish(proc, timeout=HANG_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2
    assert one_error_line(text).startswith("error: interrupted; finished points are kept"), text


def test_a_cleanup_that_hangs_after_a_signal_is_stopped_hard(tmp_path):
    # what a sweep's cluster close that never returns meets: the process ends HARD_STOP_S after the signal
    script = ("import os, signal, time\n"
              "import prorsa.live.interrupt as i\n"
              "i.HARD_STOP_S = 1.0\n"
              "with i.stops_hard(lambda: 'interrupted, tidied'):\n"
              "    try:\n"
              "        os.kill(os.getpid(), signal.SIGTERM)\n"
              "        time.sleep(5)\n"
              "    except KeyboardInterrupt:\n"
              "        time.sleep(60)  # a close that does not end\n")
    # Only the hard stop can end it before the close's 60 s sleep, and the timeout (well under
    # that) turns a missing stop into a failure; the message says it was the hard stop.
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=45)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "error: interrupted, tidied (stopped hard: the run did not end within 1 s)"
