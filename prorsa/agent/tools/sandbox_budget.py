"""Whole-call limits of a sandboxed call: memory, processes and CPU summed over every process the
call starts, not per process as rlimits count them.

    budget = CallBudget.open(memory_bytes, cpu_s, processes, cpus, cgroup_root)
    budget.cgroup                  the directory the launcher joins first thing (None: watched)
    await budget.watch(pid)        "memory" | "cpu" once the call passed its budget; the caller kills it
    budget.close() -> str | None   "memory" when the kernel's OOM killer ended the call

Two ways, the first that works here:
- cgroup: a cgroup v2 directory delegated to us (its cgroup.subtree_control enables memory and
  pids) gets a child per call with memory.max (swap none, the OOM killer takes the whole call),
  pids.max and cpu.max. Where the kernel counts, nothing can slip between two looks.
- watched: a poll of the call's process tree (the launcher's descendants, via /proc's children
  lists) sums resident memory and CPU time and stops the call past either budget. Processes stay
  bounded by RLIMIT_NPROC, which the sandbox's own user namespace counts for this call alone. A
  burst between two polls (WATCH_S) can pass the budget by what it allocates in that time.
Scratch lies on its own size-capped tmpfs (sandbox_child.py), so it is bounded apart from these.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass

PREFIX = "prorsa-sbx-"
CGROUP_GRACE_S = 60.0
WATCH_S = 0.02  # the poll of the watched way: a 2-core host allocates a few tens of MB in this time
CPU_PERIOD_US = 100_000
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")
_found: dict[str | None, str | None] = {}


def cgroup2_mount() -> str | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[0] == "cgroup2":
                return left.split()[4]
    return None


def own_cgroup() -> str | None:
    """The cgroup v2 directory this process is in (None on a host without cgroup v2)."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return os.path.join(mount, line[3:].strip().lstrip("/"))
    return None


def delegated(root: str | None) -> str | None:
    """`root` (or, when None, this process's own cgroup) if calls may get cgroups below it: the
    memory and pids controllers enabled for its children, and writable by us."""
    if root not in _found:
        path = root if root is not None else own_cgroup()
        try:
            with open(os.path.join(path or "", "cgroup.subtree_control")) as f:
                enabled = set(f.read().split())
            ok = path is not None and {"memory", "pids"} <= enabled and os.access(path, os.W_OK) \
                and os.access(os.path.join(path, "cgroup.procs"), os.W_OK)
        except OSError:
            ok = False
        _found[root] = path if ok else None
        if ok:
            sweep(path)
    return _found[root]


def sweep(parent: str) -> None:
    """Remove the calls' cgroups that a killed caller left (empty: their processes died with
    it). A busy one refuses rmdir; a young one may be a call whose launcher is yet to join it."""
    for name in os.listdir(parent):
        path = os.path.join(parent, name)
        try:
            if name.startswith(PREFIX) and time.time() - os.stat(path).st_mtime > CGROUP_GRACE_S:
                os.rmdir(path)
        except OSError:
            pass


def way(root: str | None) -> str:
    """How calls are bounded here, in words (sandbox.probe() reports it)."""
    found = delegated(root)
    if found:
        return f"whole-call limits by cgroup v2 ({found})"
    where = f"{root} is not" if root else "no cgroup v2 is"
    return f"whole-call limits watched ({where} delegated here): memory and CPU polled over the call's processes"


def tree(pid: int) -> list[int]:
    """`pid` and its descendants, as /proc's children lists have them (every thread's)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue  # gone meanwhile
    return found


def usage(pids: list[int]) -> tuple[int, float]:
    """Private resident bytes and CPU seconds (with reaped children's) summed over `pids`.
    Resident less shared: the interpreter's mapped files, counted in every process's RSS, are
    the page cache's; a forked child's not yet copied pages count twice, erring on the safe side."""
    pages, ticks = 0, 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
            with open(f"/proc/{p}/statm") as f:
                resident, shared = f.read().split()[1:3]
        except (OSError, ValueError):
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2:].split()  # from field 3 on: the name may hold spaces
        ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        pages += int(resident) - int(shared)
    return pages * _PAGE, ticks / _TICK


@dataclass
class CallBudget:
    memory_bytes: int
    cpu_s: float
    cgroup: str | None = None

    @classmethod
    def open(cls, memory_bytes: int, cpu_s: float, processes: int, cpus: float,
             cgroup_root: str | None = None) -> CallBudget:
        parent = delegated(cgroup_root)
        if parent is None:
            return cls(memory_bytes, cpu_s)
        path = os.path.join(parent, f"{PREFIX}{uuid.uuid4().hex[:12]}")
        os.mkdir(path)
        settings = {"memory.max": memory_bytes, "memory.swap.max": 0, "memory.oom.group": 1,
                    "pids.max": processes, "cpu.max": f"{int(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}"}
        for name, value in settings.items():
            try:
                with open(os.path.join(path, name), "w") as f:
                    f.write(str(value))
            except FileNotFoundError:
                pass  # no swap accounting, or no cpu controller delegated: the rest still holds
        return cls(memory_bytes, cpu_s, path)

    def _used(self, pid: int) -> tuple[int, float]:
        if self.cgroup is None:
            return usage(tree(pid))
        with open(os.path.join(self.cgroup, "cpu.stat")) as f:
            micros = next(int(line.split()[1]) for line in f if line.startswith("usage_usec"))
        return 0, micros / 1e6  # memory is the kernel's to hold (memory.max)

    async def watch(self, pid: int) -> str:
        while True:
            rss, cpu = self._used(pid)
            if rss > self.memory_bytes:
                return "memory"
            if cpu > self.cpu_s:
                return "cpu"
            await asyncio.sleep(WATCH_S)

    def close(self) -> str | None:
        """Remove the call's cgroup (again: nothing); "memory" when its OOM killer ended the call."""
        if self.cgroup is None:
            return None
        path, self.cgroup = self.cgroup, None
        try:
            with open(os.path.join(path, "memory.events")) as f:
                events = dict(line.split() for line in f)
        except OSError:
            events = {}
        for _ in range(100):  # the pid namespace's last processes may take a moment to leave it
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.01)
        return "memory" if int(events.get("oom_kill", 0)) else None
