#!/usr/bin/env python3
"""A batch system that runs every job on this machine, at once: sbatch/squeue/scancel (SLURM) and
qsub/qstat/qdel (PBS), picked by the name it is called by. State lives in $FAKE_BATCH_DIR:
<id>.sh (the script as submitted), <id>.out (its output), <id>.pid (its process group),
<id>.cancelled (scancel/qdel was called for it)."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ["FAKE_BATCH_DIR"])


def new_id() -> int:
    n = 1000
    while True:
        n += 1
        try:  # O_EXCL: jobs are submitted concurrently
            os.close(os.open(STATE / f"{n}.id", os.O_CREAT | os.O_EXCL))
            return n
        except FileExistsError:
            continue


def submit(script: str) -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    job = new_id()
    copy = STATE / f"{job}.sh"
    shutil.copy(script, copy)  # the submitter deletes its file once this returns
    with open(STATE / f"{job}.out", "wb") as out:
        proc = subprocess.Popen(["bash", str(copy)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=os.environ | {"SLURM_JOB_ID": str(job), "PBS_JOBID": f"{job}.fake"})
    (STATE / f"{job}.pid").write_text(str(proc.pid))
    return job


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def cancel(job: str) -> int:
    job = job.split(".")[0]
    pid_file = STATE / f"{job}.pid"
    if not pid_file.exists():
        print(f"unknown job {job}", file=sys.stderr)
        return 1
    (STATE / f"{job}.cancelled").touch()
    pgid = int(pid_file.read_text())
    if alive(pgid):
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.time() + 10
        while alive(pgid) and time.time() < deadline:
            time.sleep(0.1)
        if alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
    return 0


def queue() -> None:
    for pid_file in sorted(STATE.glob("*.pid")):
        state = "R" if alive(int(pid_file.read_text())) else "CD"
        print(f"{pid_file.stem} {state}")


def main() -> int:
    cmd = Path(sys.argv[0]).name
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    if cmd in ("sbatch", "qsub"):
        job = submit(args[-1])
        print(f"Submitted batch job {job}" if cmd == "sbatch" else f"{job}.fakepbs")
        return 0
    if cmd in ("scancel", "qdel"):
        return max((cancel(j) for j in args), default=0)
    if cmd in ("squeue", "qstat"):
        queue()
        return 0
    print(f"fakebatch: unknown command {cmd}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
