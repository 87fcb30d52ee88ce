"""Waiting for a job from the command line: its exit status as a shell gives it, and its output as it comes.

`submit --wait`, `run` and `logs -f` end with the job's own exit code, so that scripts can chain them as they
chain any command: 0 when it succeeded, the code its first failed worker exited with, 128+N for one killed by
signal N (the executors record codes so), and 1 for a job that ended without an exit code of its own (cancelled
before it started, refused, lost with its node).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpufleet.cli.client import ApiError, Client

TERMINAL_STATES = ("succeeded", "failed", "cancelled")
NO_CODE = 1  # a job that ended without an exit code of its own
POLL_S = 0.3
TAIL_FIRST = 64 * 1024  # bytes first asked for `--tail N`; doubled until N lines are in
TAIL_MOST = 1 << 20  # the API's largest logs chunk


def exit_status(job: dict[str, Any]) -> int:
    """The exit status a finished job gives the shell (see the module's docstring)."""
    if job["state"] == "succeeded":
        return 0
    code = job.get("exit_code")
    if isinstance(code, int) and code > 0:
        return min(code, 255)
    return NO_CODE


def wait_for(client: Client, job_id: str, poll_s: float = 0.5) -> dict[str, Any]:
    """The job once it has ended."""
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}")
        if job["state"] in TERMINAL_STATES:
            return job
        time.sleep(poll_s)


def tail_offset(client: Client, job_id: str, lines: int, *, worker: int, attempt: int | None) -> int:
    """The byte offset where the last `lines` lines of a worker's log start (the server reads the tail; a log
    longer than the API's largest chunk gives what that chunk holds)."""
    if lines <= 0:
        chunk = client.get(f"/v1/jobs/{job_id}/logs", worker=worker, attempt=attempt, tail=1)
        return int(chunk["offset"]) + len(chunk["text"].encode())
    want = TAIL_FIRST
    while True:
        chunk = client.get(f"/v1/jobs/{job_id}/logs", worker=worker, attempt=attempt, tail=want)
        start, text = int(chunk["offset"]), str(chunk["text"])
        parts = text.splitlines(keepends=True)
        whole = parts[1:] if start > 0 else parts  # the first one may be the end of a line cut by the tail
        if len(whole) >= lines or start == 0 or want >= TAIL_MOST:
            kept = "".join(whole[-lines:])
            return int(chunk["next_offset"]) - len(kept.encode())
        want = min(want * 2, TAIL_MOST)


def stream_until_done(
    client: Client,
    job_id: str,
    write: Callable[[str], None],
    note: Callable[[str], None],
    *,
    worker: int = 0,
) -> dict[str, Any]:
    """Write worker `worker`'s output while the job runs, every attempt in turn from its start (a retry after a
    note), and return the job once it has ended and its output is all written."""
    reading = 0  # the attempt whose log is being written
    offset = 0
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}")
        ended = job["state"] in TERMINAL_STATES
        moved = False
        while reading or job["attempt"]:
            if reading == 0:
                reading, offset = 1, 0
            offset, step, complete = _write_available(client, job_id, worker, reading, offset, write)
            moved = moved or step
            if reading >= job["attempt"] or not complete:
                break
            reading, offset = reading + 1, 0  # that attempt is over: on to the next
            note(f"attempt {reading} of {job_id} starts")
        if ended:
            return job
        if not moved:
            time.sleep(POLL_S)


def _write_available(
    client: Client, job_id: str, worker: int, attempt: int, offset: int, write: Callable[[str], None]
) -> tuple[int, bool, bool]:
    """Write what the attempt's log holds from `offset`: (the next offset, whether any was written, whether that
    log is complete; a log not there, or no longer, counts as complete once a later attempt exists)."""
    moved = False
    while True:
        try:
            chunk = client.get(f"/v1/jobs/{job_id}/logs", worker=worker, attempt=attempt, offset=offset)
        except ApiError as error:
            if error.status == 404:  # not launched on this worker yet, or its log is gone
                return offset, moved, True
            raise
        if chunk["text"]:
            write(chunk["text"])
        step = chunk["next_offset"] != offset
        offset = chunk["next_offset"]
        moved = moved or step
        if not step or chunk["complete"]:
            return offset, moved, bool(chunk["complete"])
