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
import pwd
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.adapters.local import cgroups as cg
from gpufleet.adapters.local import host_limits
from gpufleet.adapters.local.disk_quota import DiskQuotas
from gpufleet.adapters.local.firewall import EngineFirewall
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
    # What the node needs for a worker that gave no `memory` (`host_limits.default_memory`), and its queue's
    # disk quota (`disk_quota.py`; None: the node's default).
    gpu_milli: int = 0  # the GPUs it holds, in thousandths
    node_gpus: int = 0
    node_memory: int = 0  # what the inventory says the node has (0: not said)
    memory_per_gpu: int | None = None
    memory_no_gpu: int | None = None
    disk: int | None = None


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
    disk_quota: str = ""  # the folder its queue's disk quota covers ("": none)
    disk_quota_size: int = 0
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
            "disk_quota": self.disk_quota,
            "disk_quota_size": self.disk_quota_size,
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
    host: host_limits.HostBudget | None = None  # None: no default memory limit, no cap on all jobs together
    disk_quotas: DiskQuotas | None = None  # None: no disk quota per queue
    cap_problems: dict[str, str] = field(default_factory=dict)  # the caps on all jobs that could not be set
    # Where an engine (Ray) runs beside the jobs: every job user is shut out of its ports before it runs.
    firewall: EngineFirewall | None = None

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
        host: host_limits.HostBudget | None = None,
        memory_reserve: int | None = None,
        pids_reserve: int | None = None,
        queue_disk: int = 0,
        sandbox: bool = True,
    ) -> Isolation:
        """Per-queue users when running as root, else the control plane's user; cgroups where writable.
        `host`: the node's budget (default: this machine's, keeping `memory_reserve` bytes and `pids_reserve`
        processes, None: the default reserves); every job together is capped at the rest. `queue_disk`: the
        disk quota of a queue whose administrator set none (0: none; root only). Raises GpufleetError."""
        root = os.geteuid() == 0
        users = Users(jobs_home, forbidden=data_dir) if root else None
        quotas = DiskQuotas(users.jobs_home, queue_disk) if users is not None else None
        if users is not None and quotas is not None:
            users.carry = quotas.carry
        tag = hashlib.sha256(str(Path(state_dir).absolute()).encode()).hexdigest()[:8]
        groups = cg.detect(tag) if use_cgroups else cg.unavailable("turned off with --no-cgroups")
        reason = "" if root else f"the control plane runs as {RunAs.me().name}, not root, and cannot switch users"
        budget = host or host_limits.detect(memory_reserve=memory_reserve, pids_reserve=pids_reserve)
        problems = groups.cap_all(budget.job_memory, budget.job_pids) if groups.usable else {}
        if quotas is not None and users is not None:
            for problem in quotas.remount(users.made_here()):
                problems[f"disk quota ({problem})"] = "left unmounted"
        per_worker = min(pids_limit, budget.job_pids)
        return cls(users, groups, per_worker, log_cap, own_reason=reason, host=budget, disk_quotas=quotas,
                   cap_problems=problems)._sandboxed(sandbox)  # fmt: skip

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
        if user is not None and self.firewall is not None:
            self.firewall.add_uid(user.uid)  # before the worker exists: it never has a route to the engine
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
        quota: tuple[str, int] | None = None
        if user is not None and self.disk_quotas is not None:
            quota = self.disk_quotas.ensure(user, spec.disk)
        limits = cg.Limits(
            memory=spec.memory or self.default_memory(spec),
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
            disk_quota=quota[0] if quota else "",
            disk_quota_size=quota[1] if quota else 0,
        )

    def settle_homes(self, queues: Sequence[tuple[str, str | None]]) -> None:
        """Move the homes of these queues' own users (queue name, mapped user) to the jobs' home this start was
        given, before any of their jobs starts (the other queues' users move at their first job: `Users`).
        Raises GpufleetError with a fix when one cannot move now."""
        if self.users is not None:
            self.users.check_homes([name for name, run_as in queues if run_as is None])

    def default_memory(self, spec: WorkerSpec) -> int:
        """The memory limit of a worker whose job gave none (0: no limit: the node's memory is not known)."""
        if self.host is None:
            return 0
        return host_limits.default_memory(
            self.host,
            gpu_milli=spec.gpu_milli,
            node_gpus=spec.node_gpus,
            node_memory=spec.node_memory,
            per_gpu=spec.memory_per_gpu,
            no_gpu=spec.memory_no_gpu,
        )

    def check_queue_disk(self, queue: str, run_as: str | None, size: int | None) -> None:
        """Whether the queue's disk quota may become `size` (None: the default); applied now where it can be.
        Raises GpufleetError with a fix (its files take more already)."""
        if self.disk_quotas is None or self.users is None:
            return
        try:
            pwd.getpwnam(run_as or queue_user(queue))
        except KeyError:
            return  # no job of the queue ran here yet: its quota is made with its first
        self.disk_quotas.check(self.users.for_queue(queue, run_as), size)

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
        limits = self.cgroups.describe()
        if self.host is not None and self.cgroups.usable:
            limits += f"; {self.host.describe()}; a job without `memory` gets its share per GPU held"
        if self.disk_quotas is not None:
            limits += f"; disk: {self.disk_quotas.describe()}"
            mounted = self.disk_quotas.made()
            if mounted:
                limits += f" ({len(mounted)} made: {', '.join(mounted[:8])}{', …' if len(mounted) > 8 else ''})"
        if self.firewall is not None:
            notes.append(f"engine firewall: {self.firewall.describe()}")
        for what, why in self.cap_problems.items():
            notes.append(f"not enforced: {what}: {why}")
        return IsolationReport(users, limits, self.users is None, tuple(notes))


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
