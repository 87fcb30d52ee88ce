"""What the isolation tests share: a job program every job user can run, a folder they can all write their
findings to, and backends that isolate their workers (per-queue users, cgroups) as `gpufleet up` as root does.

The program (`probe.py`) does what its arguments say and writes what it found to OUT (JSON):
    whoami OUT                  uid, gid, groups, environment, working folder (its mode and owner), umask
    try-read OUT PATH...        for each path: "read", "denied" or "absent"
    escape PIDFILE [exit]       starts a process that leaves its session (double fork + setsid), writes its
                                pid, then waits forever (or, with `exit`, exits 0)
    hog MIB                     touches MIB mebibytes of memory, then exits 0
    spin SECONDS OUT            burns CPU for SECONDS of wall time, writes the CPU time it got
    fork N OUT                  starts N sleeping processes, writes how many the kernel allowed
    devices OUT PATH...         opens each path, writes the error name ("ok" if it opened)
    flood BYTES                 writes numbered lines to stdout, BYTES in all, then exits 0
    fill TRIGGER CODE           writes to stdout until the disk refuses, then waits for TRIGGER, exits CODE
    wait TRIGGER CODE           waits for TRIGGER, exits CODE
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufleet.adapters.inventory.emulated_inventory import parse_emulate
from gpufleet.adapters.local import cgroups as cg
from gpufleet.adapters.local.executor import LocalBackend
from gpufleet.adapters.local.isolation import Isolation
from gpufleet.adapters.local.users import Users
from gpufleet.domain import GpuShare, Job, Node, WorkerPlacement, WorkerRequest
from gpufleet.domain.jobs import RunSpec
from gpufleet.ports import Launch
from tests.kit.jobusers import JOB_PYTHON, reachable_by_jobs, share, users_created_here
from tests.local.conftest import WallClock

PROBE = r"""
import errno, json, os, sys, time

def out(path, data):
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)

def forever():
    while True:
        time.sleep(0.05)

mode, args = sys.argv[1], sys.argv[2:]
if mode == "whoami":
    cwd = os.getcwd()
    st = os.stat(cwd)
    mask = os.umask(0); os.umask(mask)
    out(args[0], {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "env": dict(os.environ),
                  "cwd": cwd, "cwd_mode": st.st_mode & 0o777, "cwd_uid": st.st_uid, "umask": mask})
elif mode == "try-read":
    found = {}
    for path in args[1:]:
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                with open(path, "rb") as f:
                    f.read(1)
            found[path] = "read"
        except PermissionError:
            found[path] = "denied"
        except FileNotFoundError:
            found[path] = "absent"
    out(args[0], found)
elif mode == "escape":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(args[0] + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(args[0] + ".tmp", args[0])
            forever()
        os._exit(0)
    while not os.path.exists(args[0]):
        time.sleep(0.01)
    if len(args) > 1 and args[1] == "exit":
        sys.exit(0)
    forever()
elif mode == "hog":
    block = bytearray(int(args[0]) << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
elif mode == "spin":
    end = time.time() + float(args[0])
    while time.time() < end:
        pass
    out(args[1], {"cpu": time.process_time()})
elif mode == "fork":
    started = 0
    for _ in range(int(args[0])):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        started += 1
    out(args[1], {"started": started})
    os.killpg(0, 9)
elif mode == "devices":
    found = {}
    for path in args[1:]:
        try:
            os.close(os.open(path, os.O_RDWR))
            found[path] = "ok"
        except OSError as e:
            found[path] = errno.errorcode[e.errno]
    out(args[0], found)
elif mode == "flood":
    total, n = int(args[0]), 0
    while total > 0:
        line = f"line {n:09d} " + "x" * 80 + "\n"
        sys.stdout.write(line)
        total -= len(line)
        n += 1
    sys.stdout.write(f"last line {n}\n")
    sys.stdout.flush()
elif mode == "fill":
    chunk = b"y" * 65536
    written = 0
    while written < (64 << 20):
        try:
            os.write(1, chunk)
        except OSError:
            break
        written += len(chunk)
    while not os.path.exists(args[0]):
        time.sleep(0.02)
    sys.exit(int(args[1]))
elif mode == "wait":
    while not os.path.exists(args[0]):
        time.sleep(0.02)
    sys.exit(int(args[1]))
"""


@dataclass
class Isolated:
    """A shared folder, the probe program, emulated GPUs, and a backend factory with isolation."""

    root: Path
    shared: Path
    program: Path
    node: Node
    jobs_home: Path
    backends: list[LocalBackend] = field(default_factory=list)

    @property
    def state(self) -> Path:
        return self.root / "state"

    def backend(self, isolation: Isolation, **kwargs: Any) -> LocalBackend:
        backend = LocalBackend(self.state, [self.node], WallClock(), emulated=True, isolation=isolation, **kwargs)
        self.backends.append(backend)
        return backend

    def per_queue_users(self, groups: cg.Cgroups | None = None, **kwargs: Any) -> Isolation:
        return Isolation(Users(self.jobs_home), groups or cg.unavailable("not in this test"), **kwargs)

    def run(self, *args: str, **kwargs: Any) -> RunSpec:
        return RunSpec((JOB_PYTHON, str(self.program), *args), **kwargs)

    def out(self, name: str) -> str:
        return str(self.shared / f"{name}-{secrets.token_hex(3)}.json")

    def launch(
        self,
        job_id: str,
        run: RunSpec,
        *,
        queue: str = "iso-a",
        gpus: tuple[int, ...] = (0,),
        cpu_milli: int = 0,
        memory: int = 0,
        run_as: str | None = None,
    ) -> Launch:
        placement = WorkerPlacement(self.node.name, tuple(GpuShare(i) for i in gpus), cpu_milli, memory)
        request = WorkerRequest(gpus=len(gpus), cpu_milli=cpu_milli, memory=memory)
        return Launch(Job(job_id, queue, request, run=run), 1, (placement,), run_as=run_as)


def read_out(path: str, timeout_s: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError(f"the job wrote no {path} in {timeout_s} s")
        time.sleep(0.01)
    with open(path) as f:
        data: dict[str, Any] = json.load(f)
    return data


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("switching a job's user needs a control plane running as root")


def require_cgroups(tag: str) -> cg.Cgroups:
    """This machine's cgroups, as `gpufleet up` finds them. Skips only where the kernel has none mounted;
    fails where they are mounted but unusable (that is a defect here, not a missing facility)."""
    require_root()
    groups = cg.detect(tag)
    if not groups.usable:
        if not any(" - cgroup" in line for line in Path("/proc/self/mountinfo").read_text().splitlines()):
            pytest.skip("no cgroup file system is mounted on this machine")
        pytest.fail(f"cgroups are mounted but unusable: {groups.describe()}")
    return groups


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@contextlib.contextmanager
def isolated_setup(tmp_path: Path) -> Iterator[Isolated]:
    shared = reachable_by_jobs(tmp_path / "shared")
    program = share(shared / "probe.py", PROBE)
    node = parse_emulate("8xA100-80GB", "box")[0]
    with users_created_here():
        iso = Isolated(tmp_path, shared, program, node, reachable_by_jobs(tmp_path / "homes"))
        try:
            yield iso
        finally:
            for backend in iso.backends:
                backend.shutdown(stop_jobs=True, grace_s=0.5)
            # Anything left (a test's own crash): a fresh backend adopting nothing kills it.
            if (iso.state / "run").exists():
                LocalBackend(iso.state, [node], WallClock(), emulated=True).adopt([])
