"""A disk quota per queue: what its jobs keep on a node (working folders, checkpoints, anything in their
user's home) lives on a file system of the size an administrator set, so a job past it gets ENOSPC on its
own write while the node's disk, the control plane's store and every other queue keep their room.

The mechanism is the kernel's own and needs no quota support from the node's file system (the usual ext4
data disk has no project quotas): per queue user, a sparse image file `<jobs home>/.gpufleet-disk/<user>.img`
with an ext4 file system (no blocks reserved for root), loop-mounted `nosuid,nodev` on the user's home (a
user gpufleet created, whose home is under the jobs' home) or on `<home>/gpufleet-jobs` (a user an
administrator mapped, whose home is theirs). It is made on the queue's first job, mounted again after a
restart or a reboot, grown in place (`resize2fs` on the mounted file system) when the administrator raises
the quota, and shrunk when it is lowered: refused when the queue's files already take more, otherwise done
when none of its jobs runs (ext4 shrinks only unmounted).

The image is sparse: it takes on the node's disk what the queue's files take, up to its size. Quotas that
add up to more than the disk's free space are allowed (as any overcommit is), and `describe` says when they
do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gpufleet.adapters.local.users import RunAs, processes_of
from gpufleet.domain.errors import GpufleetError

log = logging.getLogger(__name__)
IMAGES = ".gpufleet-disk"
LOGS = ".gpufleet-logs"  # on a quota file system: the queue's jobs' logs (root's)
JOBS_FOLDER = "gpufleet-jobs"
MIN_SIZE = 8 << 20  # ext4 with a journal needs a few MiB for itself
_SBIN = "/usr/sbin:/sbin:/usr/bin:/bin"


@dataclass(frozen=True, slots=True)
class Usage:
    user: str
    folder: str
    size: int  # bytes the file system offers its files
    used: int


class DiskQuotas:
    """The quota file systems of the queue users of one jobs' home. Root only."""

    def __init__(self, jobs_home: Path, default: int = 0) -> None:
        """`default`: the quota of a queue whose administrator set none (0: such queues have no quota)."""
        self.jobs_home = Path(jobs_home)
        self.images = self.jobs_home / IMAGES
        self.default = default
        self._lock = threading.Lock()

    def target(self, user: RunAs) -> str:
        """The folder the user's quota covers: its whole home when gpufleet made it, else its jobs' folder."""
        home = Path(user.home).absolute()
        inside = self.jobs_home.absolute() in home.parents
        return str(home if inside else home / JOBS_FOLDER)

    def ensure(self, user: RunAs, size: int | None) -> tuple[str, int] | None:
        """Make sure the user's quota file system is mounted with `size` bytes (None: the default); returns its
        folder and size (None: no quota). Raises GpufleetError with a fix when it cannot be made."""
        size = self.default if size is None else size
        if size <= 0:
            return None
        size = max(MIN_SIZE, size)
        with self._lock:
            target = self.target(user)
            image = self.images / f"{user.name}.img"
            if not image.exists():
                self._make(image, size)
            elif image.stat().st_size != size and not _mounted(target) and not _attached(image):
                self._resize_offline(user, image, size)
            if not _mounted(target):
                self._mount(user, image, target)
            elif image.stat().st_size < size:
                # Online where the kernel lets us (CAP_SYS_RESOURCE), else while none of its jobs runs.
                if not self._grow(image, target, size) and self._unmount_if_idle(user, image, target):
                    self._resize_offline(user, image, size)
                    self._mount(user, image, target)
            elif image.stat().st_size > size and self._unmount_if_idle(user, image, target):
                self._resize_offline(user, image, size)
                self._mount(user, image, target)
            return target, image.stat().st_size

    def check(self, user: RunAs, size: int | None) -> None:
        """Refuse a new quota below what the user's files take now; apply it when it can be at once."""
        size = self.default if size is None else size
        found = self.usage(user)
        if found is None or size <= 0:
            return
        if found.used > _usable(size):
            raise GpufleetError(
                f"the jobs of {user.name} keep {_words(found.used)} in {found.folder}, more than the new disk "
                f"quota of {_words(size)}",
                f"remove files from {found.folder} first, or give a quota of at least {_words(found.used * 5 // 4)}",
            )
        self.ensure(user, size)

    def usage(self, user: RunAs) -> Usage | None:
        """The user's quota and what its files take (None: no quota file system mounted)."""
        target = self.target(user)
        if not _mounted(target):
            return None
        stat = os.statvfs(target)
        return Usage(user.name, target, stat.f_blocks * stat.f_frsize, (stat.f_blocks - stat.f_bfree) * stat.f_frsize)

    def remount(self, users: list[RunAs]) -> list[str]:
        """Mount again, after a restart or a reboot, the quota file systems of `users` that have one; returns
        the problems met (one line each)."""
        problems = []
        for user in users:
            image = self.images / f"{user.name}.img"
            if not image.exists():
                continue
            try:
                with self._lock:
                    target = self.target(user)
                    if not _mounted(target):
                        self._mount(user, image, target)
            except GpufleetError as error:
                problems.append(error.message)
        return problems

    def made(self) -> list[str]:
        """The users that have a quota image."""
        if not self.images.is_dir():
            return []
        return sorted(p.name.removesuffix(".img") for p in self.images.glob("*.img"))

    def describe(self) -> str:
        if self.default <= 0:
            base = "no disk quota unless a queue's administrator sets one (quota set QUEUE --disk SIZE)"
        else:
            base = f"each queue's jobs keep at most {_words(self.default)} on disk unless its quota says otherwise"
        return f"{base}; enforced by a loop-mounted ext4 file system per queue user (images in {self.images})"

    # --- the file systems ------------------------------------------------------------------------------------

    def carry(self, user: str, old: Path, new: Path) -> None:
        """A home moves from `old` to `new` (another --jobs-home): its quota file system goes with it, unmounted
        (the next job mounts it on the new home)."""
        image = old.parent / IMAGES / f"{user}.img"
        if not image.exists():
            return
        if _mounted(str(old)) and _run("umount", str(old)).returncode != 0:
            raise GpufleetError(f"cannot unmount {user}'s disk quota from {old}", f"unmount it (umount {old})")
        self.images.mkdir(parents=True, exist_ok=True)
        os.chmod(self.images, 0o700)
        shutil.move(str(image), str(self.images / image.name))

    def _make(self, image: Path, size: int) -> None:
        self.images.mkdir(parents=True, exist_ok=True)
        os.chmod(self.images, 0o700)  # no job reads another queue's files through its image
        with open(image, "wb") as f:
            f.truncate(size)
        os.chmod(image, 0o600)
        done = _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "root_owner=0:0", str(image))
        if done.returncode != 0:
            image.unlink(missing_ok=True)
            raise GpufleetError(
                f"cannot make the disk quota's file system {image}: {_why(done)}",
                "install e2fsprogs (mkfs.ext4), or run `gpufleet up --queue-disk 0` to go without disk quotas",
            )

    def _mount(self, user: RunAs, image: Path, target: str) -> None:
        folder = Path(target)
        folder.mkdir(parents=True, exist_ok=True)
        kept = [p for p in folder.iterdir() if p.name != "lost+found"] if folder.is_dir() else []
        if kept:
            self._move_in(user, image, folder)
        # The loop device the image is already attached to, if any (a job's mount namespace holds a copy of the
        # mount): two loop devices on one image would be two file systems writing the same blocks.
        device = _attached(image)
        if device:
            done = _run("mount", "-o", "nosuid,nodev", device, target)
        else:
            done = _run("mount", "-o", "loop,nosuid,nodev", str(image), target)
        if done.returncode != 0:
            raise GpufleetError(
                f"cannot mount the disk quota of {user.name} on {target}: {_why(done)}",
                "check that this kernel has loop devices (modprobe loop), or run `gpufleet up --queue-disk 0`",
            )
        os.chown(target, user.uid, user.gid)
        os.chmod(target, 0o700)

    def _move_in(self, user: RunAs, image: Path, folder: Path) -> None:
        """Files already in the folder (made before the quota) go onto the new file system, or the quota waits."""
        busy = processes_of(user.uid)
        if busy:
            raise GpufleetError(
                f"{folder} already holds files and {user.name} runs processes ({busy[0]} among them): its disk "
                "quota is put in place once none runs",
                f"stop the jobs of {user.name}'s queue, or move the files out of {folder}",
            )
        with tempfile.TemporaryDirectory(dir=self.images) as staging:
            done = _run("mount", "-o", "loop", str(image), staging)
            if done.returncode != 0:
                raise GpufleetError(f"cannot mount {image}: {_why(done)}", "check loop devices (modprobe loop)")
            try:
                copied = _run("cp", "-a", "--", f"{folder}/.", staging)
            finally:
                _run("umount", staging)
            if copied.returncode != 0:
                raise GpufleetError(
                    f"the files already in {folder} do not fit in {user.name}'s disk quota ({_why(copied)})",
                    f"raise the queue's quota (gpufleet quota set QUEUE --disk SIZE), or remove files from {folder}",
                )
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def _grow(self, image: Path, target: str, size: int) -> bool:
        """Grow the mounted file system in place; False (and the image as it was) where the kernel refuses."""
        device, before = _source(target), image.stat().st_size
        with open(image, "r+b") as f:
            f.truncate(size)
        done = _run("losetup", "-c", device)
        if done.returncode == 0:
            done = _run("resize2fs", device)
        if done.returncode == 0:
            return True
        log.info("cannot grow the disk quota on %s in place (%s): it grows while none of its jobs runs", target,
                 _why(done))  # fmt: skip
        with open(image, "r+b") as f:
            f.truncate(before)
        _run("losetup", "-c", device)
        return False

    def _unmount_if_idle(self, user: RunAs, image: Path, target: str) -> bool:
        """Unmount when none of the user's processes runs and no mount namespace (a job's own) still holds the
        file system, and say whether it was: only then may it be resized offline."""
        if processes_of(user.uid) or _run("umount", target).returncode != 0:
            return False
        if _attached(image):  # still mounted in another namespace: put it back as it was
            self._mount(user, image, target)
            return False
        return True

    def _resize_offline(self, user: RunAs, image: Path, size: int) -> None:
        """Resize the unmounted file system (a smaller one only if its files fit: resize2fs refuses otherwise,
        and the quota stays as it was)."""
        before = image.stat().st_size
        _run("e2fsck", "-f", "-y", str(image))
        if size > before:
            with open(image, "r+b") as f:
                f.truncate(size)
        done = _run("resize2fs", str(image), f"{size // 1024}K")
        if done.returncode != 0:
            log.warning("cannot resize the disk quota of %s to %d bytes: %s", user.name, size, _why(done))
            if size > before:
                with open(image, "r+b") as f:
                    f.truncate(before)
            return
        if size < before:
            with open(image, "r+b") as f:
                f.truncate(size)


def move_logs(job_logs: Path, quota: str) -> None:
    """Keep a job's logs (`job_logs`, the folder under the control plane's log root) on its queue's quota file
    system at `quota`, so that what a team's jobs print counts toward its quota, not the control plane's disk:
    the folder becomes a link to `<quota>/.gpufleet-logs/<job>`, what it held moved there. The logs' folder
    there is root's (0711): the queue's user may open its own logs by name, never change them; one it made
    itself in that place (a link to elsewhere, a folder of its own) is moved aside, never written through.
    Raises OSError."""
    base = Path(quota) / LOGS
    _root_folder(base, 0o711)
    target = base / job_logs.name
    if job_logs.is_symlink():
        if os.readlink(job_logs) == str(target):
            _root_folder(target, 0o711)
            return
        job_logs.unlink()
    _root_folder(target, 0o711)
    if job_logs.is_dir():
        for entry in job_logs.iterdir():
            shutil.move(str(entry), str(target / entry.name))
        job_logs.rmdir()
    job_logs.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, job_logs)


def _root_folder(path: Path, mode: int) -> None:
    """`path` as a folder of root's with `mode`; anything else in its place (made by a job) is renamed aside."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        os.mkdir(path, mode)
        os.chmod(path, mode)
        return
    if stat.S_ISDIR(info.st_mode) and info.st_uid == 0:
        return
    os.rename(path, f"{path}.not-gpufleet-{int(time.time())}")
    os.mkdir(path, mode)
    os.chmod(path, mode)


def _usable(size: int) -> int:
    """What an ext4 file system of `size` bytes offers its files: the journal and metadata take about 5 %."""
    return size * 95 // 100


def _attached(image: Path) -> str:
    """The loop device `image` is attached to ("": none)."""
    done = _run("losetup", "-j", str(image))
    first = done.stdout.strip().splitlines()[:1]
    return first[0].split(":", 1)[0] if done.returncode == 0 and first else ""


def _mounted(folder: str) -> bool:
    return _source(folder) != ""


def _source(folder: str) -> str:
    """The device mounted on `folder` ("": nothing is)."""
    wanted = os.path.realpath(folder)
    found = ""
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fields = head.split()
            if len(fields) > 4 and _unescape(fields[4]) == wanted:
                found = tail.split()[1] if len(tail.split()) > 1 else "?"
    return found


def _unescape(text: str) -> str:
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    program = shutil.which(command[0], path=_SBIN) or command[0]
    try:
        return subprocess.run(
            [program, *command[1:]], capture_output=True, text=True, check=False, env={"PATH": _SBIN}, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return subprocess.CompletedProcess(list(command), 127, "", str(error))


def _why(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def _words(size: int) -> str:
    for unit, step in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= step:
            return f"{size / step:.3g} {unit}"
    return f"{size} B"
