"""Which OS user a worker runs as: the queue's own unprivileged user, or the one an administrator mapped.

When the control plane runs as root, every queue's jobs run as a user of their own, never as the control
plane's: `gpufleet-<queue>`, a system user (no password, no login shell) created on first use with its home
folder under the jobs' home (`/var/lib/gpufleet-jobs/<user>` by default, never inside the data folder), or
the user `gpufleet quota set QUEUE --run-as USER` names. A job of one queue then cannot read another
queue's files, logs or processes, nor the control plane's store, tokens or configuration.

Queue names may hold upper-case letters and dots and be 63 characters long; user names may not: a queue
whose name is not already a plain user name gets `gpufleet-<start>-<hash>` (deterministic, distinct).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pwd
import re
import shutil
import stat
import subprocess
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.domain.errors import GpufleetError

PREFIX = "gpufleet-"
MAX_NAME = 32  # useradd's limit
DEFAULT_JOBS_HOME = Path("/var/lib/gpufleet-jobs")
COMMENT = "gpufleet jobs of queue"  # how the users gpufleet created are told from others
_PLAIN = re.compile(r"[a-z0-9_][a-z0-9_-]*")
log = logging.getLogger(__name__)
NOLOGIN = next((s for s in ("/usr/sbin/nologin", "/sbin/nologin") if os.path.exists(s)), "/bin/false")


@dataclass(frozen=True, slots=True)
class RunAs:
    """An OS user a worker runs as."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...] = ()  # supplementary groups (the user's, from /etc/group)

    @classmethod
    def of(cls, entry: pwd.struct_passwd) -> RunAs:
        groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid)) - {entry.pw_gid}))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, groups)

    @classmethod
    def me(cls) -> RunAs:
        """The control plane's own user (a single-user control plane runs jobs as itself)."""
        uid = os.geteuid()
        try:
            return cls.of(pwd.getpwuid(uid))
        except KeyError:
            return cls(str(uid), uid, os.getegid(), os.environ.get("HOME", "/"))


def queue_user(queue: str) -> str:
    """The OS user of a queue without a mapped one: `gpufleet-<queue>` when that is a valid user name,
    otherwise a shortened lower-case name with a hash of the queue's name (two queues never share one)."""
    plain = PREFIX + queue
    if _PLAIN.fullmatch(queue) and len(plain) <= MAX_NAME:
        return plain
    digest = hashlib.sha256(queue.encode()).hexdigest()[:8]
    start = re.sub(r"[^a-z0-9_-]", "-", queue.lower())[: MAX_NAME - len(PREFIX) - len(digest) - 1].strip("-")
    return f"{PREFIX}{start}-{digest}" if start else f"{PREFIX}{digest}"


class Users:
    """Resolves (and creates, for queues without a mapping) the user a queue's workers run as. Root only."""

    def __init__(self, jobs_home: Path = DEFAULT_JOBS_HOME, forbidden: Path | None = None) -> None:
        """`forbidden`: a folder homes may not be inside (the data folder, private to the control plane)."""
        self.jobs_home = Path(jobs_home)
        if forbidden is not None and _inside(self.jobs_home, forbidden):
            raise GpufleetError(
                f"the jobs' home folder {self.jobs_home} is inside the data folder {forbidden}, out of jobs' reach",
                "give --jobs-home a folder outside the data folder, e.g. /var/lib/gpufleet-jobs",
            )
        self._lock = threading.Lock()
        # What else goes with a home that moves (user, old home, new home): its disk quota (`disk_quota.py`).
        self.carry: Callable[[str, Path, Path], None] | None = None

    def for_queue(self, queue: str, run_as: str | None) -> RunAs:
        """The user for a worker of `queue`: the mapped `run_as`, else the queue's own (created on first use).
        Raises GpufleetError with a fix when that user cannot be used."""
        if run_as is not None:
            return check_mapped(run_as)
        name = queue_user(queue)
        with self._lock:
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                entry = self._create(name, queue)
            if entry.pw_gecos.startswith(COMMENT) and not _inside(Path(entry.pw_dir), self.jobs_home):
                entry = self._rehome(entry)  # made by an earlier start with another --jobs-home
            if entry.pw_uid == 0:
                raise GpufleetError(f"user {name} has uid 0", f"remove it (userdel {name}); gpufleet creates it again")
            self._ensure_home(entry)
        return RunAs.of(entry)

    def _create(self, name: str, queue: str) -> pwd.struct_passwd:
        useradd = shutil.which("useradd", path="/usr/sbin:/sbin:/usr/bin:/bin")
        if useradd is None:
            raise GpufleetError(
                f"cannot create user {name} for queue {queue!r}: useradd is not installed",
                "install it (Debian: the passwd package), or map the queue to an existing user with "
                f"`gpufleet quota set {queue} --run-as USER`",
            )
        self.jobs_home.mkdir(parents=True, exist_ok=True)
        os.chmod(self.jobs_home, 0o755)  # each user reaches its own home, never another's (those are 0700)
        command = [
            useradd, "--system", "--user-group", "--no-create-home", "--home-dir", str(self.jobs_home / name),
            "--shell", NOLOGIN, "--comment", f"{COMMENT} {queue}", name,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False, env={"PATH": "/usr/sbin:/usr/bin"})
        try:
            return pwd.getpwnam(name)  # another control plane may have created it meanwhile: fine
        except KeyError:
            why = done.stderr.strip() or f"useradd exited {done.returncode}"
            raise GpufleetError(
                f"cannot create user {name} for queue {queue!r}: {why}",
                f"create it yourself (useradd --system {name}), or map the queue with "
                f"`gpufleet quota set {queue} --run-as USER`",
            ) from None

    def made_here(self) -> list[RunAs]:
        """The queue users gpufleet made whose homes are under this jobs' home."""
        return [
            RunAs.of(entry)
            for entry in pwd.getpwall()
            if entry.pw_gecos.startswith(COMMENT) and _inside(Path(entry.pw_dir), self.jobs_home)
        ]

    def check_homes(self, queues: Iterable[str]) -> None:
        """Move the homes of `queues`' users that gpufleet made under another jobs' home (an earlier start
        with another `--jobs-home`) here, files and all, so that no job runs in the old one. Raises
        GpufleetError with a fix when a home cannot move: a process of its user runs (a job adopted from the
        earlier start), or the new home is taken."""
        for queue in queues:
            try:
                entry = pwd.getpwnam(queue_user(queue))
            except KeyError:
                continue
            if entry.pw_gecos.startswith(COMMENT) and not _inside(Path(entry.pw_dir), self.jobs_home):
                with self._lock:
                    self._rehome(entry)

    def _rehome(self, entry: pwd.struct_passwd) -> pwd.struct_passwd:
        """Move `entry`'s home here (usermod --move-home), `carry` first. Raises GpufleetError with a fix when it
        cannot."""
        old, new = Path(entry.pw_dir), self.jobs_home / entry.pw_name
        keep = f"start gpufleet up with --jobs-home {old.parent} until they end"
        busy = processes_of(entry.pw_uid)
        if busy:
            raise GpufleetError(
                f"--jobs-home {self.jobs_home}: the home of {entry.pw_name} is {old}, and it cannot move while its "
                f"processes run ({len(busy)}, pid {busy[0]} among them: jobs of an earlier start, or of another "
                "control plane)",
                f"{keep}, or cancel them (gpufleet cancel), then start again with the new --jobs-home",
            )
        with contextlib.suppress(OSError):
            new.rmdir()  # an empty home made meanwhile: usermod moves into a folder that is not there
        if new.exists():
            raise GpufleetError(
                f"--jobs-home {self.jobs_home}: {entry.pw_name}'s home is {old}, and {new} exists already",
                f"move {new} aside (it is not {entry.pw_name}'s home), or {keep}",
            )
        usermod = shutil.which("usermod", path="/usr/sbin:/sbin:/usr/bin:/bin")
        if usermod is None:
            raise GpufleetError(
                f"--jobs-home {self.jobs_home}: {entry.pw_name}'s home is {old} and usermod is not installed",
                f"install it (Debian: the passwd package), or {keep}",
            )
        self.jobs_home.mkdir(parents=True, exist_ok=True)
        os.chmod(self.jobs_home, 0o755)
        if self.carry is not None:
            self.carry(entry.pw_name, old, new)
        move = ["--move-home"] if old.is_dir() else []
        done = subprocess.run(
            [usermod, "--home", str(new), *move, entry.pw_name], capture_output=True, text=True, check=False
        )
        moved = pwd.getpwnam(entry.pw_name)
        if done.returncode != 0 or Path(moved.pw_dir) != new:
            why = done.stderr.strip() or f"usermod exited {done.returncode}"
            raise GpufleetError(f"cannot move {entry.pw_name}'s home from {old} to {new}: {why}", keep)
        log.info("moved the home of %s from %s to %s (--jobs-home)", entry.pw_name, old, new)
        return moved

    def _ensure_home(self, entry: pwd.struct_passwd) -> None:
        """A home of our users exists, is theirs, and is private (it may have been removed by hand)."""
        home = Path(entry.pw_dir)
        if not _inside(home, self.jobs_home):
            return  # a user we did not create: its home is its administrator's business
        if not home.is_dir():
            self.jobs_home.mkdir(parents=True, exist_ok=True)
            home.mkdir(mode=0o700, exist_ok=True)
            os.chown(home, entry.pw_uid, entry.pw_gid)
            return
        stale = home.lstat()
        if stale.st_uid != entry.pw_uid:
            # The user was removed and made again with another uid (or the home restored from elsewhere): every
            # job would fail on its own working folder with "Permission denied" until the files are its again.
            log.warning(
                "home folder %s of %s belongs to uid %d, not to its user's uid %d: giving it back to %s",
                home, entry.pw_name, stale.st_uid, entry.pw_uid, entry.pw_name,
            )  # fmt: skip
            _reown(home, stale.st_uid, stale.st_gid, entry)


def _reown(home: Path, old_uid: int, old_gid: int, entry: pwd.struct_passwd) -> None:
    """Give what the old owner of `home` owned in it to `entry`. Links are not followed, other file systems
    not entered, and a file with more than one name is left alone: a hard link the old owner made to a file
    elsewhere must not change hands with the home."""
    device = home.lstat().st_dev
    for folder, folders, files in os.walk(home, followlinks=False):
        folders[:] = [name for name in folders if os.lstat(os.path.join(folder, name)).st_dev == device]
        for path in (folder, *(os.path.join(folder, name) for name in files)):
            info = os.lstat(path)
            if info.st_uid != old_uid or (stat.S_ISREG(info.st_mode) and info.st_nlink > 1):
                continue
            os.lchown(path, entry.pw_uid, entry.pw_gid if info.st_gid == old_gid else -1)


def processes_of(uid: int) -> list[int]:
    """Processes running as `uid`, by their real or effective uid (/proc/PID/status: a process that is not
    dumpable has a /proc folder of root's whoever it runs as)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{name}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    if uid in {int(field) for field in line.split()[1:3]}:
                        found.append(int(name))
                    break
    return sorted(found)


def check_mapped(name: str) -> RunAs:
    """A user an administrator mapped a queue to: it must exist and be neither root nor the control plane's."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise GpufleetError(
            f"user {name!r} does not exist on this machine", f"create it first (useradd {name}), or map another user"
        ) from None
    if entry.pw_uid == 0 or entry.pw_uid == os.geteuid():
        whose = "root's" if entry.pw_uid == 0 else "the control plane's"
        raise GpufleetError(
            f"user {name!r} has {whose} uid {entry.pw_uid}: its jobs could read every team's data and tokens",
            "map the queue to an unprivileged user of its own, or leave --run-as out (gpufleet then creates one)",
        )
    return RunAs.of(entry)


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.absolute(), folder.absolute()
    return path == folder or folder in path.parents
