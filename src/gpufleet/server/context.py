"""What the HTTP API is given by the process that runs it (`gpufleet up`, or a test)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.adapters.local.isolation import IsolationReport
from gpufleet.adapters.local.logs import read_log_file
from gpufleet.domain.jobs import JobId
from gpufleet.ports import Clock
from gpufleet.ports.admin import AdminStore


@dataclass
class ApiContext:
    store: AdminStore
    clock: Clock
    # Log files of a job, oldest attempt first, one per worker (empty when it never ran here).
    log_paths: Callable[[JobId], Sequence[Path]] = lambda _job_id: ()
    # Reads part of one of those logs (offset, limit -> data, start, size): from this machine's disk, or
    # through the agent of the node the log is on.
    read_log: Callable[[Path, int, int], tuple[bytes, int, int]] = read_log_file
    # Tell the control loop that something changed (a submit, a cancel, a quota), so it runs now.
    wake: Callable[[], None] = lambda: None
    emulated: bool = False
    inventory_source: str = "nvml"  # "nvml", "emulated: 8xA100-80GB", "emulated: cluster.yaml"
    policy: str = "default"
    # Prometheus exposition of /metrics (set by the process once telemetry is wired).
    metrics: Callable[[], tuple[bytes, str]] | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # How jobs are isolated (None: not told, e.g. an API without an executor).
    isolation: IsolationReport | None = None
    # Why team tokens are refused (a control plane that runs every job as its own user); None: accepted.
    team_tokens_refused: str | None = None
    # Raises GpufleetError (with a fix) when a queue may not be mapped to this OS user.
    check_run_as: Callable[[str], None] = lambda _user: None
