"""Which gpufleet worker a process belongs to: the link from a pid NVML reports to the job that started it.

Each worker's shim is started in a session of its own (`setsid`), so the shim's pid is the session id of
every process of that worker: the command, its process group, and whatever it forks, however deep (a
data-loader, a `torchrun` child, a grandchild in a group of its own). A process that left the session
(`setsid` again, as daemons do) is still found while its parent chain leads to the worker's command or
shim. Anything else is nobody's we know: a GPU used outside gpufleet.

Pids are reused, so a process is named by its pid and its start time (clock ticks since boot, as in
`proc.py`). Results are cached per (pid, start time): a pid that now names another process is resolved
again. A cached owner holds only while that worker is still known (a process left behind by a finished job
is no job's any more); a cached "nobody" only until the set of known workers changes.

Pids are read in this process's pid namespace. NVML reports the driver's view; where the control plane runs
in a container without the host's pid namespace, NVML's pids may not name our processes and every GPU process
shows as nobody's: run it with the host's pid namespace (e.g. `--pid=host`) there.

Linux only (`/proc`); stdlib only. Cost: one `/proc/<pid>/stat` read per pid asked for (its start time),
plus, for a pid not cached, one read per ancestor walked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# (job id, attempt, rank): the worker a process belongs to.
WorkerKey = tuple[str, int, int]

_MAX_DEPTH = 64  # ancestors walked before giving up (deeper trees exist only in contrived cases)
_KEEP_CACHED = 4096  # cache entries kept beyond those asked for in the last call


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What the ownership walk needs from `/proc/<pid>/stat`."""

    pid: int
    ppid: int
    pgrp: int
    session: int
    ticks: int  # start time, clock ticks since boot


def read_stat(pid: int) -> ProcStat | None:
    """A live process's stat fields, or None (no such process, a zombie, or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and ")": the fields after it follow the last ")".
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        if fields[0] in (b"Z", b"X"):
            return None
        return ProcStat(pid, int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class KnownWorker:
    """A worker the executor runs: its shim (the session leader) and, once started, its command."""

    key: WorkerKey
    shim_pid: int | None
    shim_ticks: int | None = None
    child_pid: int | None = None
    child_ticks: int | None = None


class ProcessOwners:
    """Resolves pids to the worker they belong to. `stat` reads one process (tests give fabricated ones).

    Thread-safe: the telemetry thread asks while the control loop changes the set of workers."""

    def __init__(self, stat: Callable[[int], ProcStat | None] = read_stat) -> None:
        self._stat = stat
        self._lock = threading.Lock()
        # pid -> (start ticks, owner or None, generation of the known workers it was resolved against)
        self._cache: dict[int, tuple[int, WorkerKey | None, int]] = {}
        self._known: frozenset[KnownWorker] = frozenset()
        self._generation = 0  # bumped whenever the set of known workers changes
        self.walks = 0  # ancestry walks done (a cache miss each): for tests and benchmarks

    def resolve(self, pids: Iterable[int], workers: Sequence[KnownWorker]) -> dict[int, WorkerKey]:
        """The owner of each of `pids` that belongs to one of `workers`; pids of nobody known are left out."""
        known = frozenset(workers)
        keys = {w.key for w in known}
        sessions: dict[int, KnownWorker] = {}
        processes: dict[int, KnownWorker] = {}
        for worker in known:
            if worker.shim_pid is not None and worker.shim_pid > 0:
                sessions[worker.shim_pid] = worker
                processes[worker.shim_pid] = worker
            if worker.child_pid is not None and worker.child_pid > 0:
                processes[worker.child_pid] = worker
        out: dict[int, WorkerKey] = {}
        asked: set[int] = set()
        with self._lock:
            if known != self._known:
                self._known = known
                self._generation += 1
            generation = self._generation
            for pid in pids:
                asked.add(pid)
                stat = self._stat(pid)
                if stat is None:
                    self._cache.pop(pid, None)
                    continue
                cached = self._cache.get(pid)
                if cached is not None and cached[0] == stat.ticks:
                    owner = cached[1]
                    if owner is not None and owner in keys:
                        out[pid] = owner
                        continue
                    if owner is None and cached[2] == generation:
                        continue
                owner = self._walk(stat, sessions, processes)
                self._cache[pid] = (stat.ticks, owner, generation)
                if owner is not None:
                    out[pid] = owner
            if len(self._cache) > len(asked) + _KEEP_CACHED:
                self._cache = {pid: entry for pid, entry in self._cache.items() if pid in asked}
        return out

    def _walk(
        self, stat: ProcStat, sessions: dict[int, KnownWorker], processes: dict[int, KnownWorker]
    ) -> WorkerKey | None:
        self.walks += 1
        leader = sessions.get(stat.session)
        if leader is not None and self._is_shim(leader):
            return leader.key
        # Left the worker's session: follow the parents up to the worker's command or shim.
        current: ProcStat | None = stat
        for _ in range(_MAX_DEPTH):
            if current is None or current.pid <= 1:
                return None
            worker = processes.get(current.pid)
            if worker is not None and _same_process(worker, current):
                return worker.key
            current = self._stat(current.ppid) if current.ppid > 0 else None
        return None

    def _is_shim(self, worker: KnownWorker) -> bool:
        """The session leader pid still names our shim, or no process at all (the shim was killed but its
        session lives on: a pid stays taken while it is some live process's session id, so it cannot name
        another session meanwhile). A live process with that pid and another start time is a new session:
        the worker we know of is gone."""
        if worker.shim_pid is None or worker.shim_ticks is None:
            return True
        leader = self._stat(worker.shim_pid)
        return leader is None or leader.ticks == worker.shim_ticks


def _same_process(worker: KnownWorker, stat: ProcStat) -> bool:
    if stat.pid == worker.child_pid:
        return worker.child_ticks is None or worker.child_ticks == stat.ticks
    return worker.shim_ticks is None or worker.shim_ticks == stat.ticks
