"""The worker shim: one small process per worker that starts the user's command and records how it ended.

    python -I -m gpufleet.adapters.local.shim WORKER_DIR

The local backend starts it in a session of its own, so it outlives the control plane (a kill -9 of the
control plane leaves jobs running, to be adopted at the next start). Its stdout and stderr are already the
worker's log file; the command inherits them. It reads `spec.json` from WORKER_DIR, starts the command in
a process group of its own (the group the backend signals: the checkpoint signal, then SIGKILL, never
reach the shim), writes `child.pid` once it started, waits, and writes `exit.json` (code, the signal that
killed it, end time). Both files are written atomically.

Stdlib only (and a stdlib-only helper module): it starts on every launch, so it must start fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.adapters.local.proc import exit_code, read_json, start_ticks, write_json

# Signals a shim must live through: a stray signal to the shim's session must not lose the exit record.
_SURVIVE = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _ignore(signum: int, frame: object) -> None:
    """A Python handler rather than SIG_IGN: caught signals go back to default in the child at exec, ignored
    ones would stay ignored and the job could not be stopped by its checkpoint signal."""


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m gpufleet.adapters.local.shim WORKER_DIR", file=sys.stderr)
        return 2
    for sig in _SURVIVE:
        signal.signal(sig, _ignore)
    worker = Path(argv[1])
    spec = read_json(worker / "spec.json")
    if spec is None:
        return _failed(worker, 127, f"gpufleet: no readable spec.json in {worker}")
    if os.path.exists(spec["stop_file"]):
        # Stopped before it started (the stop came between launch and now): do not start it at all.
        write_json(worker / "exit.json", {"code": 0, "not_started": True, "ended_at": time.time()})
        return 0
    try:
        child = subprocess.Popen(
            spec["argv"], cwd=spec["cwd"], stdin=subprocess.DEVNULL, close_fds=True, process_group=0
        )
    except OSError as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        what = exc.filename if exc.filename is not None else spec["argv"][0]
        return _failed(worker, code, f"cannot start {spec['argv'][0]!r}: {exc.strerror or exc} ({what})")
    started = time.time()
    write_json(
        worker / "child.pid",
        {"pid": child.pid, "pgid": child.pid, "ticks": start_ticks(child.pid), "started_at": started},
    )
    # Wait for the end without reaping it: while it is a zombie its pid (and so its group id) cannot be
    # reused, so the group kill below reaches only what it left behind.
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    ended = time.time()
    # A worker's processes end with it: helpers it left behind in its group must not hold the GPUs.
    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGKILL)
    returncode = child.wait()
    write_json(
        worker / "exit.json",
        {"code": exit_code(returncode), "signal": -returncode if returncode < 0 else None, "ended_at": ended},
    )
    return 0


def _failed(worker: Path, code: int, message: str) -> int:
    print(f"gpufleet: {message}", file=sys.stderr, flush=True)
    write_json(worker / "exit.json", {"code": code, "error": message, "ended_at": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
