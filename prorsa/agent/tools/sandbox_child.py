"""The sandbox launcher, started by sandbox.py in a fresh interpreter (see sandbox.LAUNCH):

    python -I -S -B -u -c "...; import sandbox_child; sandbox_child.main()" CONFIG
    (CONFIG: the marshal of a dict, in hex)

It isolates itself, then runs the payload in a grandchild and exits with the payload's status:

    launcher --unshare(net, mount, pid, ipc[, user])--> read-only root, scratch bound read-write
       |     drop to an unprivileged uid (when started as root), rlimits
       +-- fork: init (pid 1 of the new pid namespace; its exit kills everything left in it)
              +-- fork: payload (Python source run in-process, or an exec'd argv) in scratch

Standard library only, so the interpreter starts quickly and the launcher does not depend on the
package being importable inside the sandbox. It runs without `site` (-S; .pth processing took 40
of the 55 ms of a bare start) and hands a Python payload the parent's import path instead. Its
configuration comes as marshal, not JSON: importing json (and re) took 20 ms more.
Exit codes: the payload's own, 128+signal when it was killed by a signal, and SETUP_FAILED (125)
when isolation could not be set up (the parent reports that as a crash rather than running the
payload unisolated).
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import sys

import _signal as signal  # the C module: `signal` would import enum, 6 ms of every start

SETUP_FAILED = 125

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added after the table unification)
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
# Unprivileged uids for sandboxes started as root: a fresh one per call, so RLIMIT_NPROC (counted
# per uid) bounds one sandbox's processes and `kill` cannot reach another sandbox.
UID_BASE, UID_SPAN = 2_000_000_000, 100_000_000

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount_setattr(path: str, flags: int, attr: _MountAttr) -> None:
    rc = _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr),
                       ctypes.sizeof(attr))
    _check(rc, f"mount_setattr {path}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def isolate(cfg: dict) -> None:
    """Enter fresh namespaces; make every mount read-only except the scratch directory."""
    scratch = cfg["scratch"]
    as_root = os.geteuid() == 0
    # A new network namespace has only a loopback device, and it is down: no address is reachable.
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET
    uid, gid = os.getuid(), os.getgid()
    if not as_root:
        flags |= CLONE_NEWUSER  # the unprivileged way to own a mount and a network namespace
    _check(_libc.unshare(flags), "unshare")
    if not as_root:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    # Private first: a bind mount made below must not propagate back to the host's namespace.
    _mount_setattr("/", AT_RECURSIVE, _MountAttr(attr_set=MOUNT_ATTR_RDONLY, propagation=MS_PRIVATE))
    _check(_libc.mount(scratch.encode(), scratch.encode(), None, MS_BIND, None), "bind scratch")
    _mount_setattr(scratch, 0, _MountAttr(attr_clr=MOUNT_ATTR_RDONLY))
    if as_root:
        # Root could undo all of the above (remount, setns); an unprivileged uid cannot.
        expose(cfg["expose"] + [scratch])
        new = UID_BASE + int.from_bytes(os.urandom(4), "little") % UID_SPAN
        for root, dirs, files in os.walk(scratch):
            for name in [root] + [os.path.join(root, n) for n in dirs + files]:
                os.lchown(name, new, new)
        os.setgroups([])
        os.setresgid(new, new, new)
        os.setresuid(new, new, new)
    # No exec may gain privileges again: a setuid-root program (su, mount) would undo it all.
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def expose(paths: list[str]) -> None:
    """Keep `paths` (the interpreter's prefixes, the scratch dir) reachable for an unprivileged uid.

    Each closed directory above one of them (a 0700 home holding the interpreter) is covered with
    a read-only tmpfs that holds only bind mounts of the paths below it: the rest of it stays
    hidden, and the interpreter can still import its standard library.
    """
    covers: dict[str, list[str]] = {}
    for path in paths:
        parts = path.rstrip("/").split("/")
        for i in range(2, len(parts)):
            parent = "/".join(parts[:i])
            if not os.stat(parent).st_mode & 0o001:
                covers.setdefault(parent, []).append(path)
                break
    for cover, below in covers.items():
        fds = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in below]
        _check(_libc.mount(b"tmpfs", cover.encode(), b"tmpfs", 0, b"mode=755"), f"cover {cover}")
        for p, fd in zip(below, fds):
            os.makedirs(p, 0o755, exist_ok=True)
            _check(_libc.mount(f"/proc/self/fd/{fd}".encode(), p.encode(), None, MS_BIND | MS_REC,
                               None), f"expose {p}")
            os.close(fd)
        _mount_setattr(cover, 0, _MountAttr(attr_set=MOUNT_ATTR_RDONLY))


def set_limits(limits: dict) -> None:
    pairs = {
        resource.RLIMIT_CPU: limits["cpu_s"],
        resource.RLIMIT_AS: limits["memory_bytes"],
        resource.RLIMIT_FSIZE: limits["file_bytes"],
        resource.RLIMIT_NPROC: limits["processes"],
        resource.RLIMIT_NOFILE: limits["open_files"],
        resource.RLIMIT_CORE: 0,
    }
    for which, value in pairs.items():
        if value is not None:
            # A soft CPU limit below the hard one makes the kernel send SIGXCPU first, which
            # tells the parent which limit ended the call; equal limits would send SIGKILL.
            hard = value + 1 if which == resource.RLIMIT_CPU else value
            resource.setrlimit(which, (value, hard))


def run_payload(cfg: dict) -> None:
    """In the payload process: never returns."""
    try:
        os.chdir(cfg["scratch"])
    except OSError as e:
        print(f"sandbox: cannot enter the scratch directory: {e}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    os.environ.clear()
    os.environ.update(cfg["env"])
    if cfg["argv"]:
        # Python ignores these; an exec'd program expects the defaults (a Python payload keeps
        # them ignored, so a write past RLIMIT_FSIZE is an OSError it can report).
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(cfg["argv"][0], cfg["argv"])
        except OSError as e:
            print(f"sandbox: cannot run {cfg['argv'][0]!r}: {e.strerror}", file=sys.stderr)
            os._exit(127)
    code = 0
    sys.argv = [cfg["source_file"]]
    sys.path[:] = [cfg["scratch"], *cfg["sys_path"]]  # as `python main.py` would see it
    try:
        with open(cfg["source_file"], encoding="utf-8") as f:
            source = f.read()
        exec(compile(source, cfg["source_file"], "exec"), {"__name__": "__main__", "__file__": cfg["source_file"],
                                                     "__builtins__": __builtins__})
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - the payload's own error, printed as Python would
        import traceback

        # Skip this launcher's own frame: the model should see only its code's lines.
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def init_process(cfg: dict) -> None:
    """Pid 1 of the sandbox: start the payload, reap every child, exit with the payload's status."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the launcher's deadline is not the payload's
    payload = os.fork()
    if payload == 0:
        run_payload(cfg)
    status = 1
    while True:
        try:
            pid, wstatus = os.wait()
        except ChildProcessError:
            break
        if pid == payload:
            status = _exit_code(wstatus)
            break  # leaving kills whatever the payload left behind in this pid namespace
    os._exit(status)


def _exit_code(wstatus: int) -> int:
    if os.WIFSIGNALED(wstatus):
        return 128 + os.WTERMSIG(wstatus)
    return os.WEXITSTATUS(wstatus)


def tie_to_parent(cfg: dict) -> None:
    """Die with the process that asked for this sandbox, and in any case soon after its deadline."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != cfg["parent"]:  # it died before the line above took effect
        os._exit(SETUP_FAILED)
    # The parent normally stops a late sandbox itself; this covers a parent that cannot.
    signal.signal(signal.SIGALRM, lambda *_: os.killpg(0, signal.SIGKILL))
    signal.setitimer(signal.ITIMER_REAL, cfg["deadline_s"])


def main() -> None:
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    try:
        isolate(cfg)
        set_limits(cfg["limits"])
    except OSError as e:
        print(f"sandbox: isolation failed: {e}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    tie_to_parent(cfg)  # after isolate: a change of uid clears the parent-death signal
    init = os.fork()
    if init == 0:
        init_process(cfg)
    _, wstatus = os.waitpid(init, 0)
    os._exit(_exit_code(wstatus))


if __name__ == "__main__":
    main()
