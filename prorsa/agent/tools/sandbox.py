"""Run untrusted code in a throwaway process: own namespaces, rlimits, wall timeout, scratch dir.

    SandboxLimits(...)                     what one call may use (frozen; defaults suit a tool call)
    await run_sandboxed(source=... | argv=..., limits=..., files=...) -> SandboxRun
    await probe() -> Probe                 whether sandboxes start here, and what they go without
    SandboxRun.kind                        "ok" | "exit" | "signal" | "timeout" | "cpu" |
                                           "memory" | "overflow" | "setup": how the call ended

Every call gets a fresh scratch directory (its cwd, HOME and TMPDIR), seeded with `files`: a tmpfs
of `scratch_bytes` that vanishes with the call (the host directory behind it, holding the seeded
files, is removed afterwards, or by the next caller's sweep when this one was killed;
sandbox_scratch.py). Memory, CPU seconds and processes are bounded for the whole call, summed over
its processes (sandbox_budget.py: a cgroup v2 of its own where one is delegated, else a watch).
The launcher (sandbox_child.py) enters new mount, network, pid and ipc namespaces (plus a user
namespace when not root) and a root of its own, so:
- the filesystem is the system directories (/usr, /etc, /bin, /lib...) and the interpreter,
  read-only, the scratch tmpfs, read-write, and a few character devices; nothing else of the
  host is there (no /tmp, /run, /var, /home, /sys), so neither are the Unix sockets kept there;
- /proc is the sandbox's own: it lists only the call's processes (or, where proc cannot be
  mounted, nothing: probe() says so);
- there is no network, not even loopback;
- when the call ends, everything it started is killed with its pid namespace;
- no user namespace can be made inside (max_user_namespaces is 0 in the sandbox's own).
Started as root, it also drops to a fresh unprivileged uid, so RLIMIT_NPROC applies and the
namespaces cannot be undone; started unprivileged, it drops the capabilities its user namespace
gave it. It dies with its caller, and by itself DEADLINE_GRACE_S after its wall limit. Nothing
here raises for what the code does: a crash, a timeout, a memory or fork bomb, an output flood
all end as a SandboxRun.

Needs Linux 5.12+ (mount_setattr) and root or unprivileged user namespaces; probe() says when
they are missing, and then no code runs. What is visible stays readable: the sandbox keeps the
code from changing or reaching anything, not from reading world-readable system files.
"""

from __future__ import annotations

import asyncio
import marshal
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prorsa.agent.tools import sandbox_child, sandbox_scratch
from prorsa.agent.tools.sandbox_budget import CallBudget, way

CHILD = Path(sandbox_child.__file__)
# Imported rather than run as a script, so the launcher comes from its cached bytecode (compiling
# it took 7 ms a call); -B leaves writing that cache to the parent's own import of the module.
LAUNCH = f"import sys; sys.path[:0] = [{str(CHILD.parent)!r}]; import sandbox_child; sandbox_child.main()"
READ_CHUNK = 1 << 16
# The launcher kills its own process group this long after the wall limit, should the parent
# that was to do it be gone or stuck.
DEADLINE_GRACE_S = 5.0


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0  # wall-clock limit of one call
    # CPU seconds of the whole call (sandbox_budget.py), and RLIMIT_CPU of each process in it
    # (SIGXCPU, then SIGKILL 1 s later)
    cpu_s: int = 10
    memory_bytes: int = 1 << 30  # memory of the whole call (sandbox_budget.py), and RLIMIT_AS of each process
    file_bytes: int = 16 << 20  # RLIMIT_FSIZE: the largest file the code may write
    scratch_bytes: int = 64 << 20  # size of the scratch tmpfs: all the call's files together
    processes: int = 32  # processes of the call at once (pids.max, else RLIMIT_NPROC in its user namespace)
    cpus: float = 1.0  # CPUs the call may keep busy at once (cpu.max; only where a cgroup is delegated)
    open_files: int = 256  # RLIMIT_NOFILE
    output_bytes: int = 1 << 20  # output read back; past this the call is stopped as "overflow"
    scratch_root: str | None = None  # where scratch directories are made (None: the system temp)
    # a delegated cgroup v2 directory to make the calls' cgroups in (None: our own, if delegated)
    cgroup: str | None = None


@dataclass(frozen=True)
class SandboxRun:
    # ok | exit (non-zero) | signal | timeout (wall) | cpu (RLIMIT_CPU or the call's CPU seconds) |
    # memory (the call's memory) | overflow | setup
    kind: str
    output: str  # stdout and stderr interleaved as written, decoded as UTF-8 (bad bytes replaced)
    exit_code: int | None  # None when the sandbox was stopped from outside (timeout, overflow)
    elapsed_s: float  # wall time from spawn to exit
    signal: int | None = None  # the signal that ended the code, for kind "signal" and "cpu"


def _python_paths() -> list[str]:
    """The interpreter's prefixes: what an unprivileged uid must still be able to read."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(p for p in paths if os.path.isdir(p))


def _import_path() -> list[str]:
    """The parent's sys.path entries inside the interpreter's prefixes (stdlib, site-packages)."""
    prefixes = tuple(os.path.join(p, "") for p in _python_paths())
    return [p for p in sys.path if p and os.path.join(os.path.abspath(p), "").startswith(prefixes)]


def _config(scratch: str, limits: SandboxLimits, argv: list[str] | None, env: Mapping[str, str],
            report: bool = False, cgroup: str | None = None) -> str:
    bin_dir = os.path.dirname(sys.executable)
    base_env = {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "HOME": scratch,
                "TMPDIR": os.path.join(scratch, ".tmp"), "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    # marshal: the launcher is this same interpreter, and it imports marshal for free (json: 20 ms).
    return marshal.dumps({
        "scratch": scratch, "argv": argv, "source_file": "main.py",
        "parent": os.getpid(), "deadline_s": limits.wall_s + DEADLINE_GRACE_S, "report": report,
        "env": {**base_env, **env}, "expose": _python_paths(), "sys_path": _import_path(),
        "cgroup": cgroup, "scratch_bytes": limits.scratch_bytes,
        "limits": {"cpu_s": limits.cpu_s, "memory_bytes": limits.memory_bytes,
                   "file_bytes": limits.file_bytes, "processes": limits.processes,
                   "open_files": limits.open_files},
    }).hex()


def _seed(scratch: str, source: str | None, files: Mapping[str, str | bytes]) -> None:
    os.makedirs(os.path.join(scratch, ".tmp"))
    if source is not None:
        files = {**files, "main.py": source}
    for rel, content in files.items():
        path = Path(scratch, rel).resolve()
        if not path.is_relative_to(Path(scratch).resolve()):
            raise ValueError(f"sandbox file {rel!r} is outside the scratch directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)


async def _read_capped(stream: asyncio.StreamReader, out: bytearray, cap: int) -> bool:
    """Read to EOF into `out` (kept when the caller times this out); True when past `cap`."""
    while chunk := await stream.read(READ_CHUNK):
        out += chunk
        if len(out) > cap:
            del out[cap:]
            return True
    return False


async def _reap(proc: asyncio.subprocess.Process) -> int:
    """The exit code of a process whose output is no longer wanted. asyncio's wait() returns only
    once the pipe has closed too, and a reader left over its buffer limit (an output flood stopped
    at the cap) has paused the pipe, which then never sees its end: read to EOF, discarding."""
    while proc.stdout is not None and await proc.stdout.read(READ_CHUNK):
        pass
    return await proc.wait()


def _kill(proc: asyncio.subprocess.Process) -> None:
    # The launcher leads its own process group; the rest dies with the pid namespace's init.
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def _classify(code: int) -> tuple[str, int | None]:
    if code == sandbox_child.SETUP_FAILED:
        return "setup", None
    if 128 < code <= 128 + 64:  # the launcher's convention for "ended by signal N"
        sig = code - 128
        return ("cpu" if sig == signal.SIGXCPU else "signal"), sig
    return ("ok" if code == 0 else "exit"), None


async def run_sandboxed(source: str | None = None, *, argv: list[str] | None = None,
                        limits: SandboxLimits = SandboxLimits(),
                        files: Mapping[str, str | bytes] | None = None,
                        env: Mapping[str, str] | None = None, report: bool = False) -> SandboxRun:
    """Run Python `source` (as main.py in scratch) or an `argv` command in a fresh sandbox.
    With `report`, the output opens with a "sandbox: ..." line for each thing it goes without."""
    if (source is None) == (argv is None):
        raise ValueError("give exactly one of source and argv")
    start = time.perf_counter()
    sandbox_scratch.sweep_once(limits.scratch_root)
    lock, scratch = sandbox_scratch.make(limits.scratch_root)
    budget = proc = reader = watcher = None
    try:
        budget = CallBudget.open(limits.memory_bytes, limits.cpu_s, limits.processes, limits.cpus, limits.cgroup)
        _seed(scratch, source, files or {})
        # the wall limit runs from the launch: under load the child may have run (and ended) before
        # this coroutine resumes from the spawn, which a clock started after it would not count
        launched = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-B", "-u", "-X", "utf8", "-c", LAUNCH,
            _config(scratch, limits, argv, env or {}, report, budget.cgroup),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        raw = bytearray()
        reader = asyncio.ensure_future(_read_capped(proc.stdout, raw, limits.output_bytes))
        watcher = asyncio.ensure_future(budget.watch(proc.pid))
        left = max(limits.wall_s - (time.perf_counter() - launched), 0.0)
        await asyncio.wait({reader, watcher}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        # a loop kept busy past the deadline may see the call end before its timer: still past the limit
        if reader.done() and (reader.result() or time.perf_counter() - launched <= limits.wall_s):
            stop = "overflow" if reader.result() else None
        else:  # past the wall limit or the call's budget: what was read so far is kept
            stop = watcher.result() if watcher.done() else "timeout"
            reader.cancel()
            await asyncio.wait({reader})  # _reap reads the pipe next, and two readers may not wait on it
        watcher.cancel()
        if stop is not None:
            _kill(proc)
        code = await _reap(proc)
        output = raw.decode("utf-8", "replace")
        elapsed = time.perf_counter() - start
        stop = stop or budget.close()
        if stop is not None:
            return SandboxRun(stop, output, None, elapsed)
        kind, sig = _classify(code)
        return SandboxRun(kind, output, code, elapsed, sig)
    finally:
        if watcher is not None:
            watcher.cancel()
        if reader is not None and not reader.done():  # cancelled from outside while reading
            reader.cancel()
            await asyncio.wait({reader})
        if proc is not None and proc.returncode is None:
            _kill(proc)
            await _reap(proc)
        if budget is not None:
            budget.close()
        sandbox_scratch.remove(lock, scratch)


@dataclass(frozen=True)
class Probe:
    error: str | None  # why no sandbox starts here (then no code runs at all); None when one does
    notes: tuple[str, ...] = ()  # what a sandbox here goes without, one line each
    limits: str = ""  # how whole-call limits are kept here (sandbox_budget.way)


async def probe(cgroup: str | None = None) -> Probe:
    """Start one sandbox and report what it could and could not set up, and how whole-call limits
    are kept here (a cgroup of each call's own, or a watch over its processes).

    Isolation needs either root or unprivileged user namespaces (some distributions switch those
    off or confine them); without it every call ends as kind "setup" and nothing is run.
    """
    run = await run_sandboxed("pass", limits=SandboxLimits(wall_s=30.0, cgroup=cgroup), report=True)
    if run.kind != "ok":
        return Probe(run.output.strip() or f"sandbox ended as {run.kind}")
    notes = [line.removeprefix("sandbox: ") for line in run.output.splitlines()]
    return Probe(None, tuple(notes), way(cgroup))
