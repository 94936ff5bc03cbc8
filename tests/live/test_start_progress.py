"""start_progress reads the engines' logs as they grow and says each start step once per engine."""

from __future__ import annotations

import asyncio

from prorsa.live.start_progress import STEPS, start_progress


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
    steps = [line.split(" (")[0] for line in said]
    assert steps == [f"engine-0: {STEPS[0][1]}", f"engine-0: {STEPS[1][1]}",
                     f"engine-0: {STEPS[3][1]}", f"engine-1: {STEPS[0][1]}", f"engine-1: {STEPS[3][1]}"], said
    assert all(line.endswith(" s)") for line in said)
