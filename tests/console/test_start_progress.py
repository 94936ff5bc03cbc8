"""start_progress reads the engines' logs as they grow and says each start step once per engine."""

from __future__ import annotations

import asyncio
import logging

from prorsa.console.start_progress import STEPS, WORKER_RESTARTED, start_progress
from prorsa.engine.vllm.patches import applied_line, selected
from prorsa.engine.vllm.server import HEALTHY_NOTE


def test_each_step_is_said_once_per_engine_as_the_logs_grow(tmp_path):
    said: list[str] = []
    (tmp_path / "engine-1.log").write_text(f"{STEPS[0][0]} 11\nan earlier session\n")  # a resumed run's old log

    async def main() -> None:
        async with start_progress(tmp_path, ["engine-0", "engine-1"], said.append, poll_s=0.01) as watch:
            log0 = open(tmp_path / "engine-0.log", "a")
            for text, _ in STEPS[:2]:
                log0.write(f"(APIServer) INFO {text} ...\n")
                log0.flush()
                await asyncio.sleep(0.05)
            log0.write(f"{STEPS[1][0]} again\n{STEPS[3][0][:10]}")  # a line not yet whole
            log0.flush()
            await asyncio.sleep(0.05)
            with open(tmp_path / "engine-1.log", "a") as log1:
                log1.write(f"{STEPS[0][0]} 12\n{STEPS[3][0]}.\n")
            log0.write(f"{STEPS[3][0][10:]}.\n")
            log0.close()
            watch.stop()

    asyncio.run(main())
    assert said == [f"engine-0: {STEPS[0][1]}", f"engine-0: {STEPS[1][1]}",
                     f"engine-0: {STEPS[3][1]}", f"engine-1: {STEPS[0][1]}", f"engine-1: {STEPS[3][1]}"], said


def test_restarts_are_told_with_their_cause_and_every_line_goes_to_the_start_logger(tmp_path, caplog):
    """A port race lost on start, and a server the health watch restarts mid-run (its note in the
    log: engine/vllm/engine.py), each told once with why, and the start it leads to."""
    from prorsa.engine.vllm.engine import RESTART_NOTE

    said: list[str] = []
    caplog.set_level(logging.INFO, logger="prorsa.start")

    async def main() -> None:
        async with start_progress(tmp_path, ["engine-0"], said.append, poll_s=0.01) as watch:
            with open(tmp_path / "engine-0.log", "a") as log:
                log.write(f"{STEPS[0][0]} 11\nzmq.error.ZMQError: Address already in use (addr='tcp://...')\n"
                          "Address already in use\n")  # said once per start
                log.flush()
                await asyncio.sleep(0.05)
                log.write(f"{STEPS[0][0]} 12\n{STEPS[3][0]}.\n")
                log.flush()
                await asyncio.sleep(0.05)
                watch.stop()  # the engines are up: the watch goes on for restarts
                log.write(f"\n{RESTART_NOTE}the server's process died\n{STEPS[0][0]} 13\n{STEPS[3][0]}.\n")
                log.flush()
                await asyncio.sleep(0.05)
                log.write(f"{STEPS[0][0]} 14\n")  # no note: a new worker process started the server
                log.flush()
                await asyncio.sleep(0.05)

    asyncio.run(main())
    assert said == [
        "engine-0: server started",
        "engine-0: restarting: lost a race for a port to another engine (Address already in use); "
        "starting again on fresh ports",
        "engine-0: server started again", f"engine-0: {STEPS[3][1]}",
        "engine-0: restarting: the server's process died",
        "engine-0: server started again", f"engine-0: {STEPS[3][1]}",
        f"engine-0: restarting: {WORKER_RESTARTED}", "engine-0: server started again"], said
    assert [r.getMessage() for r in caplog.records if r.name == "prorsa.start"] == said


def test_healthy_is_what_vllms_health_endpoint_said_and_the_patch_line_is_told_once_a_run(tmp_path):
    """The launcher writes its patch line at every start of every engine; the console tells it once.
    "healthy" is the note the start writes once /health answers, not vLLM's own startup line."""
    said: list[str] = []
    patched = applied_line(selected({"PRORSA_NIXL_PROGRESS_NICE": "19"}, []))
    dp = applied_line(selected({"PRORSA_NIXL_PROGRESS_NICE": "19", "PRORSA_CPU_DP": "1"}, []))

    async def main() -> None:
        async with start_progress(tmp_path, ["engine-0", "engine-1", "engine-2"], said.append, poll_s=0.01) as watch:
            for name, line in (("engine-0", patched), ("engine-1", patched), ("engine-2", dp)):
                with open(tmp_path / f"{name}.log", "a") as log:
                    log.write(f"{STEPS[0][0]} 11\n{line}\n(APIServer) INFO: Application startup complete.\n")
            await asyncio.sleep(0.05)
            with open(tmp_path / "engine-0.log", "a") as log:
                log.write(f"{HEALTHY_NOTE}\n{STEPS[0][0]} 12\n{patched}\n")  # restarted: the line again
            await asyncio.sleep(0.05)
            watch.stop()

    asyncio.run(main())
    assert said.count(patched) == 1 and said.count(dp) == 1, said
    assert patched.startswith("prorsa patches applied (vLLM ") and patched.endswith(
        "nixl-progress-nice, shutdown-reader-first")
    assert [s for s in said if "healthy" in s] == ["engine-0: healthy; warming up"], said
