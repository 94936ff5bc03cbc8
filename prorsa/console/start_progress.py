"""What the engines are doing while a run waits for them, and each restart after: one line per
engine and step, told to the `prorsa.start` logger (INFO) and to `say`.

    start_progress(log_dir, engines, say)   async context manager: while it is open, every engine's
                                            log is read as it grows and each step it reaches
                                            (STEPS) is told once (the console's clock, or the
                                            log record's, says when);
                                            a restart is told with its cause (RESTARTS) and its
                                            steps again, for as long as it is open. .stop(): the
                                            engines are up, every step they reached told
    start_log                               the `prorsa.start` logger: a host application (the
                                            Python API's caller) routes the start-up there

A vLLM server on CPU takes a minute or more to start, and a run starts several side by side; the
steps are read from the logs the servers write anyway (run_dir/engines/engine-<i>.log), so this
works wherever the driver sees the run directory: a local cluster, or batch jobs on a shared
file system. A restarted server appends to its log.

Where vLLM's own endpoints say it, the step comes from them: "healthy" is GET /health answering 200
with /v1/models listing our model, which the engine's worker polls anyway and notes in the log
(server.HEALTHY_NOTE). vLLM binds its HTTP port only once the model is loaded and its KV cache
allocated, so the steps before (loading the model, KV cache allocated) have no endpoint to ask and
are read from vLLM's own log lines. The launcher's line naming the patches it applied
(engine/vllm/patches.py) is told once a run, not once an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from prorsa.engine.vllm.engine import RESTART_NOTE
from prorsa.engine.vllm.patches import APPLIED
from prorsa.engine.vllm.server import HEALTHY_NOTE

start_log = logging.getLogger("prorsa.start")

# (text a log line holds, what the engine is doing from then on), in the order a start goes
STEPS = (
    ("# prorsa: server pid", "server started"),
    ("Initializing a V1 LLM engine", "loading the model"),
    ("init engine (profile, create kv cache", "model loaded, KV cache allocated"),
    (HEALTHY_NOTE, "healthy; warming up"),
)
# what a start with no cause before it in the log means: the health watch notes its restarts and a
# port race shows in the server's output, so only the engine's worker process itself, dead or killed
# and started again by its Nanny, starts a server without a word
WORKER_RESTARTED = "its worker process started again (it died or was killed)"
# (text a log line holds, why the server starts again), for causes the server's own output tells
RESTARTS = (
    (RESTART_NOTE, None),  # the cause follows the note
    ("Address already in use", "lost a race for a port to another engine (Address already in use); "
                               "starting again on fresh ports"),
)


class _Watch:
    def __init__(self, log_dir: Path, engines: list[str], say: Callable[[str], None], poll_s: float):
        self.log_dir, self.engines, self.say, self.poll_s = log_dir, engines, say, poll_s
        # a resumed run's logs hold the last session's starts: read from where they end now
        self.read_to = {name: _size(log_dir / f"{name}.log") for name in engines}
        self.step = dict.fromkeys(engines, -1)  # the last step told, per engine
        self.cause = dict.fromkeys(engines, "")  # the restart told since its last step 0
        self.task: asyncio.Task | None = None
        self.patches_told: set[str] = set()  # the engines' patch lines, each told once a run

    def tell(self, line: str) -> None:
        start_log.info(line)
        self.say(line)

    def stop(self) -> None:
        """The engines are up: the last steps told now, so none is missing (the watch goes on
        for restarts)."""
        self.poll()

    async def run(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(self.poll_s)

    def poll(self) -> None:
        for name in self.engines:
            for line in self._new_lines(name):
                self._read(name, line)

    def _read(self, name: str, line: str) -> None:
        if line.startswith(APPLIED):
            if line not in self.patches_told:
                self.patches_told.add(line)
                self.tell(line)
            return
        for text, cause in RESTARTS:
            if text in line:
                cause = cause or line.split(RESTART_NOTE, 1)[1].strip()
                if cause != self.cause[name]:
                    self.cause[name] = cause
                    self.tell(f"{name}: restarting: {cause}")
                return
        for i, (text, doing) in enumerate(STEPS):
            # a step earlier than the last told is a restart: told again
            if text in line and (i > self.step[name] or i == 0):
                again = i == 0 and self.step[name] >= 0
                if again and not self.cause[name]:  # no note, no port race: a new worker started it
                    self.tell(f"{name}: restarting: {WORKER_RESTARTED}")
                self.step[name] = i
                if i == 0:
                    self.cause[name] = ""
                self.tell(f"{name}: {'server started again' if again else doing}")

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
