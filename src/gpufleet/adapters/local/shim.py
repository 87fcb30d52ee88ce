"""The worker shim: one small process per worker that starts the user's command and records how it ended.

    python -I -m gpufleet.adapters.local.shim WORKER_DIR [SPAWN]

(the supervisor runs the same through `-c`, with the folder of the control plane's own gpufleet on the path,
and SPAWN, the spawn its spec.json names: the shim first claims the worker for it, see `_claim`)

The supervisor starts it in a session of its own, as the control plane's user, so it outlives the control
plane (a kill -9 of the control plane leaves jobs running, to be adopted at the next start) and the job
cannot signal it. It reads `spec.json` from WORKER_DIR and forks the command, which, before it runs:
joins the worker's cgroup (its limits), enters a mount namespace of its own where the spec asks (the
attempt's private /tmp and /dev/shm, a /proc that shows only its user's processes: `namespaces.py`), leads
a process group of its own (the group the checkpoint signal goes to), drops to the worker's user (its
groups, then its gid, then its uid), creates and enters its working folder as that user, and replaces
itself with the command and exactly the environment the spec gives. The shim writes `child.pid` once the
command runs.

The command's stdout and stderr are a pipe the shim copies to the worker's log, which the job cannot write
to directly: the shim caps it (keeping the tail, and saying so at the top) and, when the disk is full,
drops output rather than block the job. When the command ends, the shim kills everything left in the
worker's cgroup (processes that left the session by `setsid` or double forks included; without cgroups,
its process group), asks the cgroup whether the memory limit killed it, removes the cgroup and writes
`exit.json` (code, signal, end time, out of memory). `exit.json` is written into space reserved at start,
so a full disk cannot lose a worker's exit.

It starts on every launch, so it imports only a few stdlib modules (no subprocess, pathlib or typing: each
costs milliseconds).
"""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import sys
import time

from gpufleet.adapters.local import cgroup_ops
from gpufleet.adapters.local.proc import exit_code, read_json, start_ticks, write_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Signals a shim must live through: a stray signal to the shim's session must not lose the exit record.
_SURVIVE = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# Python ignores these at start; the command must get them at their defaults, as from a shell.
_RESTORE = (signal.SIGPIPE, signal.SIGXFSZ)
RESERVE = "exit.reserve"
RESERVE_BYTES = 4096  # exit.json is written into this space: a full disk cannot refuse it
DRAIN_S = 2.0  # output still arriving after the end, without a cgroup to kill its writers: read this long
REMOVE_S = 60.0  # how long a shim keeps trying to remove its worker's cgroup after recording the exit
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
TIMES_SUFFIX = ".times"  # beside a worker's log: where each second's output starts (`_Log`)
MARK_EVERY_S = 1.0


# The exit code of a worker whose cgroup vanished before it joined (EX_TEMPFAIL): its attempt is lost, not failed.
CGROUP_GONE = 75


def _ignore(signum: int, frame: object) -> None:
    """A Python handler rather than SIG_IGN: caught signals go back to default in the command at exec,
    ignored ones would stay ignored and the job could not be stopped by its checkpoint signal."""


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python -m gpufleet.adapters.local.shim WORKER_DIR [SPAWN]", file=sys.stderr)
        return 2
    for sig in _SURVIVE:
        signal.signal(sig, _ignore)
    worker = argv[1]
    if len(argv) == 3 and not _claim(worker, argv[2]):
        return 0  # a restarted control plane gave this worker up before the shim ran: another runs it
    _reserve(worker)
    # Written by the shim itself too: the control plane may die between spawning it and recording it.
    me = os.getpid()
    try:  # noqa: SIM105 - contextlib would cost the shim an import
        write_json(os.path.join(worker, "shim.pid"), {"pid": me, "ticks": start_ticks(me)})
    except OSError:
        pass  # the supervisor writes it too
    spec = read_json(os.path.join(worker, "spec.json"))
    if spec is None:
        return _failed(worker, 127, f"no readable spec.json in {worker}")
    if os.path.exists(spec["stop_file"]):
        # Stopped before it started (the stop came between launch and now): do not start it at all.
        _record_exit(worker, {"code": 0, "not_started": True, "ended_at": time.time()})
        return 0
    cgroup: list[str] = spec.get("cgroup") or []
    output, into = os.pipe()
    report, report_into = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the command-to-be
        os.close(output)
        os.close(report)
        _become_command(spec, cgroup, into, report_into)  # never returns
    os.close(into)
    os.close(report_into)
    failure = _read_all(report)
    if failure:
        _, status = os.waitpid(pid, 0)
        code, _, message = failure.decode(errors="replace").partition("\n")
        cgroup_ops.kill(cgroup)
        cgroup_ops.remove(cgroup)
        number = int(code) if code.isdigit() else 126
        return _failed(worker, number, message, lost=number == CGROUP_GONE)
    try:  # noqa: SIM105 - contextlib would cost the shim an import
        write_json(
            os.path.join(worker, "child.pid"),
            {"pid": pid, "pgid": pid, "ticks": start_ticks(pid), "started_at": time.time()},
        )
    except OSError:
        pass  # disk full: the job runs all the same, and its exit is recorded in the reserved space
    log = _Log(spec.get("log"), int(spec.get("log_cap") or 0), int(spec.get("log_gid", -1)))
    _relay(pid, output, log)
    ended = time.time()
    # A worker's processes end with it: helpers it left behind (in its group, or gone to a session of
    # their own) must not hold the GPUs. Its zombie keeps its pid, and so its group id, from being reused.
    if not cgroup or not cgroup_ops.kill(cgroup):
        try:  # noqa: SIM105 - contextlib would cost the shim an import
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    _drain(output, log, DRAIN_S)
    _, status = os.waitpid(pid, 0)
    returncode = os.waitstatus_to_exitcode(status)
    record: dict[str, object] = {
        "code": exit_code(returncode),
        "signal": -returncode if returncode < 0 else None,
        "ended_at": ended,
    }
    if cgroup and cgroup_ops.oom_kills(cgroup) > 0:
        record["oom"] = True
        record["memory_limit"] = int(spec.get("memory_limit") or 0)
    quota = str(spec.get("disk_quota") or "")
    if quota and record["code"] != 0 and cgroup_ops.full_disk(quota):
        record["disk_quota"] = {"folder": quota, "size": int(spec.get("disk_quota_size") or 0)}
    removed = _remove_cgroup(cgroup, 1.0)  # the killed processes leave the cgroup within moments
    _record_exit(worker, record)
    if not removed:  # on a busy machine a process may take longer to be gone: keep at it, after the record
        _remove_cgroup(cgroup, REMOVE_S)
    return 0


def _remove_cgroup(cgroup: list[str], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cgroup_ops.remove(cgroup):
        if time.monotonic() > deadline:
            return False
        cgroup_ops.kill(cgroup, timeout_s=0.0)
        time.sleep(0.01)
    return True


def _become_command(spec: dict[str, Any], cgroup: list[str], into: int, report: int) -> None:
    """In the forked child: set up and exec the command; on failure tell the shim why and exit."""
    code = 126
    step = "start the command"
    try:
        os.setpgid(0, 0)
        if cgroup:
            step = "join its cgroup"
            try:
                cgroup_ops.join(cgroup)
            except FileNotFoundError:
                # Made for it and removed before it joined (something on the node clears empty cgroups): nothing of
                # the job ran; the attempt is lost, not failed, and the job is started again.
                code = CGROUP_GONE
                raise
        private = str(spec.get("private_tmp") or "")
        if private or spec.get("hide_pids"):
            step = "give it a private /tmp, /dev/shm and /proc"
            from gpufleet.adapters.local import namespaces  # ctypes: only where it is used

            namespaces.enter(private, bool(spec.get("hide_pids")))
        os.dup2(into, 1)
        os.dup2(into, 2)
        os.close(into)
        for sig in _RESTORE:
            signal.signal(sig, signal.SIG_DFL)
        user = spec.get("user")
        if isinstance(user, dict):
            step = f"switch to user {user['name']}"
            os.setgroups([int(g) for g in user.get("groups") or ()])
            os.setgid(int(user["gid"]))
            os.setuid(int(user["uid"]))
        os.umask(0o022)
        cwd = str(spec["cwd"])
        step = f"use the working folder {cwd!r}"
        if spec.get("job_dir"):  # the job's own folder, made by its user: private, kept across attempts
            os.makedirs(str(spec["job_dir"]), 0o700, exist_ok=True)
        os.chdir(cwd)
        argv = [str(a) for a in spec["argv"]]
        step = f"start {argv[0]!r}"
        env = spec.get("env")
        _exec(argv, env if isinstance(env, dict) else {})
    except OSError as error:
        if code != CGROUP_GONE:
            code = 127 if isinstance(error, FileNotFoundError) else 126
        message = f"cannot {step}: {error.strerror}"
        if error.filename and str(error.filename) not in step:
            message += f" ({error.filename})"
        if code == 127 and spec.get("private_tmp") and ("'/tmp/" in step or "'/dev/shm/" in step):
            message += (
                " (each job attempt has a private /tmp and /dev/shm: put the job's files in its working folder "
                "or a folder its nodes share)"
            )
    except BaseException as error:  # never let the child return into the shim's code
        message = f"cannot start the command: {error!r}"
    try:
        os.write(report, f"{code}\n{message}".encode()[:4000])
    finally:
        os._exit(code)


def _exec(argv: list[str], env: dict[str, str]) -> None:
    """execvpe, searching the command's own PATH, without `os.get_exec_path` (it imports `warnings`, which
    the worker's user may not be able to read where this Python is installed)."""
    if "/" in argv[0]:
        os.execve(argv[0], argv, env)
    missing: OSError = FileNotFoundError(errno.ENOENT, "No such file or directory")
    for folder in env.get("PATH", "/usr/bin:/bin").split(":"):
        try:
            os.execve(os.path.join(folder or ".", argv[0]), argv, env)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except PermissionError as error:
            missing = error  # as a shell says: found, but cannot run it
    raise missing


def _relay(pid: int, output: int, log: _Log) -> None:
    """Copy the command's output to the log until the command ends."""
    try:
        ended_fd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):  # before Linux 5.3: look every 50 ms instead
        ended_fd = None
    poller = select.poll()
    poller.register(output, select.POLLIN)
    if ended_fd is not None:
        poller.register(ended_fd, select.POLLIN)
    open_output = True
    while True:
        events = poller.poll(None if ended_fd is not None and open_output else 50)
        for fd, _ in events:
            if fd == output:
                data = os.read(output, 1 << 16)
                if data:
                    log.write(data)
                else:  # every writer closed it: only the end is left to wait for
                    poller.unregister(output)
                    open_output = False
        if ended_fd is not None and any(fd == ended_fd for fd, _ in events):
            break
        if ended_fd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            break
    if ended_fd is not None:
        os.close(ended_fd)


def _drain(output: int, log: _Log, timeout_s: float) -> None:
    """Copy what is left in the pipe; stop at its end, or after `timeout_s` if something still holds it."""
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    poller.register(output, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(int(left * 1000)):
            break
        data = os.read(output, 1 << 16)
        if not data:
            break
        log.write(data)
    os.close(output)
    log.close()


class _Log:
    """The worker's log (the shim's stdout): capped at `cap` bytes by keeping the newest half when it is
    reached; output that a full disk refuses is counted and noted once space is back. Beside it, `LOG.times`
    marks where the output of each second starts (`logs.since_offset` reads it for `logs --since`): a line
    `TIME OFFSET` before a write when the last mark is a second old or more, so that whatever lies between two
    marks was written within a second of the first."""

    def __init__(self, path: object, cap: int, gid: int) -> None:
        self.path = path if isinstance(path, str) else None
        self.cap = cap if self.path else 0
        self.gid = gid
        try:
            self.size = os.fstat(1).st_size
        except OSError:
            self.size = 0
        self.dropped = 0  # bytes dropped to keep under the cap
        self.lost = 0  # bytes a full disk refused
        self.times = _open_marks(self.path + TIMES_SUFFIX, gid) if self.path else -1
        self.marked = -MARK_EVERY_S

    def write(self, data: bytes) -> None:
        if self.cap and self.size + len(data) > self.cap:
            self._keep_tail(len(data))
        self._mark()
        if self.lost:
            note = f"\n[gpufleet: {self.lost} bytes of output were lost here: the disk was full]\n".encode()
            if not self._put(note):
                self.lost += len(data)
                return
            self.lost = 0
        if not self._put(data):
            self.lost += len(data)

    def _mark(self) -> None:
        now = time.time()
        if self.times < 0 or now - self.marked < MARK_EVERY_S:
            return
        self.marked = now
        try:  # noqa: SIM105 - contextlib would cost the shim an import
            os.write(self.times, f"{now:.3f} {self.size}\n".encode())
        except OSError:  # a full disk: the marks are a help, the output is what counts
            pass

    def _shift_marks(self, cut: int, note: int) -> None:
        """After the log restarted with a note of `note` bytes and what it held from `cut` on: the marks of
        what it kept, moved to where that is now."""
        if self.times < 0 or self.path is None:
            return
        path = self.path + TIMES_SUFFIX
        try:
            with open(path, encoding="ascii") as f:
                lines = f.read().splitlines()
            kept = []
            for line in lines:
                at, _, offset = line.partition(" ")
                if offset.isdigit() and int(offset) >= cut:
                    kept.append(f"{at} {int(offset) - cut + note}\n")
            tmp = f"{path}.{os.getpid()}.tmp"
            fd = _open_marks(tmp, self.gid, truncate=True)
            if fd < 0:
                return
            os.write(fd, "".join(kept).encode())
            os.replace(tmp, path)
            os.close(self.times)
            self.times = fd
        except (OSError, ValueError):
            pass

    def _put(self, data: bytes) -> bool:
        view = memoryview(data)
        while view:
            try:
                written = os.write(1, view)
            except OSError as error:
                if error.errno in _NO_SPACE:
                    return False
                raise
            self.size += written
            view = view[written:]
        return True

    def _keep_tail(self, incoming: int) -> None:
        """Start the log again with a note and the newest part of what it held, so that it plus what comes
        next stays under the cap."""
        assert self.path is not None
        keep = max(0, min(self.size, self.cap // 2 - incoming))
        self.dropped += self.size - keep
        note = (
            f"[gpufleet: this log is capped at {_size(self.cap)}: the first {self.dropped} bytes of output were "
            "dropped; the newest output follows]\n"
        ).encode()
        folder, name = os.path.split(self.path)
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
        fd = -1
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
            if self.gid >= 0:
                os.fchown(fd, -1, self.gid)
            os.write(fd, note)
            source = os.open(self.path, os.O_RDONLY)
            try:
                offset = self.size - keep
                while offset < self.size:
                    sent = os.sendfile(fd, source, offset, self.size - offset)
                    if sent == 0:
                        break
                    offset += sent
            finally:
                os.close(source)
            os.replace(tmp, self.path)
        except OSError:
            if fd >= 0:
                os.close(fd)
            # No room for the copy: drop everything rather than grow past the cap.
            try:  # noqa: SIM105 - contextlib would cost the shim an import
                os.unlink(tmp)
            except OSError:
                pass
            os.ftruncate(1, 0)
            self.dropped += keep
            self.size = 0
            return
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.lseek(1, 0, os.SEEK_END)
        self._shift_marks(self.size - keep, len(note))
        self.size = len(note) + keep

    def close(self) -> None:
        if self.lost:
            self._put(f"\n[gpufleet: {self.lost} bytes of output were lost: the disk was full]\n".encode())


def _open_marks(path: str, gid: int, truncate: bool = False) -> int:
    """The time marks file, opened to append (-1 if it cannot be: the log is kept without them)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
    try:
        fd = os.open(path, flags, 0o640)
    except OSError:
        return -1
    if gid >= 0:
        try:  # noqa: SIM105 - contextlib would cost the shim an import
            os.fchown(fd, -1, gid)
        except OSError:
            pass
    return fd


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} bytes"


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        data = os.read(fd, 4096)
        if not data:
            break
        chunks.append(data)
    os.close(fd)
    return b"".join(chunks)


def _claim(worker: str, spawn: str) -> bool:
    """Take the worker for this shim, the spawn `spawn` of its spec, before anything else: `claim` made with
    O_EXCL in the folder the shim found, through one directory handle. A control plane that restarted and found
    the worker unclaimed claims it itself and starts a new one (`WorkerSupervisor.void_unspawned`): this shim,
    however late it runs, then finds the claim taken, its folder gone, or a spec of another spawn, and stops
    without touching anything, so a worker's command is never started twice."""
    try:
        folder = os.open(worker, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        with open(os.open("spec.json", os.O_RDONLY, dir_fd=folder), "rb") as spec:
            spawned = json.loads(spec.read() or b"{}").get("spawn")
        if spawned != spawn:
            return False
        claim = os.open("claim", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=folder)
        try:
            os.write(claim, spawn.encode())
        finally:
            os.close(claim)
    except (OSError, ValueError):
        return False
    finally:
        os.close(folder)
    return True


def _reserve(worker: str) -> None:
    """Set aside the space exit.json will take, while there still is some."""
    try:
        fd = os.open(os.path.join(worker, RESERVE), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return
    try:
        os.write(fd, b"\0" * RESERVE_BYTES)
    except OSError:
        pass
    finally:
        os.close(fd)


def _record_exit(worker: str, record: dict[str, object]) -> None:
    """exit.json, atomically: written into the reserved file (rewriting blocks it already holds needs no new
    space), which is then renamed. Without a reserve (it could not be made), an ordinary atomic write."""
    data = json.dumps(record).encode()
    reserve = os.path.join(worker, RESERVE)
    try:
        fd = os.open(reserve, os.O_WRONLY)
    except OSError:
        write_json(os.path.join(worker, "exit.json"), record)
        return
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    os.replace(reserve, os.path.join(worker, "exit.json"))


def _failed(worker: str, code: int, message: str, lost: bool = False) -> int:
    """Record that the worker could not start. `lost`: through no fault of the job (retried, not failed)."""
    print(f"gpufleet: {message}", file=sys.stderr, flush=True)
    record: dict[str, object] = {"code": code, "error": message[:2000], "ended_at": time.time()}
    if lost:
        record["lost"] = True
    _record_exit(worker, record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
