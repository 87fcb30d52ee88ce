"""Which attempt and worker each of a job's log files belongs to, from its path."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_ATTEMPT_RE = re.compile(r"attempt[-_.]?(\d+)", re.IGNORECASE)
_WORKER_RE = re.compile(r"(?:worker|rank)[-_.]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class LogFile:
    attempt: int
    worker: int
    path: Path


def index_logs(paths: Sequence[Path], workers: int) -> list[LogFile]:
    """Give each log file its attempt and worker: from its name when it says (`attempt-2/worker-0.log`),
    otherwise from its position (oldest attempt first, one file per worker)."""
    parsed: list[LogFile] = []
    for path in paths:
        attempt = _ATTEMPT_RE.findall(str(path))
        worker = _WORKER_RE.findall(path.name) or _WORKER_RE.findall(str(path))
        if not attempt or not worker:
            break
        parsed.append(LogFile(int(attempt[-1]), int(worker[-1]), path))
    else:
        return parsed
    per = max(1, workers)
    return [LogFile(i // per + 1, i % per, path) for i, path in enumerate(paths)]
