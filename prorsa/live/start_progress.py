"""What the engines are doing while a run waits for them: one console line per engine and step.

    start_progress(log_dir, engines, say)   async context manager: while it is open, every engine's
                                            log is read as it grows and each step it reaches
                                            (STEPS) is said once, with the seconds since it opened;
                                            .stop() ends the watch (the engines are up)

A vLLM server on CPU takes a minute or more to start, and a run starts several side by side; the
steps are read from the logs the servers write anyway (run_dir/engines/engine-<i>.log), so this
works wherever the driver sees the run directory: a local cluster, or batch jobs on a shared
file system. A restarted server appends to its log and is reported again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

# (text a log line holds, what the engine is doing from then on), in the order a start goes
STEPS = (
    ("# prorsa: server pid", "server started"),
    ("Initializing a V1 LLM engine", "loading the model"),
    ("init engine (profile, create kv cache", "model loaded, KV cache allocated"),
    ("Application startup complete", "healthy; warming up"),
)


class _Watch:
    def __init__(self, log_dir: Path, engines: list[str], say: Callable[[str], None], poll_s: float):
        self.log_dir, self.engines, self.say, self.poll_s = log_dir, engines, say, poll_s
        # a resumed run's logs hold the last session's starts: read from where they end now
        self.read_to = {name: _size(log_dir / f"{name}.log") for name in engines}
        self.step = dict.fromkeys(engines, -1)  # the last step said, per engine
        self.t0 = time.monotonic()
        self.task: asyncio.Task | None = None

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.poll()  # the last steps, so none is missing from the console

    async def run(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(self.poll_s)

    def poll(self) -> None:
        for name in self.engines:
            for line in self._new_lines(name):
                for i, (text, doing) in enumerate(STEPS):
                    # a step earlier than the last said is a restart: say it again
                    if text in line and (i > self.step[name] or i == 0):
                        self.step[name] = i
                        self.say(f"{name}: {doing} ({time.monotonic() - self.t0:.0f} s)")

    def _new_lines(self, name: str) -> list[str]:
        try:
            with open(self.log_dir / f"{name}.log", "rb") as f:
                f.seek(self.read_to[name])
                data = f.read()
        except OSError:  # not there yet
            return []
        end = data.rfind(b"\n") + 1  # a line still being written is read once it is whole
        self.read_to[name] += end
        return data[:end].decode(errors="replace").splitlines()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@contextlib.asynccontextmanager
async def start_progress(log_dir: Path, engines: list[str], say: Callable[[str], None],
                         poll_s: float = 1.0) -> AsyncIterator[_Watch]:
    watch = _Watch(log_dir, engines, say, poll_s)
    watch.task = asyncio.create_task(watch.run())
    try:
        yield watch
    finally:
        watch.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch.task
