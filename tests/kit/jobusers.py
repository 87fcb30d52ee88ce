"""Tests whose control plane runs as root see their jobs run as per-queue users (`gpufleet-<queue>`), which
the control plane creates on first use. These helpers let such jobs reach the files a test gives them, and
remove at the end of the session the users (and homes) the session created."""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpufleet.bench.api import job_python

PREFIX = "gpufleet-"
# The Python jobs run: one every job user may execute (this interpreter may live under /root).
JOB_PYTHON = job_python()


_scratch: list[Path] = []


# Not /tmp: each job attempt has a private /tmp of its own, so files there are not the jobs' to see.
SCRATCH_BASE = Path("/var/tmp")


def scratch() -> Path:
    """This session's folder under /var/tmp that job users may pass through (0711). Not pytest's temporary
    folders (under /tmp, which jobs do not see, and private: another pytest session as the same user makes
    them private again)."""
    if not _scratch:
        base = Path(tempfile.mkdtemp(prefix="gpufleet-test-jobs-", dir=SCRATCH_BASE))
        base.chmod(0o711)
        _scratch.append(base)
    return _scratch[0]


def remove_scratch() -> None:
    while _scratch:
        shutil.rmtree(_scratch.pop(), ignore_errors=True)


def reachable_by_jobs(hint: Path) -> Path:
    """A new folder every job user may write to (mode 1777, like /tmp), named after `hint`, in `scratch()`."""
    folder = Path(tempfile.mkdtemp(prefix=f"{hint.name}-", dir=scratch()))
    folder.chmod(0o1777)
    return folder


def share(path: Path, text: str) -> Path:
    """A file every job user may read (a program the jobs run)."""
    path.write_text(text)
    path.chmod(0o644)
    return path


def shared_ledger(path: Path) -> Path:
    """A file every job user may append to."""
    path.touch()
    path.chmod(0o666)
    return path


def job_users() -> set[str]:
    return {entry.pw_name for entry in pwd.getpwall() if entry.pw_name.startswith(PREFIX)}


def remove_user(name: str) -> None:
    """Remove a test's user, its home, and any process it still has."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return
    with contextlib.suppress(FileNotFoundError):
        subprocess.run(["pkill", "-KILL", "-u", str(entry.pw_uid)], check=False, capture_output=True)
    subprocess.run(["userdel", name], check=False, capture_output=True)
    home = Path(entry.pw_dir)
    if home.is_dir() and home.stat().st_uid == entry.pw_uid:
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def job_users_and_folders() -> Iterator[None]:
    """For a whole session: remove the job users it created, its scratch folder, and the (empty) cgroup
    folders its control planes made."""
    cgroups_before = _gpufleet_cgroups()
    try:
        with users_created_here():
            yield
    finally:
        release_views()
        remove_scratch()
        for folder in sorted(_gpufleet_cgroups() - cgroups_before, key=lambda p: -len(p.parts)):
            for worker in folder.glob("*/"):
                with contextlib.suppress(OSError):
                    worker.rmdir()
            with contextlib.suppress(OSError):
                folder.rmdir()


def _gpufleet_cgroups() -> set[Path]:
    """The `gpufleet-*` folders under the cgroup hierarchies (where control planes put their workers)."""
    root = Path("/sys/fs/cgroup")
    found: set[Path] = set()
    for pattern in ("*/gpufleet-*", "*/*/*/gpufleet-*", "gpufleet-*"):
        found.update(p for p in root.glob(pattern) if p.is_dir())
    return found


@contextlib.contextmanager
def users_created_here() -> Iterator[None]:
    """Removes, on exit, every `gpufleet-*` user created meanwhile."""
    before = job_users() if os.geteuid() == 0 else set()
    try:
        yield
    finally:
        if os.geteuid() == 0:
            for name in sorted(job_users() - before):
                remove_user(name)


def python_for_anyone() -> tuple[str, dict[str, str]]:
    """A Python and environment with which any user can run this checkout of gpufleet (this interpreter and
    its virtual environment may live under /root): the system's Python 3 with our packages on its path."""
    import sysconfig

    import gpufleet

    python = JOB_PYTHON
    source = reachable_view(Path(gpufleet.__file__).resolve().parents[1])
    packages = reachable_view(Path(sysconfig.get_paths()["purelib"]))
    return python, {"PYTHONPATH": f"{source}:{packages}"}


_views: dict[Path, Path] = {}  # folder -> its view


def _others_may_enter(path: Path) -> bool:
    """Whether a user who is neither the owner nor in the group can reach `path` (every folder above it
    lets others pass)."""
    return all(folder.stat().st_mode & 0o001 for folder in (path, *path.parents))


def reachable_view(folder: Path) -> Path:
    """`folder`, or, when a folder above it is private (a checkout in a 0700 temporary folder, or under
    /root), the same folder bind-mounted read-only where every user can reach it. Only root can mount;
    without root the jobs run as the test's own user and reach `folder` anyway."""
    if _others_may_enter(folder) or os.geteuid() != 0:
        return folder
    if folder in _views:
        return _views[folder]
    if not _views:
        atexit.register(release_views)  # also when a session ends without its fixtures' teardown
    view = Path(tempfile.mkdtemp(prefix="gpufleet-test-view-", dir=SCRATCH_BASE))
    view.chmod(0o755)
    subprocess.run(["mount", "--bind", str(folder), str(view)], check=True, capture_output=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=False, capture_output=True)
    _views[folder] = view
    return view


def release_views() -> None:
    """Unmount the views `reachable_view` made. Never a recursive delete here: a view that is still
    mounted is the real folder, so only an empty mount point is removed."""
    while _views:
        _, view = _views.popitem()
        subprocess.run(["umount", "--lazy", str(view)], check=False, capture_output=True)
        with contextlib.suppress(OSError):
            view.rmdir()


@contextlib.contextmanager
def unprivileged_user(name: str, home: Path) -> Iterator[pwd.struct_passwd]:
    """A user (with `home`) for as long as the block runs."""
    remove_user(name)
    subprocess.run(
        ["useradd", "--system", "--user-group", "--create-home", "--home-dir", str(home), name],
        check=True,
        capture_output=True,
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        remove_user(name)
