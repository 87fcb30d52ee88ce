"""Kernel-enforced limits per worker: one cgroup per worker with its memory, CPU, pids and device limits.

`detect()` looks once, at start, at what this machine offers and checks it by writing a probe cgroup:

- **cgroup v1** (a hierarchy per controller; what hybrid hosts use): `memory.limit_in_bytes` (and
  `memory.memsw.limit_in_bytes`, so swap does not stretch it), `cpu.cfs_quota_us` over a 100 ms period,
  `pids.max`, and the devices controller: every `/dev/nvidiaN` (character major 195) except the worker's own
  GPUs is denied; `nvidiactl` (195:255), `nvidia-modeset` (195:254) and `nvidia-uvm`/`nvidia-uvm-tools` (a
  major of their own) stay open. Other devices are left as they are: a job runs on the host's file system,
  and its user's permissions already keep it off disks and terminals.
- **cgroup v2** (one unified hierarchy): `memory.max` (`memory.swap.max` 0), `cpu.max`, `pids.max`, and
  `cgroup.kill` to stop everything at once. The v2 device controller is an eBPF program; gpufleet does not
  load one, so on v2 the GPU device lock is reported unavailable (CUDA_VISIBLE_DEVICES is then advice).
- **none** (not Linux, not root, a read-only `/sys/fs/cgroup`): the executor runs as before and says so.

Worker cgroups live under the control plane's own cgroup, in `gpufleet-<tag>/` (`tag` tells control planes
of different data folders apart). The shim joins, kills and removes them (`cgroup_ops.py`); this module
creates them.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufleet.adapters.local import cgroup_ops

CONTROLS = ("memory", "cpu", "pids", "devices")
NVIDIA_MAJOR = 195
NVIDIA_GPU_MINORS = range(254)  # 254: nvidia-modeset, 255: nvidiactl
CPU_PERIOD_US = 100_000
V2_DEVICES_NOTE = (
    "cgroup v2 locks devices with an eBPF program, which gpufleet does not load: CUDA_VISIBLE_DEVICES is "
    "advice, not a lock"
)


@dataclass(frozen=True, slots=True)
class Limits:
    """What one worker may use. 0 means no limit; `gpu_minors` None leaves devices alone (no lock)."""

    memory: int = 0  # bytes
    cpu_milli: int = 0  # 1000 = one core's worth of CPU time
    pids: int = 0  # processes and threads together
    gpu_minors: frozenset[int] | None = None  # the /dev/nvidiaN the worker may open


@dataclass(frozen=True)
class Cgroups:
    """The cgroups this executor may use: which version, the base folder per controller, which limits work
    (`controls`), and why the others do not (`missing`)."""

    version: str | None  # "v1", "v2", or None: none usable
    bases: dict[str, str] = field(default_factory=dict)  # controller -> base folder ("" for v2's one folder)
    controls: frozenset[str] = frozenset()
    missing: dict[str, str] = field(default_factory=dict)  # limit -> why it is not enforced

    @property
    def usable(self) -> bool:
        return self.version is not None

    def folders_for(self, name: str) -> list[str]:
        """Where worker `name`'s cgroup is (one folder per hierarchy)."""
        return [os.path.join(base, name) for base in dict.fromkeys(self.bases.values())]

    def create(self, name: str, limits: Limits) -> list[str]:
        """Create worker `name`'s cgroup with `limits`; return its folders (for the shim to join). A cgroup
        of that name left behind (a crash between create and start) is reused. Raises OSError."""
        try:
            return self._create(name, limits)
        except FileNotFoundError:
            # A base folder is gone: something removed it while it was empty (an administrator, a tool that
            # clears empty cgroups). Make it again, once, rather than fail every worker from now on.
            self._restore_bases()
            return self._create(name, limits)

    def _restore_bases(self) -> None:
        for base in dict.fromkeys(self.bases.values()):
            _mkdir(base)
            if self.version == "v2":
                _enable(base, self.controls)

    def _create(self, name: str, limits: Limits) -> list[str]:
        folders: list[str] = []
        try:
            if self.version == "v2":
                folder = os.path.join(self.bases[""], name)
                _mkdir(folder)
                folders.append(folder)
                _limit_v2(folder, limits, self.controls)
            else:
                for controller in self.bases:
                    folder = os.path.join(self.bases[controller], name)
                    if folder not in folders:
                        _mkdir(folder)
                        folders.append(folder)
                    _limit_v1(controller, folder, limits)
        except OSError:
            cgroup_ops.remove(folders)
            raise
        return folders

    def cap_all(self, memory: int, pids: int) -> dict[str, str]:
        """Cap every worker of this executor together (the base folders that hold their cgroups) at `memory`
        bytes and `pids` processes and threads (0: no cap), so that what each worker's own limit allows adds
        up to no more than the node keeps for jobs. Returns limit -> why it could not be set (empty: both
        set); what was set before stays."""
        failed: dict[str, str] = {}
        for control, value in (("memory", memory), ("pids", pids)):
            if value <= 0 or control not in self.controls:
                continue
            base = self.bases["" if self.version == "v2" else control]
            try:
                if self.version == "v2":
                    _limit_v2(base, Limits(**{control: value}), self.controls)  # type: ignore[arg-type]
                elif control == "memory":
                    _cap_memory_v1(base, value)
                else:
                    _write(base, "pids.max", str(value))
            except OSError as error:
                failed[control] = f"cannot write {error.filename or base}: {error.strerror}"
        return failed

    def release(self) -> None:
        """Remove the base folders if they are empty (no worker left running in them)."""
        cgroup_ops.remove(list(dict.fromkeys(self.bases.values())))

    def describe(self) -> str:
        """One line for `up`, `nodes` and `/healthz`."""
        if self.version is None:
            why = self.missing.get("cgroups", "not available")
            return (
                f"cgroups unavailable ({why}): no memory, CPU, pids or GPU device limits per worker, and a job's "
                "processes that leave its process group survive a stop"
            )
        enforced = ", ".join(c if c != "devices" else "GPU devices" for c in CONTROLS if c in self.controls)
        text = f"cgroups {self.version}: {enforced or 'no'} limits per worker; every stop kills the whole cgroup"
        for control in CONTROLS:
            if control in self.missing:
                text += f"; no {control if control != 'devices' else 'GPU device'} lock: {self.missing[control]}"
        return text


def unavailable(reason: str) -> Cgroups:
    return Cgroups(None, missing={"cgroups": reason})


def detect(tag: str, *, mountinfo: str = "/proc/self/mountinfo", membership: str = "/proc/self/cgroup") -> Cgroups:
    """The cgroups this process can give its workers, checked with a probe cgroup. Never raises."""
    if os.geteuid() != 0:
        return unavailable("the control plane is not root")
    try:
        mounts = _mounts(mountinfo)
        own = _own_paths(membership)
    except OSError as error:
        return unavailable(f"cannot read {error.filename}: {error.strerror}")
    v1 = {c: m for c, m in mounts.items() if c in CONTROLS}
    if v1:
        return _setup_v1(tag, v1, own)
    if "" in mounts:
        return _setup_v2(tag, mounts[""], own.get("", "/"))
    return unavailable("no cgroup file system is mounted")


def at_v2(folder: str) -> Cgroups:
    """A v2 hierarchy rooted at `folder` (created if missing), with the controllers enabled there."""
    _mkdir(folder)
    controls = _v2_controls(folder)
    missing = {c: "the kernel offers no v2 controller for it" for c in ("memory", "cpu", "pids") if c not in controls}
    missing["devices"] = V2_DEVICES_NOTE
    return Cgroups("v2", {"": folder}, frozenset(controls), missing)


# --- detection --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Mount:
    point: str
    root: str


def _mounts(mountinfo: str) -> dict[str, _Mount]:
    """Controller -> its v1 mount; "" -> the v2 mount."""
    found: dict[str, _Mount] = {}
    with open(mountinfo) as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fields, extra = head.split(), tail.split()
            if len(fields) < 5 or len(extra) < 3:
                continue
            root, point, kind = _unescape(fields[3]), _unescape(fields[4]), extra[0]
            if kind == "cgroup2":
                found.setdefault("", _Mount(point, root))
            elif kind == "cgroup":
                for option in extra[2].split(","):
                    if option in CONTROLS:
                        found.setdefault(option, _Mount(point, root))
    return found


def _unescape(text: str) -> str:
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _own_paths(membership: str) -> dict[str, str]:
    """Controller -> this process's cgroup path in that hierarchy ("" for v2)."""
    paths: dict[str, str] = {}
    with open(membership) as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _folder(mount: _Mount, path: str) -> str:
    relative = path[len(mount.root) :] if path.startswith(mount.root) else path
    return os.path.join(mount.point, relative.lstrip("/"))


def _setup_v1(tag: str, mounts: dict[str, _Mount], own: dict[str, str]) -> Cgroups:
    bases: dict[str, str] = {}
    missing: dict[str, str] = {}
    probe = Limits(memory=1 << 30, cpu_milli=1000, pids=64, gpu_minors=frozenset({0}))
    for controller in CONTROLS:
        mount = mounts.get(controller)
        if mount is None:
            missing[controller] = "its cgroup v1 controller is not mounted"
            continue
        base = os.path.join(_folder(mount, own.get(controller, "/")), f"gpufleet-{tag}")
        folder = os.path.join(base, f"probe-{os.getpid()}")
        try:
            _mkdir(base)
            _mkdir(folder)
            try:
                _limit_v1(controller, folder, probe)
            finally:
                os.rmdir(folder)
        except OSError as error:
            missing[controller] = f"cannot write {error.filename or folder}: {error.strerror}"
            continue
        bases[controller] = base
    if not bases:
        return Cgroups(None, missing={"cgroups": "; ".join(f"{c}: {why}" for c, why in missing.items()), **missing})
    return Cgroups("v1", bases, frozenset(bases), missing)


def _setup_v2(tag: str, mount: _Mount, own: str) -> Cgroups:
    parent = _folder(mount, own)
    base = os.path.join(parent, f"gpufleet-{tag}")
    try:
        _delegate(parent)
        groups = at_v2(base)
        _enable(base, groups.controls)
        probe = groups.create(f"probe-{os.getpid()}", Limits(memory=1 << 30, cpu_milli=1000, pids=64))
        cgroup_ops.remove(probe)
    except OSError as error:
        return unavailable(f"cannot write {error.filename or base}: {error.strerror}")
    return groups


def _delegate(parent: str) -> None:
    """Let cgroups under `parent` have the memory, cpu and pids controllers. v2 allows that only on a cgroup
    without processes of its own (or the root), so the control plane first moves itself into a leaf."""
    wanted = _v2_controls(parent)
    if not wanted:
        return
    try:
        _enable(parent, wanted)
    except OSError as error:
        if error.errno != errno.EBUSY:
            raise
        leaf = os.path.join(parent, "gpufleet-control-plane")
        _mkdir(leaf)
        cgroup_ops.join([leaf], os.getpid())
        _enable(parent, wanted)


def _v2_controls(folder: str) -> set[str]:
    try:
        with open(os.path.join(folder, "cgroup.controllers")) as f:
            return {c for c in f.read().split() if c in ("memory", "cpu", "pids")}
    except OSError:
        return set()


def _enable(folder: str, controls: Iterable[str]) -> None:
    wanted = " ".join(f"+{c}" for c in sorted(controls))
    if wanted:
        _write(folder, "cgroup.subtree_control", wanted)


# --- limits -----------------------------------------------------------------------------------------------


def _limit_v1(controller: str, folder: str, limits: Limits) -> None:
    if controller == "memory" and limits.memory > 0:
        _write(folder, "memory.limit_in_bytes", str(limits.memory))
        if os.path.exists(os.path.join(folder, "memory.memsw.limit_in_bytes")):
            _write(folder, "memory.memsw.limit_in_bytes", str(limits.memory))
    elif controller == "cpu" and limits.cpu_milli > 0:
        _write(folder, "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(folder, "cpu.cfs_quota_us", str(max(1000, limits.cpu_milli * CPU_PERIOD_US // 1000)))
    elif controller == "pids" and limits.pids > 0:
        _write(folder, "pids.max", str(limits.pids))
    elif controller == "devices" and limits.gpu_minors is not None:
        denied = [f"c {NVIDIA_MAJOR}:{minor} rwm" for minor in NVIDIA_GPU_MINORS if minor not in limits.gpu_minors]
        _write_each(os.path.join(folder, "devices.deny"), denied)


def _cap_memory_v1(folder: str, limit: int) -> None:
    """memory.memsw.limit_in_bytes may never be below memory.limit_in_bytes: lowering both writes the memory
    limit first, raising them the memory-and-swap limit first."""
    names = ["memory.limit_in_bytes"]
    if os.path.exists(os.path.join(folder, "memory.memsw.limit_in_bytes")):
        names.append("memory.memsw.limit_in_bytes")
    try:
        for name in names:
            _write(folder, name, str(limit))
    except OSError as error:
        if error.errno != errno.EINVAL or len(names) == 1:
            raise
        for name in reversed(names):
            _write(folder, name, str(limit))


def _limit_v2(folder: str, limits: Limits, controls: frozenset[str]) -> None:
    if "memory" in controls and limits.memory > 0:
        _write(folder, "memory.max", str(limits.memory))
        if os.path.exists(os.path.join(folder, "memory.swap.max")):
            _write(folder, "memory.swap.max", "0")
    if "cpu" in controls and limits.cpu_milli > 0:
        _write(folder, "cpu.max", f"{max(1000, limits.cpu_milli * CPU_PERIOD_US // 1000)} {CPU_PERIOD_US}")
    if "pids" in controls and limits.pids > 0:
        _write(folder, "pids.max", str(limits.pids))


def _mkdir(folder: str) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o755)


def _write(folder: str, name: str, value: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(value)


def _write_each(path: str, lines: list[str]) -> None:
    """One write per rule on one open file: the kernel takes each write as one rule."""
    fd = os.open(path, os.O_WRONLY)
    try:
        for line in lines:
            os.write(fd, line.encode())
    finally:
        os.close(fd)
