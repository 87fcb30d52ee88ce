"""Where the local executor keeps each job's files under its state folder.

jobs/<job>/                               the job's default working folder (kept across attempts, so
                                          checkpoints written there survive a preemption)
run/<job>/attempt-<n>/attempt.json        what was launched (job id, attempt, workers, MASTER_PORT)
run/<job>/attempt-<n>/stop.json           a stop was asked for (signal, reason, kill deadline)
run/<job>/attempt-<n>/worker-<r>/         spec.json (command), shim.pid, child.pid, exit.json
logs/<job>/attempt-<n>/worker-<r>.log     the worker's stdout and stderr
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_PLAIN = re.compile(r"[A-Za-z0-9_.\-]")


def safe_name(job_id: str) -> str:
    """A job id as one folder name: letters, digits, `_`, `-`, `.` kept, anything else %-encoded (reversible,
    and never `.`, `..` or a path with a separator)."""
    out = "".join(c if _PLAIN.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in job_id)
    return "%2E" + out[1:] if out.startswith(".") else out


@dataclass(frozen=True, slots=True)
class Layout:
    root: Path

    def job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / safe_name(job_id)

    def run_root(self) -> Path:
        return self.root / "run"

    def attempt_dir(self, job_id: str, attempt: int) -> Path:
        return self.run_root() / safe_name(job_id) / f"attempt-{attempt}"

    def worker_dir(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.attempt_dir(job_id, attempt) / f"worker-{rank}"

    def log_dir(self, job_id: str) -> Path:
        return self.root / "logs" / safe_name(job_id)

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
