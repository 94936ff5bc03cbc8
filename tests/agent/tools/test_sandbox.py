"""The python tool in its sandbox: the happy path and every way code can misbehave, each contained.

Each failure test asserts what the code tried (its output) and that it was stopped or refused;
where it helps, a control run outside the sandbox shows the same code would succeed there.
"""

from __future__ import annotations

import ast
import asyncio
import errno
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from prorsa.agent.tools import SandboxLimits, ToolStatus, Truncation, call_tool, run_sandboxed
from prorsa.agent.tools.python_tool import PythonTool
from prorsa.agent.tools.sandbox import LAUNCH, probe

# The wall limit is far above what a sandbox start takes on a loaded host, so that only code that
# hangs meets it; a test of the wall limit sets its own.
FAST = SandboxLimits(wall_s=30.0, cpu_s=1, memory_bytes=256 << 20, processes=16, file_bytes=1 << 20)
HANG_S = 60.0  # how long a poll waits for what should happen at once: a guard against a hang
SYSTEM_TEMP = tempfile.gettempdir()  # before each test's own (_own_temp): a folder others may enter


def eventually(predicate, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def run(code: str, limits: SandboxLimits = FAST, **kw):
    return asyncio.run(call_tool(PythonTool(limits=limits, **kw), {"code": code}))


@pytest.fixture(autouse=True)
def _own_temp(tmp_path, monkeypatch):
    """Each test's sandboxes make their scratch in its own folder (a caller it starts too), so
    sandbox_processes() counts its sandboxes alone, not those of a test on another xdist worker."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))


def sandbox_processes() -> list[int]:
    """Host pids of this test's sandbox processes still alive: their cmdline is the launcher's and
    carries their configuration (hex), which names a scratch folder in the test's temporary one."""
    mine = tempfile.gettempdir().encode().hex().encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if LAUNCH.encode() in cmd and mine in cmd:
                pids.append(int(entry.name))
    return pids


def test_happy_path_prints_and_reads_seeded_files():
    res = run("import json\nprint(json.load(open('data.json'))['x'] * 2)\nprint('done')",
              files={"data.json": '{"x": 21}'})
    assert res.status is ToolStatus.OK
    assert res.observation == "42\ndone"
    assert res.elapsed_s > 0


def test_exception_is_an_error_observation_with_only_the_user_traceback():
    res = run("def f():\n    raise ValueError('boom')\nf()")
    assert res.status is ToolStatus.ERROR
    assert "ValueError: boom" in res.observation and 'File "main.py", line 2' in res.observation
    assert "sandbox_child" not in res.observation
    assert res.observation.endswith("[exit code 1]")


def test_segfault_is_a_crash():
    res = run("import ctypes\nctypes.string_at(0)")
    assert res.status is ToolStatus.CRASH
    assert "SIGSEGV" in res.observation


@pytest.mark.timeout(HANG_S)
def test_wall_timeout_keeps_partial_output_and_returns_on_time():
    # "On time" is read off what the call says and leaves, not a stopwatch: the payload sleeps an
    # hour, so a call that let it run would never come back (the timeout mark fails it), and one
    # that only waited for it would have its last line; the wall limit's own note names the limit.
    limits = SandboxLimits(wall_s=1.0)
    res = run("import time\nprint('started', flush=True)\ntime.sleep(3600)\nprint('finished')", limits)
    assert res.status is ToolStatus.TIMEOUT
    assert res.observation.startswith("started") and "timed out after 1 s" in res.observation
    assert "finished" not in res.observation
    assert sandbox_processes() == []


def test_cpu_limit_stops_a_busy_loop():
    # the wall limit so far off that only the CPU limit can end the loop, however shared the CPU
    res = run("while True:\n    pass", SandboxLimits(wall_s=600.0, cpu_s=1))
    assert res.status is ToolStatus.TIMEOUT
    assert "CPU time limit of 1 s" in res.observation and "timed out" not in res.observation


def test_output_flood_is_stopped_early_and_truncated():
    limits = SandboxLimits(wall_s=600.0, output_bytes=64 << 10)
    res = run("while True:\n    print('x' * 1000)", limits, truncation=Truncation(2000))
    # stopped at the byte cap: the wall limit would have said TIMEOUT
    assert res.status is ToolStatus.TRUNCATED and res.detail.startswith("overflow")
    assert "the program was stopped" in res.observation
    assert len(res.observation) < 2200 and "cut" in res.observation


def test_long_output_keeps_head_and_tail_within_the_budget():
    res = run("for i in range(5000):\n    print('line', i)", truncation=Truncation(500))
    assert res.status is ToolStatus.TRUNCATED
    assert res.observation.startswith("line 0\n") and res.observation.rstrip().endswith("line 4999")
    assert len(res.observation) < 560


def test_no_network_even_to_a_local_server():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = []
    server.settimeout(5)

    def serve():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('CONNECTED')\nexcept OSError as e:\n    print('refused', e.errno)")
    try:
        res = run(code)
        assert res.status is ToolStatus.OK
        assert "CONNECTED" not in res.observation and res.observation.startswith("refused")
        assert accepted == []
        # Control: the same connection from outside the sandbox goes through.
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        eventually(lambda: accepted, "the control connection was never accepted")
        assert len(accepted) == 1
    finally:
        server.close()


def test_writes_outside_scratch_are_refused_and_inside_are_removed(tmp_path):
    outside = tmp_path / "open"
    outside.mkdir()
    outside.chmod(0o777)  # so that only the sandbox, not file permissions, can refuse the write
    scratch_root = tmp_path / "scratch"
    scratch_root.mkdir()
    code = (
        "import os, tempfile\n"
        f"for p in [{str(outside / 'escape.txt')!r}, '/tmp/prorsa-escape.txt', '/dev/shm/prorsa-escape']:\n"
        "    try:\n        open(p, 'w').write('x')\n        print('WROTE', p)\n"
        "    except OSError as e:\n        print('refused', e.errno)\n"
        "open('inside.txt', 'w').write('ok')\n"
        "open(os.path.join(tempfile.gettempdir(), 't.txt'), 'w').write('ok')\n"
        "open(os.path.expanduser('~/h.txt'), 'w').write('ok')\n"
        "print(sorted(os.listdir('.')))\n"
    )
    res = run(code, SandboxLimits(wall_s=5.0, scratch_root=str(scratch_root)))
    assert res.status is ToolStatus.OK, res.observation
    assert "WROTE" not in res.observation and res.observation.count("refused") == 3
    assert "'h.txt'" in res.observation and "'inside.txt'" in res.observation
    assert not (outside / "escape.txt").exists() and not Path("/tmp/prorsa-escape.txt").exists()
    assert list(scratch_root.iterdir()) == []  # the scratch directory went with the call


def test_file_size_limit():
    res = run("try:\n    open('big', 'wb').write(b'x' * (4 << 20))\nexcept OSError as e:\n    print('refused', e)")
    assert res.status is ToolStatus.OK
    assert "refused" in res.observation and "File too large" in res.observation


def test_process_limit_holds_and_fork_bomb_is_contained():
    counted = run(
        "import subprocess\nprocs = []\n"
        "for i in range(60):\n    try:\n        procs.append(subprocess.Popen(['sleep', '30']))\n"
        "    except OSError:\n        break\nprint(len(procs))", SandboxLimits(wall_s=5.0, processes=16))
    assert counted.status is ToolStatus.OK, counted.observation
    assert 5 <= int(counted.observation) < 16  # the launcher, init and payload count too
    bomb = run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
               SandboxLimits(wall_s=1.5, processes=16))
    assert bomb.status is ToolStatus.TIMEOUT
    # the sleeps above and the bomb's children are all gone
    eventually(lambda: sandbox_processes() == [], "sandbox processes were left running")


def test_memory_bomb_is_a_memory_error():
    res = run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))", SandboxLimits(memory_bytes=256 << 20))
    assert res.status is ToolStatus.ERROR
    assert "MemoryError" in res.observation
    res = run("x = bytearray(8 << 30)", SandboxLimits(memory_bytes=256 << 20))
    assert res.status is ToolStatus.ERROR and "MemoryError" in res.observation


def test_detached_child_dies_with_the_call():
    res = run("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')")
    # OK, not TIMEOUT: a call that waited for the child's 60 s would meet FAST's wall limit first
    assert res.status is ToolStatus.OK and res.observation == "parent done"
    assert sandbox_processes() == []


def test_caller_timeout_tightens_the_wall_limit():
    # The tool's own call, not call_tool: call_tool's backstop would say "timed out after 0.5 s"
    # too, and only the sandbox's note tells which limit ended it.
    tool = PythonTool(limits=SandboxLimits(wall_s=30.0))
    res = asyncio.run(tool.call({"code": "import time\ntime.sleep(30)"}, timeout_s=0.5))
    assert res.status is ToolStatus.TIMEOUT and res.observation.endswith("[timed out after 0.5 s]")


def test_cancelled_call_kills_the_sandbox():
    async def go():
        task = asyncio.create_task(run_sandboxed("import time\ntime.sleep(60)", limits=SandboxLimits(wall_s=60)))
        await asyncio.sleep(0.5)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(go())
    assert sandbox_processes() == []


def test_concurrent_calls_are_independent():
    async def go():
        tool = PythonTool(limits=FAST)
        codes = [f"open('mine', 'w').write('{i}')\nimport os\nprint(open('mine').read(), os.listdir('.'))"
                 for i in range(4)]
        return await asyncio.gather(*(call_tool(tool, {"code": c}) for c in codes))

    results = asyncio.run(go())
    assert [r.status for r in results] == [ToolStatus.OK] * 4
    assert [r.observation.split()[0] for r in results] == ["0", "1", "2", "3"]


def test_runs_unprivileged():
    res = run("import os\nprint(os.geteuid())")
    assert res.status is ToolStatus.OK
    assert int(res.observation) != 0 or os.geteuid() != 0


def test_probe_finds_isolation_available():
    found = asyncio.run(probe())
    assert (found.error, found.notes) == (None, ())  # and nothing missing: a fresh /proc mounts here
    assert found.limits.startswith("whole-call limits")


@pytest.fixture
def open_unix_socket():
    """A Unix socket anyone may connect to, in a directory anyone may enter, as a host service
    (an X server, a container daemon) leaves one in /tmp or /run."""
    with tempfile.TemporaryDirectory(dir=SYSTEM_TEMP) as tmp:  # pytest's tmp_path sits in a 0700 directory
        os.chmod(tmp, 0o777)
        path = os.path.join(tmp, "service.sock")
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        os.chmod(path, 0o777)
        server.listen()
        server.settimeout(0.5)
        try:
            yield path, server
        finally:
            server.close()


def test_host_unix_sockets_are_out_of_reach(open_unix_socket):
    path, server = open_unix_socket
    code = (f"import os, socket\nprint(os.path.exists({os.path.dirname(path)!r}))\n"
            "for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):\n"
            "    s = socket.socket(socket.AF_UNIX, kind)\n"
            f"    try:\n        s.connect({path!r})\n        s.sendall(b'hello')\n        print('CONNECTED')\n"
            "    except OSError as e:\n        print('refused', e.errno)")
    res = run(code)
    assert res.status is ToolStatus.OK, res.observation
    # ENOENT, not EACCES: the socket is not there at all, whatever its permissions say
    assert res.observation.splitlines() == ["False", f"refused {errno.ENOENT}", f"refused {errno.ENOENT}"]
    with pytest.raises(socket.timeout):
        server.accept()
    # Control: the same connection from outside the sandbox goes through.
    socket.socket(socket.AF_UNIX).connect(path)
    server.accept()[0].close()


def test_proc_lists_only_the_sandbox():
    marker = f"prorsa-host-secret-{os.getpid()}"
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", marker])
    code = (
        "import os\npids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\nprint(pids)\n"
        "seen = []\nfor p in pids:\n    seen.append(open(f'/proc/{p}/cmdline', 'rb').read())\n"
        f"print(any({marker.encode()!r} in c for c in seen))\n"
        f"for pid in ({host.pid}, {os.getpid()}):\n"
        "    try:\n        print(open(f'/proc/{pid}/cmdline', 'rb').read())\n"
        "    except OSError as e:\n        print('refused', e.errno)\n"
        "print(os.getpid(), os.getppid())")
    try:
        eventually(lambda: marker.encode() in Path(f"/proc/{host.pid}/cmdline").read_bytes(),  # control
                   "the host process never showed its command line")
        res = run(code)
    finally:
        host.kill()
        host.wait()
    assert res.status is ToolStatus.OK, res.observation
    lines = res.observation.splitlines()
    assert lines[0] == "[1, 2]"  # the sandbox's init and the payload: no host process
    assert lines[1] == "False"
    host_pid_visible = host.pid in (1, 2) or os.getpid() in (1, 2)
    assert lines[2:4] == [f"refused {errno.ENOENT}"] * 2 or host_pid_visible
    assert lines[4] == "2 1"


REPO = Path(__file__).resolve().parents[3]
SYSTEM_PYTHON = Path("/usr/bin/python3")


def _others_can_read(path: Path) -> bool:
    return all(p.stat().st_mode & 0o005 == 0o005 for p in [path, *path.parents])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not SYSTEM_PYTHON.exists()
                    or not _others_can_read(REPO), reason="needs root, setpriv, a system python and a "
                                                           "world-readable checkout to play a plain user")
def test_unprivileged_caller_gets_the_same_isolation():
    """The path a non-root user takes (a user namespace instead of dropping to a fresh uid)."""
    with tempfile.TemporaryDirectory(dir=SYSTEM_TEMP) as tmp:  # pytest's tmp_path sits in a 0700 directory
        tmp_path = Path(tmp)
        tmp_path.chmod(0o777)
        _run_as_nobody(tmp_path)


AS_NOBODY_PAYLOAD = """
import os, socket, subprocess
print(os.getuid())
procs = []
for i in range(40):
    try:
        procs.append(subprocess.Popen(["sleep", "30"]))
    except OSError:
        break
print(len(procs))
try:
    socket.create_connection(("127.0.0.1", 9), timeout=1)
except OSError as e:
    print(e.errno)
try:
    open(os.getcwd() + "/../escape", "w")  # beside the scratch directory, in a 0777 directory
except OSError as e:
    print(e.errno)
print(any(b"driver.py" in open(f"/proc/{p}/cmdline", "rb").read() for p in os.listdir("/proc") if p.isdigit()))
try:
    socket.socket(socket.AF_UNIX).connect(SOCKET)
except OSError as e:
    print(e.errno)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.unshare(0x10000000), ctypes.get_errno())  # CLONE_NEWUSER: a nested user namespace
"""

AS_NOBODY_DRIVER = """
import asyncio, pathlib, sys
sys.path.insert(0, sys.argv[1])
from prorsa.agent.tools import SandboxLimits, run_sandboxed
here = pathlib.Path(__file__).parent
limits = SandboxLimits(wall_s=5, processes=16, scratch_root=str(here))
run = asyncio.run(run_sandboxed((here / "payload.py").read_text(), limits=limits))
print(run.output, end="")
"""


def _run_as_nobody(tmp_path: Path) -> None:
    sock = tmp_path / "service.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    sock.chmod(0o777)
    server.listen()
    (tmp_path / "payload.py").write_text(AS_NOBODY_PAYLOAD.replace("SOCKET", repr(str(sock))))
    (tmp_path / "driver.py").write_text(AS_NOBODY_DRIVER)
    for f in ("payload.py", "driver.py"):
        (tmp_path / f).chmod(0o644)
    try:
        out = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                              str(SYSTEM_PYTHON), str(tmp_path / "driver.py"), str(REPO)],
                             capture_output=True, text=True, timeout=60)
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    uid, procs, net_errno, write_errno, host_seen, unix_errno, nested, nested_errno = out.stdout.split()
    assert uid == "65534" and 3 <= int(procs) < 16
    assert int(net_errno) == errno.ENETUNREACH and int(write_errno) == errno.EROFS
    assert not (tmp_path / "escape").exists()
    # the user namespace's own /proc (no host process, the driver included) and no host socket
    assert host_seen == "False" and int(unix_errno) == errno.ENOENT
    assert int(nested) == -1 and int(nested_errno) == errno.ENOSPC  # max_user_namespaces is 0 in it


def test_no_way_back_to_privilege():
    code = ("import os\nstatus = open('/proc/self/status').read()\n"
            "print({l.split(':')[0]: l.split()[1] for l in status.splitlines()\n"
            "       if l.startswith(('NoNewPrivs', 'CapEff'))})\n"
            "try:\n    os.setuid(0)\n    print('ROOT')\nexcept OSError as e:\n    print('refused', e.errno)")
    res = run(code)
    assert res.status is ToolStatus.OK
    status = ast.literal_eval(res.observation.splitlines()[0])
    assert status["NoNewPrivs"] == "1"  # a setuid-root program cannot raise privileges again
    assert int(status["CapEff"], 16) == 0 or os.geteuid() != 0  # started as root: no capability left
    # EINVAL where the sandbox's own user namespace has no uid 0 at all (started as root)
    assert res.observation.splitlines()[1] in (f"refused {errno.EPERM}", f"refused {errno.EINVAL}")


def test_sandbox_dies_with_its_caller():
    caller = subprocess.Popen([sys.executable, "-c", (
        "import asyncio\nfrom prorsa.agent.tools import SandboxLimits, run_sandboxed\n"
        "asyncio.run(run_sandboxed('import time\\ntime.sleep(60)', limits=SandboxLimits(wall_s=60)))")])
    try:
        # Launcher, init and payload all up; the payload writes nothing, so no broken pipe ends
        # it: only the tie to its caller can.
        eventually(lambda: len(sandbox_processes()) >= 3, "the sandbox never started")
        assert len(sandbox_processes()) == 3
        time.sleep(0.3)
    finally:
        caller.kill()
        caller.wait()
    eventually(lambda: sandbox_processes() == [], "the sandbox outlived its caller")


def test_payload_may_use_its_own_alarm():
    res = run("import signal, time\nsignal.signal(signal.SIGALRM, lambda *a: print('rang'))\n"
              "signal.setitimer(signal.ITIMER_REAL, 0.1)\ntime.sleep(0.3)\nprint('after')")
    assert res.status is ToolStatus.OK and res.observation == "rang\nafter"


@pytest.mark.timeout(HANG_S)
def test_a_burst_past_the_cap_ends_at_the_cap_not_at_the_wall_timeout():
    # megabytes in one write land in the reader's buffer before the cap is seen: the pipe is
    # paused then, and a call that only waited for the killed process waited for good (the
    # timeout mark turns that hang into a failure)
    limits = SandboxLimits(wall_s=600.0, output_bytes=4 << 10)
    res = run("import sys, time\nsys.stdout.write('x' * 4_000_000)\nsys.stdout.flush()\ntime.sleep(60)",
              limits, truncation=Truncation(2000))
    assert res.status is ToolStatus.TRUNCATED and res.detail.startswith("overflow")
