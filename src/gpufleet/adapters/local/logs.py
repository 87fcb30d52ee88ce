"""Retention of finished jobs' logs: by age and by the total size of all logs.

A worker's log is capped while it runs (the shim keeps its newest part, see `shim.py`); what is left once a
job has finished is kept until it is older than `max_age_s` (counted from the last write to any of the job's
logs), and while all logs together stay under `max_total` bytes (beyond that, the finished jobs whose logs
were written longest ago go first). Logs of jobs still active are never removed. A finished job's run
records (`run/<job>/`: its command, environment and exit records) go with its logs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.adapters.local.layout import Layout, job_id_of
from gpufleet.adapters.local.shim import MARK_EVERY_S, TIMES_SUFFIX

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class LogRetention:
    max_age_s: float | None = 30 * DAY_S  # None: no age limit
    max_total: int | None = None  # bytes for all logs together; None: no limit


@dataclass(frozen=True, slots=True)
class _JobLogs:
    job_id: str
    folder: Path
    size: int
    last_write: float


def prune_logs(layout: Layout, retention: LogRetention, finished: Callable[[str], bool]) -> dict[str, int]:
    """Delete what `retention` no longer keeps, of jobs `finished(job id)` says are done. Returns how many
    jobs' logs and how many bytes were removed."""
    now = time.time()
    found: list[_JobLogs] = []
    total = 0
    for folder in sorted(p for p in layout.log_root.iterdir() if p.is_dir()) if layout.log_root.is_dir() else ():
        size, last = _usage(folder)
        total += size
        try:
            job_id = job_id_of(folder.name)
        except UnicodeDecodeError:
            continue
        found.append(_JobLogs(job_id, folder, size, last))
    removable = sorted((j for j in found if finished(j.job_id)), key=lambda j: (j.last_write, j.job_id))
    removed = freed = 0
    for logs in removable:
        too_old = retention.max_age_s is not None and logs.last_write < now - retention.max_age_s
        too_big = retention.max_total is not None and total > retention.max_total
        if not (too_old or too_big):
            continue
        _remove(logs.folder)
        shutil.rmtree(layout.run_dir(logs.job_id), ignore_errors=True)
        total -= logs.size
        removed += 1
        freed += logs.size
    # Run records without logs (an attempt given up on a node before it started there, see `given_up`) go by age.
    logged = {j.job_id for j in found}
    for job_id, folder in run_records(layout):
        if job_id in logged or not finished(job_id) or retention.max_age_s is None:
            continue
        if _usage(folder)[1] < now - retention.max_age_s:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return {"jobs": removed, "bytes": freed}


def _remove(folder: Path) -> None:
    """A job's logs, also where they live on its queue's disk quota (the folder is then a link there)."""
    if folder.is_symlink():
        target = os.readlink(folder)
        if os.path.realpath(folder) == target:  # no link on the way there: a job may own the folder above
            shutil.rmtree(target, ignore_errors=True)
        with contextlib.suppress(OSError):
            folder.unlink()
        return
    shutil.rmtree(folder, ignore_errors=True)


def run_records(layout: Layout) -> list[tuple[str, Path]]:
    """Every job with run records under `layout` (job id, its folder)."""
    root = layout.run_root()
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        with contextlib.suppress(UnicodeDecodeError):
            found.append((job_id_of(folder.name), folder))
    return found


def _usage(folder: Path) -> tuple[int, float]:
    """Bytes held by the log files under `folder`, and when the newest was last written (the folder's own
    time when it holds none)."""
    size, last = 0, 0.0
    for path in folder.rglob("*"):
        try:
            stat = path.stat()
        except OSError:
            continue
        if path.is_file():
            size += stat.st_size
            last = max(last, stat.st_mtime)
    if last == 0.0:
        with contextlib.suppress(OSError):
            last = folder.stat().st_mtime
    return size, last


def since_offset(path: Path, since: float) -> int:
    """Where the output written at `since` (epoch seconds) or later starts in a worker's log, from the marks
    its shim keeps beside it (`shim._Log`): the first mark less than a second before `since` or after it (what
    lies between two marks was written within a second of the first, so nothing written since is left out,
    and at most a second's output before it is in). A log without marks (older than them) starts at 0; one
    with nothing written since, at its end."""
    try:
        text = Path(f"{path}{TIMES_SUFFIX}").read_text(encoding="ascii", errors="replace")
    except OSError:
        return 0
    for line in text.splitlines():
        at, _, offset = line.partition(" ")
        try:
            if float(at) + MARK_EVERY_S > since and offset.isdigit():
                return int(offset)
        except ValueError:
            continue
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_log_file(
    path: Path, offset: int, limit: int, tail: int | None = None, since: float | None = None
) -> tuple[bytes, int, int]:
    """Up to `limit` bytes of a log file from `offset` (with `tail`: its last `tail` bytes; with `since`, a
    time: from the output written then on, `since_offset`): (data, where it starts, the file's size). A file
    not there (yet, or any more) reads as empty at `offset`."""
    if since is not None:
        offset = since_offset(path, since)
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            start = min(offset, size) if tail is None else max(0, size - tail)
            handle.seek(start)
            return handle.read(limit), start, size
    except FileNotFoundError:
        return b"", offset, offset
