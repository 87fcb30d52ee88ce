"""What a worker's shim does with the worker's cgroup: join it, kill everything in it, tell whether the memory
limit killed something, remove it. Stdlib `os` only: the shim imports this on every launch.

A worker's cgroup is a list of folders, one per hierarchy it lives in: a single folder on cgroup v2, one per
controller (memory, cpu, pids, devices) on v1. Every function takes that list.
"""

from __future__ import annotations

import os
import signal
import time

# Files naming the processes in a cgroup folder: v1 and v2 both have cgroup.procs.
_PROCS = "cgroup.procs"


def join(folders: list[str], pid: int = 0) -> None:
    """Move process `pid` (0: the caller) into every folder. Raises OSError when the kernel refuses."""
    for folder in folders:
        with open(os.path.join(folder, _PROCS), "w") as f:
            f.write(str(pid))


def members(folders: list[str]) -> list[int]:
    """The pids in the worker's cgroup (read from its first folder: a worker joins all of them together)."""
    for folder in folders:
        try:
            with open(os.path.join(folder, _PROCS)) as f:
                return [int(line) for line in f.read().split()]
        except OSError:
            continue
    return []


def kill(folders: list[str], timeout_s: float = 5.0) -> bool:
    """SIGKILL every process in the cgroup, including those that left the worker's session or process group
    (`setsid`, double forks). Returns whether the cgroup is empty. v2: `cgroup.kill`, which the kernel applies
    atomically; v1: kill what is listed until nothing is (a process forking meanwhile is listed next round)."""
    if not folders:
        return True
    whole = os.path.join(folders[0], "cgroup.kill")  # v2 only (Linux 5.14+)
    if os.path.exists(whole):
        try:
            with open(whole, "w") as f:
                f.write("1")
        except OSError:
            pass
    deadline = time.monotonic() + timeout_s
    while True:
        pids = members(folders)
        if not pids:
            return True
        for pid in pids:
            try:  # noqa: SIM105 - contextlib would cost the shim an import
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def oom_kills(folders: list[str]) -> int:
    """How many processes the kernel killed for going over the cgroup's memory limit (v1 `memory.oom_control`,
    v2 `memory.events`); 0 when unknown."""
    for folder in folders:
        for name in ("memory.events", "memory.oom_control"):
            try:
                with open(os.path.join(folder, name)) as f:
                    text = f.read()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
    return 0


def full_disk(folder: str) -> bool:
    """Whether the file system at `folder` (a queue's disk quota) has no room left: the shim says so in the
    exit record of a worker that failed, so its reason names the quota."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    size, free = stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize
    return free < max(4 << 20, size // 100)


def remove(folders: list[str]) -> bool:
    """Remove the (empty) cgroup folders; True when none is left. A folder still holding a process stays."""
    left = False
    for folder in folders:
        try:
            os.rmdir(folder)
        except FileNotFoundError:
            pass
        except OSError:
            left = True
    return not left
