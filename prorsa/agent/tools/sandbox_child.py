"""The sandbox launcher, started by sandbox.py in a fresh interpreter (see sandbox.LAUNCH):

    python -I -S -B -u -c "...; import sandbox_child; sandbox_child.main()" CONFIG
    (CONFIG: the marshal of a dict, in hex)

It isolates itself, then runs the payload in a grandchild and exits with the payload's status:

    launcher [joins the call's cgroup] --unshare(net, mount, pid, ipc[, user])--> a new root on
       |     a tmpfs: the system directories and the interpreter bound read-only, the scratch
       |     directory a size-capped tmpfs of its own, nothing else; no nested user namespaces
       |     drop to an unprivileged uid (when started as root)
       +-- fork: init (pid 1 of the new pid namespace; its exit kills everything left in it)
              |  a fresh /proc of this pid namespace, pivot into the new root (the host's is
              |  detached), drop privileges (started as root: into a user namespace closed to
              |  nesting), rlimits
              +-- fork: payload (Python source run in-process, or an exec'd argv) in scratch

The new root, not the read-only flag, is what keeps the code from the host's Unix sockets: a
socket file accepts connections on a read-only mount, so only sockets that are not there at all
(in /tmp, /run, /var, home directories) are out of reach. A socket inside a bound system directory
(VISIBLE) would still be reachable; none of them normally holds one.

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
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
MNT_DETACH = 0x2
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added after the table unification)
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
# pivot_root has a libc wrapper only in newer glibc; its number differs by architecture.
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
# What the new root shows of the host, read-only: enough to run the interpreter and the usual
# command-line programs. /dev gets only the harmless character devices (DEVICES); /proc is the
# sandbox's own; /tmp, /run, /var, /home, /root, /sys are not there (but for the interpreter's own
# directories where they lie below them).
VISIBLE = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
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


def isolate(cfg: dict) -> int | None:
    """Enter fresh namespaces and lay out the sandbox's root (init enters it, from inside the new
    pid namespace). Returns the unprivileged uid to drop to when started as root, else None."""
    scratch = cfg["scratch"]
    as_root = os.geteuid() == 0
    # A new network namespace has only a loopback device, and it is down: no address is reachable.
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET
    uid, gid = os.getuid(), os.getgid()
    if not as_root:
        flags |= CLONE_NEWUSER  # the unprivileged way to own a mount and a network namespace
    _check(_libc.unshare(flags), "unshare")
    if not as_root:
        map_self(uid, gid)
        forbid_nesting()
    # Private first: a mount made below must not propagate back to the host's namespace.
    _mount_setattr("/", AT_RECURSIVE, _MountAttr(propagation=MS_PRIVATE))
    # Root could undo the namespaces (remount, setns); an unprivileged uid cannot.
    new = UID_BASE + int.from_bytes(os.urandom(4), "little") % UID_SPAN if as_root else None
    build_root(scratch, cfg["expose"], cfg["scratch_bytes"], new)
    return new


def map_self(uid: int, gid: int) -> None:
    """In a new user namespace: the one mapping an unprivileged process may write, its own ids."""
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def forbid_nesting() -> None:
    """No user namespace can be made below this one (bubblewrap's --disable-userns): the code
    would find in one every capability again, over its own namespaces (attack surface)."""
    _write("/proc/sys/user/max_user_namespaces", "0")


def nest_user_namespace(uid: int) -> list[str]:
    """Started as root, after dropping to `uid`: a user namespace of the sandbox's own, only so
    that nesting can be switched off in it; its capabilities are dropped next."""
    if not os.path.exists("/proc/self/uid_map"):
        return ["nested user namespaces are not switched off (no /proc)"]
    if _libc.unshare(CLONE_NEWUSER) != 0:
        return []  # refused to this uid: then to the code as well
    # A change of uid made this process undumpable, which gives its /proc/self files to root;
    # undumpable again afterwards, so that the code cannot ptrace init.
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    map_self(uid, uid)
    forbid_nesting()
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return []


def build_root(scratch: str, expose: list[str], scratch_bytes: int, owner: int | None) -> None:
    """Lay the new root out on a tmpfs mounted over `scratch` (in this namespace only): VISIBLE
    and `expose` (the interpreter's prefixes) bound read-only at their host paths, a tmpfs of
    `scratch_bytes` at the scratch directory's path holding a copy of its files (the code's writes
    end there with ENOSPC, and vanish with the namespace), DEVICES, and an empty /proc for init."""
    binds, links = layout([*VISIBLE, *expose])
    fds = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in [*binds, scratch]}
    _check(_libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=755"), "new root")
    for path, fd in fds.items():
        target = scratch + path
        os.makedirs(target, 0o755, exist_ok=True)
        if path == scratch:
            _check(_libc.mount(b"tmpfs", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                               f"size={scratch_bytes},mode=700".encode()), "scratch tmpfs")
            copy_tree(f"/proc/self/fd/{fd}", target, owner)
        else:
            _check(_libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, MS_BIND | MS_REC, None),
                   f"bind {path}")
            _mount_setattr(target, AT_RECURSIVE, _MountAttr(attr_set=MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID))
        os.close(fd)
    for link, real in links:
        os.makedirs(os.path.dirname(scratch + link), 0o755, exist_ok=True)
        os.symlink(real, scratch + link)
    os.makedirs(scratch + "/dev", 0o755)
    for dev in DEVICES:
        if os.path.exists(f"/dev/{dev}"):
            open(f"{scratch}/dev/{dev}", "w").close()
            _check(_libc.mount(f"/dev/{dev}".encode(), f"{scratch}/dev/{dev}".encode(), None, MS_BIND, None),
                   f"bind /dev/{dev}")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{scratch}/dev/{name}")
    os.symlink("/proc/self/fd", f"{scratch}/dev/fd")
    os.makedirs(scratch + "/proc", 0o555)
    _mount_setattr(scratch, 0, _MountAttr(attr_set=MOUNT_ATTR_RDONLY))


def copy_tree(src: str, dst: str, owner: int | None) -> None:
    """The seeded files onto the scratch tmpfs, owned by `owner` when given (started as root)."""
    if owner is not None:
        os.chown(dst, owner, owner)
    with os.scandir(src) as entries:
        for entry in entries:
            to = os.path.join(dst, entry.name)
            if entry.is_dir(follow_symlinks=False):
                os.mkdir(to, 0o755)
                copy_tree(entry.path, to, owner)
                continue
            if not entry.is_file(follow_symlinks=False):
                continue  # the parent seeds plain files and directories only
            with open(entry.path, "rb") as f, open(to, "wb") as g:
                while chunk := f.read(1 << 20):
                    g.write(chunk)
            if owner is not None:
                os.chown(to, owner, owner)


def layout(paths: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """The directories to bind (real paths, none inside another) and the symlinks to make again
    (path, real path): a path that is a symlink on the host (/bin -> usr/bin, a virtualenv's
    prefix) is one in the new root too, pointing at its bound target."""
    reals, links = set(), []
    for path in paths:
        path = path.rstrip("/")
        real = os.path.realpath(path)
        if not path or real == "/" or not os.path.isdir(real):
            continue
        reals.add(real)
        if real != path:
            links.append((path, real))
    binds: list[str] = []
    for real in sorted(reals):
        if not any(_under(real, b) for b in binds):
            binds.append(real)
    made: list[str] = []
    for path, real in sorted(links):
        if not any(_under(path, p) for p in binds + made):
            made.append(path)
    return binds, [(p, r) for p, r in sorted(links) if p in made]


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent + "/")


def enter_root(root: str) -> list[str]:
    """In init: mount this pid namespace's /proc, then make `root` the root and detach the
    host's. Returns what could not be had (a note each) rather than failing for it."""
    notes = []
    # Mounted before the pivot: a user namespace may mount proc only while a full one is in view.
    if _libc.mount(b"proc", f"{root}/proc".encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        notes.append(f"no /proc in the sandbox (mount proc: {os.strerror(ctypes.get_errno())})")
    os.chdir(root)
    _check(_pivot_root(b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")
    return notes


def _pivot_root(new: bytes, old: bytes) -> int:
    if hasattr(_libc, "pivot_root"):
        return _libc.pivot_root(new, old)
    return _libc.syscall(SYS_PIVOT_ROOT.get(os.uname().machine, -1), new, old)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop(uid: int | None, nest: bool = False) -> list[str]:
    """Give up what could undo the sandbox: root's uid (started as root), or the capabilities a
    user namespace grants its first process (started unprivileged). With `nest` (init), started
    as root, enter a user namespace closed to nesting first (nest_user_namespace). Returns notes."""
    notes = []
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if nest:
            notes = nest_user_namespace(uid)
    none = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), none), "capset")
    # No exec may gain privileges again: a setuid-root program (su, mount) would undo it all.
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    return notes


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


def init_process(cfg: dict, uid: int | None) -> None:
    """Pid 1 of the sandbox: enter the new root, start the payload, reap every child, exit with
    the payload's status."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the launcher's deadline is not the payload's
    try:
        notes = enter_root(cfg["scratch"])
        notes += drop(uid, nest=True)
        set_limits(cfg["limits"])
    except OSError as e:
        print(f"sandbox: isolation failed: {e}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a change of uid cleared it
    if cfg.get("report"):
        for note in notes:
            print(f"sandbox: {note}", file=sys.stderr)
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
        if cfg["cgroup"]:  # first: every process of the call starts inside its cgroup
            _write(cfg["cgroup"] + "/cgroup.procs", str(os.getpid()))
        uid = isolate(cfg)
    except OSError as e:
        print(f"sandbox: isolation failed: {e}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    init = os.fork()
    if init == 0:
        init_process(cfg, uid)
    try:
        drop(uid)  # the launcher too: it shares the sandbox's uid, so RLIMIT_NPROC counts it
    except OSError as e:
        os.kill(init, signal.SIGKILL)
        print(f"sandbox: isolation failed: {e}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    tie_to_parent(cfg)  # after drop: a change of uid clears the parent-death signal
    _, wstatus = os.waitpid(init, 0)
    os._exit(_exit_code(wstatus))


if __name__ == "__main__":
    main()
