"""The worker shim: one small process per worker that starts the user's command and records how it ended.

    python -I -m gpufleet.adapters.local.shim WORKER_DIR

The local backend starts it in a session of its own, so it outlives the control plane (a kill -9 of the
control plane leaves jobs running, to be adopted at the next start). Its stdout and stderr are already the
worker's log file; the command inherits them. It reads `spec.json` from WORKER_DIR, starts the command in
a process group of its own (the group the backend signals: the checkpoint signal, then SIGKILL, never
reach the shim), writes `child.pid` once it started, waits, and writes `exit.json` (code, the signal that
killed it, end time). Both files are written atomically.

It starts on every launch, so it imports only a few stdlib modules (no subprocess, pathlib or typing: each
costs milliseconds) and starts the command with posix_spawn.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from gpufleet.adapters.local.proc import exit_code, read_json, start_ticks, write_json

# Signals a shim must live through: a stray signal to the shim's session must not lose the exit record.
_SURVIVE = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# Python ignores these at start; the command must get them at their defaults, as from a shell.
_RESTORE = (signal.SIGPIPE, signal.SIGXFSZ)


def _ignore(signum: int, frame: object) -> None:
    """A Python handler rather than SIG_IGN: caught signals go back to default in the command at exec,
    ignored ones would stay ignored and the job could not be stopped by its checkpoint signal."""


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m gpufleet.adapters.local.shim WORKER_DIR", file=sys.stderr)
        return 2
    for sig in _SURVIVE:
        signal.signal(sig, _ignore)
    worker = argv[1]
    # Written by the shim itself too: the control plane may die between spawning it and recording it.
    me = os.getpid()
    write_json(os.path.join(worker, "shim.pid"), {"pid": me, "ticks": start_ticks(me)})
    spec = read_json(os.path.join(worker, "spec.json"))
    if spec is None:
        return _failed(worker, 127, f"no readable spec.json in {worker}")
    if os.path.exists(spec["stop_file"]):
        # Stopped before it started (the stop came between launch and now): do not start it at all.
        write_json(os.path.join(worker, "exit.json"), {"code": 0, "not_started": True, "ended_at": time.time()})
        return 0
    command: list[str] = spec["argv"]
    try:
        os.chdir(spec["cwd"])  # the shim's own folder does not matter: the command inherits it
    except OSError as exc:
        return _failed(worker, _spawn_code(exc), f"cannot use the working folder {spec['cwd']!r}: {exc.strerror}")
    try:
        pid = os.posix_spawnp(command[0], command, os.environ, setpgroup=0, setsigdef=_RESTORE)
    except OSError as exc:
        return _failed(worker, _spawn_code(exc), f"cannot start {command[0]!r}: {exc.strerror}")
    write_json(
        os.path.join(worker, "child.pid"),
        {"pid": pid, "pgid": pid, "ticks": start_ticks(pid), "started_at": time.time()},
    )
    # Wait for the end without reaping it: while it is a zombie its pid (and so its group id) cannot be
    # reused, so the group kill below reaches only what it left behind.
    try:  # noqa: SIM105 - contextlib would cost the shim an import
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass
    ended = time.time()
    # A worker's processes end with it: helpers it left behind in its group must not hold the GPUs.
    try:  # noqa: SIM105 - contextlib would cost the shim an import
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    _, status = os.waitpid(pid, 0)
    returncode = os.waitstatus_to_exitcode(status)
    write_json(
        os.path.join(worker, "exit.json"),
        {"code": exit_code(returncode), "signal": -returncode if returncode < 0 else None, "ended_at": ended},
    )
    return 0


def _spawn_code(exc: OSError) -> int:
    """As shells say it: 127 for a command (or folder) not found, 126 for one that cannot run."""
    return 127 if isinstance(exc, FileNotFoundError) else 126


def _failed(worker: str, code: int, message: str) -> int:
    print(f"gpufleet: {message}", file=sys.stderr, flush=True)
    write_json(os.path.join(worker, "exit.json"), {"code": code, "error": message, "ended_at": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
