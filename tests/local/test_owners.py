"""Which job a process belongs to (`owners.py`, `LocalBackend.owner_of`): with fabricated process tables for
pid reuse and the cache, a property test against a plain reference, and real processes under a real
executor (a grandchild in its own group, one that left the session, a stranger)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.adapters.local.owners import KnownWorker, ProcessOwners, ProcStat, read_stat
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import ObservationKind
from tests.local.conftest import Harness, ended, has, wait_for, wait_until


class Table:
    """A fabricated process table: pid -> (ppid, session, start ticks)."""

    def __init__(self) -> None:
        self.rows: dict[int, ProcStat] = {}
        self.reads = 0

    def add(self, pid: int, ppid: int, session: int, ticks: int = 100) -> None:
        self.rows[pid] = ProcStat(pid, ppid, pid, session, ticks)

    def stat(self, pid: int) -> ProcStat | None:
        self.reads += 1
        return self.rows.get(pid)


JOB = ("train", 1, 0)
SHIM = KnownWorker(JOB, shim_pid=500, shim_ticks=50, child_pid=501, child_ticks=51)


def _machine() -> Table:
    table = Table()
    table.add(1, 0, 1, 1)
    table.add(500, 1, 500, 50)  # the shim: its own session
    table.add(501, 500, 500, 51)  # the command, in the shim's session
    table.add(502, 501, 500, 60)  # its child, in a group of its own: same session
    table.add(503, 501, 503, 61)  # a child that called setsid: found through its parents
    table.add(900, 1, 900, 70)  # a stranger
    return table


def test_session_and_parent_chain_name_the_worker_and_strangers_are_nobodys() -> None:
    table = _machine()
    owners = ProcessOwners(table.stat)
    assert owners.resolve([501, 502, 503, 900, 4242], [SHIM]) == {501: JOB, 502: JOB, 503: JOB}
    assert owners.resolve([502], []) == {}  # no worker known: nobody's


def test_a_reused_pid_is_resolved_again_and_not_given_to_the_old_owner() -> None:
    table = _machine()
    owners = ProcessOwners(table.stat)
    assert owners.resolve([502], [SHIM]) == {502: JOB}
    walks = owners.walks
    assert owners.resolve([502], [SHIM]) == {502: JOB}
    assert owners.walks == walks  # cached: same pid, same start time
    # The job's process ends and a stranger's new process gets its pid (another start time, another session).
    table.add(502, 1, 900, 999)
    assert owners.resolve([502], [SHIM]) == {}
    assert owners.walks == walks + 1


def test_a_cached_owner_lasts_while_its_worker_is_known_and_a_cached_nobody_until_workers_change() -> None:
    table = _machine()
    owners = ProcessOwners(table.stat)
    assert owners.resolve([502], [SHIM]) == {502: JOB}
    assert owners.resolve([502], []) == {}  # the job ended: what it left behind is no job's
    # A process first seen before its worker was known (a stale set) is resolved again when the set changes.
    table.add(700, 1, 700, 80)
    table.add(701, 700, 700, 81)
    assert owners.resolve([701], [SHIM]) == {}
    later = KnownWorker(("eval", 2, 1), shim_pid=700, shim_ticks=80)
    assert owners.resolve([701], [SHIM, later]) == {701: ("eval", 2, 1)}


def test_a_session_whose_leader_pid_now_names_another_process_is_not_the_workers() -> None:
    table = _machine()
    owners = ProcessOwners(table.stat)
    # The command ended and its child was adopted by init; the shim pid now runs with another start time: that
    # is not our shim, whatever the session id of the leftover says.
    del table.rows[501]
    table.add(502, 1, 500, 60)
    table.add(500, 1, 500, 777)
    assert owners.resolve([502], [SHIM]) == {}
    # A shim killed (no process with its pid) leaves its session to its command's processes: still the job's.
    del table.rows[500]
    fresh = ProcessOwners(table.stat)
    assert fresh.resolve([502], [SHIM]) == {502: JOB}


@st.composite
def _forests(draw: st.DrawFn) -> tuple[dict[int, tuple[int, int]], list[KnownWorker]]:
    """A random process forest: pid -> (ppid, session); some session leaders are known shims."""
    count = draw(st.integers(2, 40))
    procs: dict[int, tuple[int, int]] = {}
    for pid in range(2, count + 2):
        parent = draw(st.sampled_from([1, *procs])) if procs else 1
        new_session = parent == 1 or draw(st.booleans())
        procs[pid] = (parent, pid if new_session else procs[parent][1] if parent in procs else pid)
    leaders = [pid for pid, (_, session) in procs.items() if session == pid]
    shims = draw(st.lists(st.sampled_from(leaders), unique=True, max_size=len(leaders)))
    workers = [KnownWorker((f"job-{s}", 1, 0), shim_pid=s, shim_ticks=s) for s in shims]
    return procs, workers


def _reference(pid: int, procs: dict[int, tuple[int, int]], shims: dict[int, KnownWorker]) -> str | None:
    """Plainly: the session's shim if known, else the nearest known shim among the ancestors."""
    if procs[pid][1] in shims:
        return shims[procs[pid][1]].key[0]
    current = pid
    while current in procs:
        if current in shims:
            return shims[current].key[0]
        current = procs[current][0]
    return None


@settings(max_examples=200, deadline=None)
@given(_forests())
def test_resolution_matches_the_plain_definition(forest: tuple[dict[int, tuple[int, int]], list[KnownWorker]]) -> None:
    procs, workers = forest
    table = Table()
    for pid, (ppid, session) in procs.items():
        table.add(pid, ppid, session, ticks=pid)
    shims = {w.shim_pid: w for w in workers if w.shim_pid is not None}
    owners = ProcessOwners(table.stat)
    got = owners.resolve(list(procs), workers)
    want = {pid: owner for pid in procs if (owner := _reference(pid, procs, shims)) is not None}
    assert {pid: key[0] for pid, key in got.items()} == want
    assert owners.resolve(list(procs), workers) == got  # and the cached answer is the same


# --- real processes --------------------------------------------------------------------------------------

SPAWNER = r"""
import json, os, subprocess, sys, time
out = sys.argv[1]
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], process_group=0)
escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
with open(out + ".tmp", "w") as f:
    json.dump({"me": os.getpid(), "grandchild": grandchild.pid, "escaped": escaped.pid}, f)
os.replace(out + ".tmp", out)
while not os.path.exists(out + ".stop"):
    time.sleep(0.02)
"""


def test_real_job_processes_are_attributed_to_their_worker_and_a_stranger_is_not(harness: Harness) -> None:
    program = harness.root / "spawner.py"
    program.write_text(SPAWNER)
    pids_file = harness.root / "pids.json"
    backend = harness.backend()
    launch = harness.launch("spawn", RunSpec((sys.executable, str(program), str(pids_file))))
    backend.launch(launch)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    pids: dict[str, int] = {}
    try:
        wait_for(backend, has("spawn", ObservationKind.STARTED))
        wait_until(pids_file.exists, what="the job's pids")
        pids = json.loads(pids_file.read_text())
        assert pids["me"] == harness.child_pid(launch)
        asked = [pids["me"], pids["grandchild"], pids["escaped"], stranger.pid, harness.shim_pid(launch)]
        started = time.perf_counter()
        owners = backend.owner_of(asked)
        first_ms = (time.perf_counter() - started) * 1e3
        worker = ("spawn", 1, 0)
        assert owners == {
            pids["me"]: worker,
            pids["grandchild"]: worker,
            pids["escaped"]: worker,  # left the session; its parent is the command
            harness.shim_pid(launch): worker,
        }
        escaped = read_stat(pids["escaped"])
        assert escaped is not None
        assert escaped.session == pids["escaped"]
        started = time.perf_counter()
        assert backend.owner_of(asked) == owners
        cached_ms = (time.perf_counter() - started) * 1e3
        commands = backend.running_commands()
        assert commands == {worker: harness.child_pid(launch)}
        print(f"owner_of 5 pids: first {first_ms:.2f} ms, cached {cached_ms:.2f} ms")
        # The job ends: its command's group is killed; the grandchild (a group of its own) and the process that
        # left the session outlive it, and are nobody's now.
        backend.stop("spawn", 1, 2.0, "done")
        wait_for(backend, ended("spawn"))
        assert backend.owner_of(asked) == {}
        assert backend.running_commands() == {}
    finally:
        stranger.kill()
        stranger.wait()
        for name in ("grandchild", "escaped"):
            if name in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pids[name], signal.SIGKILL)


def test_read_stat_names_this_process_and_refuses_what_is_gone() -> None:
    me = read_stat(os.getpid())
    assert me is not None
    assert (me.pid, me.ppid, me.session) == (os.getpid(), os.getppid(), os.getsid(0))
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert read_stat(done.pid) is None
    # A zombie is not a live process.
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(lambda: Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")
    assert read_stat(zombie.pid) is None
    zombie.wait()
