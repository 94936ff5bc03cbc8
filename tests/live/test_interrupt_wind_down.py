"""A signal with a wind-down (prorsa serve): the rollout is asked to end by itself and, when it does,
the run finishes as if nothing had happened; when it does not, it is cancelled as any run is."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import asyncio, os, signal
from prorsa.live import interrupt

interrupt.WIND_DOWN_S = 0.5

async def main(listens):
    stop = asyncio.Event()

    async def rollout():
        await stop.wait()
        return "ended by itself"

    async def run():
        asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGINT)
        return await interrupt.guarded(asyncio.create_task(rollout()))

    try:
        print(await interrupt.run_interruptible(run(), wind_down=stop.set if listens else lambda: None))
    except interrupt.Interrupted:
        print("interrupted")

asyncio.run(main({listens}))
"""


def _run(listens: bool) -> str:
    proc = subprocess.run([sys.executable, "-c", SCRIPT.replace("{listens}", str(listens))], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_rollout_that_winds_down_is_a_run_that_finished():
    assert _run(True) == "ended by itself"


def test_a_rollout_that_does_not_is_interrupted():
    assert _run(False) == "interrupted"
