"""A job attempt's private /tmp and /dev/shm, and a /proc that shows only its own user's processes.

Host side (the supervisor, as root): each attempt that runs on a node gets one tmpfs, mounted under the
executor's state folder (`attempt_tmp`), with `tmp/` and `shm/` in it. Its size is what the attempt's workers
on the node may hold in memory (`grow` raises it as they start), and its pages are charged to the memory
cgroup of the worker that writes them: shared memory counts against the job's limit. The supervisor detaches
it when the attempt ends here (`release`); the pages go once the last worker's namespace is gone.

Worker side (`enter`, in the shim's forked child, as root, before it drops to the job's user): a mount
namespace of its own, with propagation made private (nothing mounted there reaches the host), the
attempt's `tmp/` and `shm/` bound on /tmp and /dev/shm, and a new instance of proc mounted with
`hidepid=invisible` (Linux 5.8 and later give every proc mount its own options): the job sees only the
processes of its own user, so it cannot read the control plane's, Ray's or another team's command lines.
Every worker of the attempt on the node binds the same tmpfs, so local ranks share /dev/shm (NCCL's
shared-memory transport needs that).

A new namespace starts as a copy of every mount, other attempts' tmpfs included, and a private copy keeps a
tmpfs (and its memory) alive after the host detached it. So `enter` detaches, in the worker's namespace,
every attempt tmpfs (they are all mounted with the source `SOURCE`) except its own /tmp and /dev/shm.

The shim imports this module only where it is used (ctypes costs it about 2 ms).
"""

from __future__ import annotations

import ctypes
import errno
import os

SOURCE = "gpufleet-attempt"  # the `source` of every attempt tmpfs, as /proc/*/mountinfo shows it
TMP, SHM = "tmp", "shm"

_CLONE_NEWNS = 0x00020000
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2

_loaded: dict[str, ctypes.CDLL] = {}


def _c() -> ctypes.CDLL:
    libc = _loaded.get("c")
    if libc is None:
        libc = _loaded["c"] = ctypes.CDLL(None, use_errno=True)
    return libc


def _check(result: int, what: str, path: str | None = None) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}", path)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    c = _c()
    result = c.mount(
        None if source is None else source.encode(),
        target.encode(),
        None if fstype is None else fstype.encode(),
        ctypes.c_ulong(flags),
        None if data is None else data.encode(),
    )
    _check(result, f"mount {fstype or 'bind'} on {target}", target)


def _detach(target: str) -> None:
    _check(_c().umount2(target.encode(), _MNT_DETACH), f"unmount {target}", target)


def _detach_other(target: str) -> None:
    """Detach another attempt's tmpfs from this namespace's copy of the host's mounts. One that attempt's end
    released meanwhile is not an error: gone (EINVAL: no longer a mount point here), or its mount point
    removed on the host (ENOENT), which leaves the copy out of every path's reach and its memory held only
    until this worker's namespace ends."""
    if _c().umount2(target.encode(), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.ENOENT, errno.EINVAL):
            raise OSError(code, f"unmount {target}: {os.strerror(code)}", target)


# --- in the worker ----------------------------------------------------------------------------------------


def enter(tmp_root: str, hide_pids: bool) -> None:
    """In the worker (as root, single-threaded): a mount namespace of its own with `tmp_root`'s `tmp/` and
    `shm/` on /tmp and /dev/shm ("": keep the host's), no other attempt's tmpfs, and with `hide_pids` a proc
    that shows only its user's processes. Raises OSError."""
    _check(_c().unshare(_CLONE_NEWNS), "make a mount namespace")
    # Without this, on a host whose mounts are shared (systemd's default), the mounts below would reach it.
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    # Held open: the state folder may itself be under /tmp, which the bind below covers.
    own = os.open(tmp_root, os.O_PATH | os.O_DIRECTORY) if tmp_root else -1
    try:
        for target in reversed(attempt_mounts()):
            if target != tmp_root:
                _detach_other(target)
        if own >= 0:
            _mount(f"/proc/self/fd/{own}/{SHM}", "/dev/shm", None, _MS_BIND)
            _mount(f"/proc/self/fd/{own}/{TMP}", "/tmp", None, _MS_BIND)
            _detach(f"/proc/self/fd/{own}")  # the binds hold the tmpfs now
    finally:
        if own >= 0:
            os.close(own)
    if hide_pids:
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=invisible")


def attempt_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """The mount points of every attempt tmpfs in this mount namespace, in mount order."""
    found = []
    with open(mountinfo, "rb") as f:
        for line in f.read().decode("utf-8", "surrogateescape").splitlines():
            fields, _, tail = line.partition(" - ")
            parts = tail.split(" ")
            if len(parts) >= 2 and parts[0] == "tmpfs" and parts[1] == SOURCE:
                found.append(_unescape(fields.split(" ")[4]))
    return found


def _unescape(path: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    if "\\" not in path:
        return path
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and path[i + 1 : i + 4].isdigit():
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


# --- on the host ------------------------------------------------------------------------------------------


def attempt_tmp(path: str, size: int) -> None:
    """Mount the attempt's tmpfs at `path` (made if missing) with room for `size` bytes (0: half the
    node's memory, the kernel's default), or, if mounted already, grow it to `size` (never shrink it: a
    worker may hold what it has written). Raises OSError."""
    option = f"size={size}" if size > 0 else "size=50%"
    if not os.path.ismount(path):
        os.makedirs(path, mode=0o700, exist_ok=True)
        _mount(SOURCE, path, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=0700,{option}")
    elif size > 0:
        st = os.statvfs(path)
        if size > st.f_blocks * st.f_frsize:
            _mount(SOURCE, path, None, _MS_REMOUNT | _MS_NOSUID | _MS_NODEV, option)
    # Made (or made whole) on every call: a control plane killed between the mount and these leaves a tmpfs
    # without them, and the next start's workers would find no /dev/shm to bind.
    for name in (TMP, SHM):
        folder = os.path.join(path, name)
        os.makedirs(folder, exist_ok=True)
        os.chmod(folder, 0o1777)  # as the host's /tmp and /dev/shm: sticky, for the attempt's one user


def release(path: str) -> None:
    """Detach the attempt's tmpfs (its memory is freed once no worker's namespace holds it) and remove its
    mount point. Nothing there: nothing to do. Raises OSError."""
    while os.path.ismount(path):  # mounted twice (a crash between two starts): detach each
        _detach(path)
    try:  # noqa: SIM105 - contextlib would cost the shim an import
        os.rmdir(path)
    except FileNotFoundError:
        pass


def unavailable() -> tuple[str, str]:
    """Why workers cannot get a private /tmp and /dev/shm, and why their /proc cannot hide other users'
    processes ("" each: they can), tried in a short-lived child process as `enter` does it."""
    if os.geteuid() != 0:
        reason = "gpufleet does not run as root here, and only root may make mount namespaces"
        return reason, reason
    libc = _c()
    # Looked up before the fork: in a process with threads (a Ray actor), the child must not take the dynamic
    # loader's lock, which another thread may have held at the fork.
    _ = (libc.unshare, libc.mount, libc.umount2)
    report, into = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        reasons = ["", ""]
        try:
            try:
                _check(_c().unshare(_CLONE_NEWNS), "make a mount namespace")
                _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
            except OSError as error:
                reasons = [str(error.strerror), str(error.strerror)]
            else:
                try:
                    _mount(SOURCE, "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0700,size=4k")
                except OSError as error:
                    reasons[0] = str(error.strerror)
                try:
                    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=invisible")
                except OSError as error:
                    reasons[1] = f"{error.strerror} (Linux 5.8 or later gives each proc mount its own options)"
            os.write(into, "\n".join(reasons).encode())
        finally:
            os._exit(0)
    os.close(into)
    chunks = []
    while chunk := os.read(report, 4096):
        chunks.append(chunk)
    os.close(report)
    os.waitpid(pid, 0)
    answer = b"".join(chunks).decode()
    if "\n" not in answer:
        return "the check in a child process did not finish", "the check in a child process did not finish"
    tmp, _, proc = answer.partition("\n")
    return tmp, proc
