"""How a worker is started: as which user, in which environment and working folder, in which cgroup with
which limits and which GPU devices. One module, used by every executor that starts workers on a node (the
local executor, and a node agent of a multi-node backend); the control loop and the scheduling core never
see it.

Two modes, chosen at start (`Isolation.detect`):

- **per-queue users** (the control plane runs as root): each queue's workers run as the queue's own
  unprivileged user (`users.py`), in a working folder under that user's home, with logs the job cannot
  write to and the data folder (store, tokens, other jobs' logs) out of reach.
- **single user** (the control plane is not root, so it cannot switch users): workers run as the control
  plane's own user. Every job can then read what the control plane can: one trust domain. `up` says so, and
  refuses team tokens unless started with `--single-user`.

Either way a worker's environment is clean (`env.py`: nothing from the control plane's), and where the
kernel allows (`cgroups.py`) it runs in a cgroup of its own with its limits.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.adapters.local import cgroups as cg
from gpufleet.adapters.local.layout import safe_name
from gpufleet.adapters.local.users import DEFAULT_JOBS_HOME, RunAs, Users, check_mapped, queue_user
from gpufleet.adapters.local.worker_env import base_env, worker_env
from gpufleet.domain.errors import GpufleetError

GiB = 1 << 30
DEFAULT_LOG_CAP = GiB
DEFAULT_PIDS_LIMIT = 8192  # processes and threads per worker: room for data loaders, not for a fork bomb
JOBS_FOLDER = "gpufleet-jobs"  # in a switched user's home: the jobs' default working folders


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a node needs to start one worker. Plain data: a multi-node backend sends it to the
    node's agent as is."""

    job_id: str
    attempt: int
    rank: int
    queue: str
    argv: tuple[str, ...]
    env: Mapping[str, str]  # the job's own variables, then the allocator's (which win)
    workdir: str = ""  # the job's `workdir`: "" is its own folder; a relative path is inside it
    cpu_milli: int = 0
    memory: int = 0
    gpus: tuple[tuple[int, str], ...] = ()  # (index, UUID) of its GPUs on this node
    run_as: str | None = None  # the queue's mapped user, if an administrator set one
    resize_count: int = 0  # how many times the attempt was resized before this worker started


@dataclass(frozen=True, slots=True)
class Prepared:
    """A worker ready to be handed to its shim (see `shim.py` for what each field does)."""

    user: RunAs | None  # None: the control plane's own user
    env: dict[str, str]
    job_dir: str  # its default working folder, created (by its user) if missing
    cwd: str
    cgroup: list[str]  # [] when cgroups are not used
    limits: cg.Limits
    log_gid: int  # the log's group (the worker's user may read its own log); -1: unchanged
    private_tmp: str = ""  # the attempt's tmpfs on the host, bound on /tmp and /dev/shm ("": the host's own)
    hide_pids: bool = False  # a /proc that shows only the worker's user's processes

    def shim_fields(self) -> dict[str, Any]:
        user = self.user
        return {
            "user": None
            if user is None
            else {"name": user.name, "uid": user.uid, "gid": user.gid, "groups": list(user.groups)},
            "env": self.env,
            "job_dir": self.job_dir,
            "cwd": self.cwd,
            "cgroup": self.cgroup,
            "memory_limit": self.limits.memory,
            "log_gid": self.log_gid,
            "private_tmp": self.private_tmp,
            "hide_pids": self.hide_pids,
        }


@dataclass(frozen=True)
class IsolationReport:
    """What `up`, `nodes` and `/healthz` say about how jobs are isolated on a node."""

    users: str
    cgroups: str
    single_trust_domain: bool
    notes: tuple[str, ...] = ()


@dataclass
class Isolation:
    """How this node starts workers. Build it with `detect` (what the control plane uses) or `same_user`."""

    users: Users | None  # None: workers run as the control plane's user
    cgroups: cg.Cgroups = field(default_factory=lambda: cg.unavailable("not used"))
    pids_limit: int = DEFAULT_PIDS_LIMIT
    log_cap: int = DEFAULT_LOG_CAP
    lock_devices: bool = True
    own_reason: str = ""  # why workers run as the control plane's user
    # Each attempt its own /tmp and /dev/shm, and a /proc without other users' processes (`namespaces.py`);
    # `sandbox_gaps` says why either is off.
    private_tmp: bool = False
    hide_pids: bool = False
    sandbox_gaps: tuple[str, ...] = ()

    @classmethod
    def detect(
        cls,
        state_dir: Path,
        *,
        jobs_home: Path = DEFAULT_JOBS_HOME,
        data_dir: Path | None = None,
        use_cgroups: bool = True,
        pids_limit: int = DEFAULT_PIDS_LIMIT,
        log_cap: int = DEFAULT_LOG_CAP,
        sandbox: bool = True,
    ) -> Isolation:
        """Per-queue users when running as root, else the control plane's user; cgroups where writable."""
        root = os.geteuid() == 0
        users = Users(jobs_home, forbidden=data_dir) if root else None
        tag = hashlib.sha256(str(Path(state_dir).absolute()).encode()).hexdigest()[:8]
        groups = cg.detect(tag) if use_cgroups else cg.unavailable("turned off with --no-cgroups")
        reason = "" if root else f"the control plane runs as {RunAs.me().name}, not root, and cannot switch users"
        return cls(users, groups, pids_limit, log_cap, own_reason=reason)._sandboxed(sandbox)

    def _sandboxed(self, wanted: bool) -> Isolation:
        """Private /tmp, /dev/shm and /proc for every attempt where this node allows them (`sandbox` of
        `detect`: False where the administrator turned them off)."""
        from gpufleet.adapters.local import namespaces

        tmp_off, proc_off = namespaces.unavailable() if wanted else ("turned off with --shared-tmp",) * 2
        self.private_tmp, self.hide_pids = not tmp_off, not proc_off
        gaps = []
        if tmp_off:
            gaps.append(f"/tmp and /dev/shm are shared by every job on the node: {tmp_off}")
        if proc_off:
            gaps.append(f"every job can read every process's command line in /proc: {proc_off}")
        self.sandbox_gaps = tuple(gaps)
        return self

    @classmethod
    def same_user(cls, log_cap: int = DEFAULT_LOG_CAP, cgroups: cg.Cgroups | None = None) -> Isolation:
        """Workers run as this process's user (tests, and a single-user control plane)."""
        return cls(None, cgroups or cg.unavailable("not used"), log_cap=log_cap, own_reason="asked for")

    @property
    def switches_users(self) -> bool:
        return self.users is not None

    def check_run_as(self, name: str) -> None:
        """Whether queues may be mapped to user `name`; raises GpufleetError with a fix if not."""
        if self.users is None:
            raise GpufleetError(
                f"jobs cannot run as {name!r}: {self.own_reason or 'this executor does not switch users'}",
                "run gpufleet up as root to map queues to users",
            )
        check_mapped(name)

    def user_for(self, queue: str, run_as: str | None) -> RunAs | None:
        """The user a worker of `queue` runs as; None: the control plane's own. Raises GpufleetError."""
        return None if self.users is None else self.users.for_queue(queue, run_as)

    def prepare(self, spec: WorkerSpec, same_user_job_dir: Path) -> Prepared:
        """Resolve the worker's user, environment, folders and limits, and create its cgroup. Raises
        GpufleetError (a user that cannot be used) or OSError (a cgroup the kernel refused)."""
        user = self.user_for(spec.queue, spec.run_as)
        me = user or RunAs.me()
        if user is None:
            job_dir = str(same_user_job_dir)
        else:
            job_dir = os.path.join(user.home, JOBS_FOLDER, safe_name(spec.job_id))
            if not os.path.isdir(user.home) and not os.path.isabs(_expand_home(spec.workdir, user.home)):
                raise GpufleetError(
                    f"user {user.name}'s home folder {user.home} does not exist: its jobs' working folders go there",
                    f"create it (owned by {user.name}), or give the job an absolute workdir that user can write",
                )
        cwd = os.path.join(job_dir, _expand_home(spec.workdir, me.home)) if spec.workdir else job_dir
        limits = cg.Limits(
            memory=spec.memory,
            cpu_milli=spec.cpu_milli,
            pids=self.pids_limit,
            gpu_minors=frozenset(gpu_minors(spec.gpus)) if self.lock_devices else None,
        )
        folders: list[str] = []
        if self.cgroups.usable:
            generation = f".r{spec.resize_count}" if spec.resize_count > 0 else ""
            name = f"{safe_name(spec.job_id)}.{spec.attempt}.{spec.rank}{generation}"
            folders = self.cgroups.create(name, limits)
        return Prepared(
            user=user,
            env=worker_env(base_env(me.name, me.home), {}, spec.env),
            job_dir=job_dir,
            cwd=cwd,
            cgroup=folders,
            limits=limits,
            log_gid=user.gid if user is not None else -1,
            hide_pids=self.hide_pids,
        )

    def report(self, single_user_allowed: bool = False) -> IsolationReport:
        if self.users is not None:
            users = (
                "jobs run as their queue's own unprivileged user (gpufleet-<queue>, or the user set with "
                f"`quota set --run-as`), with homes under {self.users.jobs_home}"
            )
        else:
            me = RunAs.me().name
            users = f"every job runs as {me}, the control plane's own user ({self.own_reason})"
        if self.private_tmp:
            users += "; each attempt has a private /tmp and /dev/shm, removed when it ends"
        if self.hide_pids:
            users += "; a job sees only its own user's processes"
        notes: list[str] = list(self.sandbox_gaps)
        if self.users is None:
            notes.append(
                "one trust domain: any job can read the store, the tokens and every other job's logs; "
                + (
                    "team tokens are accepted (--single-user)"
                    if single_user_allowed
                    else "team tokens are refused (run up as root for per-queue users, or pass --single-user)"
                )
            )
        return IsolationReport(users, self.cgroups.describe(), self.users is None, tuple(notes))


def _expand_home(path: str, home: str) -> str:
    """`~` and `~/…` as the worker's user's home (not the control plane's)."""
    if path == "~" or path.startswith("~/"):
        return home + path[1:]
    return path


def gpu_minors(gpus: Sequence[tuple[int, str]], driver: str = "/proc/driver/nvidia/gpus") -> list[int]:
    """The /dev/nvidiaN minor of each GPU: the driver's own numbering where it runs (matched by UUID),
    otherwise the GPU's index (emulated GPUs, and the usual numbering)."""
    minors = _driver_minors(driver) if gpus else {}
    return [minors.get(uuid, index) for index, uuid in gpus]


def _driver_minors(driver: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for path in glob.glob(os.path.join(driver, "*", "information")):
        try:
            with open(path) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        uuid, minor = fields.get("GPU UUID", "").strip(), fields.get("Device Minor", "").strip()
        if uuid and minor.isdigit():
            found[uuid] = int(minor)
    return found


__all__ = ["Isolation", "IsolationReport", "Prepared", "WorkerSpec", "gpu_minors", "queue_user"]
