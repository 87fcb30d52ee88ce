"""Where the local executor keeps each job's files under its state folder (private to the control plane).

jobs/<job>/                               the job's default working folder when jobs run as the control
                                          plane's own user (kept across attempts, so checkpoints written
                                          there survive a preemption); jobs of per-queue users have theirs
                                          in their user's home (`isolation.py`)
run/<job>/attempt-<n>/attempt.json        what runs now (job id, attempt, workers, MASTER_PORT, resize count)
run/<job>/attempt-<n>/stop.json           a stop was asked for (signal, reason, kill deadline)
run/<job>/attempt-<n>/given_up.json       the attempt was given up here (a node agent's kill): none of its
                                          workers starts here any more, even on a start that arrives late
run/<job>/attempt-<n>/worker-<r>/         spec.json (command, environment, user, cgroup, spawn), claim
                                          (taken by its shim, or by a restart that gave it up), shim.pid,
                                          child.pid, exit.reserve then exit.json
run/<job>/attempt-<n>/resize.json         a resize under way: its count, the new placement, the deadline
run/<job>/attempt-<n>/resize-<k>/         the workers after the k-th resize of the attempt: their own
                                          stop.json and worker-<r>/ folders, as above
tmp/<job>.<n>/                            the attempt's tmpfs while it runs here, when jobs get a private
                                          /tmp and /dev/shm (`namespaces.py`): its tmp/ and shm/
logs/<job>/attempt-<n>/worker-<r>.log     the worker's stdout and stderr (under `--log-dir` when given); after
                                          a resize, rank r's new worker appends to the same file
logs/<job>/attempt-<n>/worker-<r>.log.times  where each second's output starts in it (`logs --since`)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

_PLAIN = re.compile(r"[A-Za-z0-9_.\-]")


def safe_name(job_id: str) -> str:
    """A job id as one folder name: letters, digits, `_`, `-`, `.` kept, anything else %-encoded (reversible,
    and never `.`, `..` or a path with a separator)."""
    out = "".join(c if _PLAIN.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in job_id)
    return "%2E" + out[1:] if out.startswith(".") else out


def job_id_of(folder: str) -> str:
    """The job id a `safe_name` folder stands for."""
    return unquote(folder, errors="strict")


@dataclass(frozen=True, slots=True)
class Layout:
    root: Path
    logs: Path | None = None  # where logs go; None: `logs/` under `root`

    @property
    def log_root(self) -> Path:
        return self.logs if self.logs is not None else self.root / "logs"

    def job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / safe_name(job_id)

    def run_root(self) -> Path:
        return self.root / "run"

    def run_dir(self, job_id: str) -> Path:
        return self.run_root() / safe_name(job_id)

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        return self.run_dir(job_id) / f"attempt-{attempt}"

    def generation_dir(self, job_id: str, attempt: int, resize_count: int = 0) -> Path:
        """The folder of the attempt's workers after its `resize_count`-th resize (0: as launched)."""
        folder = self.attempt_dir(job_id, attempt)
        return folder / f"resize-{resize_count}" if resize_count > 0 else folder

    def worker_dir(self, job_id: str, attempt: int, rank: int, resize_count: int = 0) -> Path:
        return self.generation_dir(job_id, attempt, resize_count) / f"worker-{rank}"

    def tmp_root(self) -> Path:
        return self.root / "tmp"

    def attempt_tmp(self, job_id: str, attempt: int) -> Path:
        return self.tmp_root() / f"{safe_name(job_id)}.{attempt}"

    def log_dir(self, job_id: str) -> Path:
        return self.log_root / safe_name(job_id)

    def log_path(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.log_dir(job_id) / f"attempt-{attempt}" / f"worker-{rank}.log"

    def log_paths(self, job_id: str) -> list[Path]:
        """Every log of the job, by attempt then worker (newest attempt last)."""
        found = []
        for path in self.log_dir(job_id).glob("attempt-*/worker-*.log"):
            attempt = _number(path.parent.name, "attempt-")
            rank = _number(path.stem, "worker-")
            if attempt is not None and rank is not None:
                found.append((attempt, rank, path))
        return [path for _, _, path in sorted(found)]


def _number(name: str, prefix: str) -> int | None:
    rest = name.removeprefix(prefix)
    return int(rest) if rest.isdigit() else None
