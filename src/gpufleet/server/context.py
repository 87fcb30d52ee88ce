"""What the HTTP API is given by the process that runs it (`gpufleet up`, or a test)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.adapters.local.isolation import IsolationReport
from gpufleet.adapters.local.logs import read_log_file
from gpufleet.domain.jobs import Job, JobId
from gpufleet.ports import Clock
from gpufleet.ports.admin import IDEMPOTENCY_TTL_S, AdminStore
from gpufleet.server.chargeback import BudgetWatch
from gpufleet.server.limits import DEFAULT_MAX_GRACE_S
from gpufleet.server.ratelimit import ADMIN_RATE, TEAM_RATE, Rate
from gpufleet.server.spot_watch import SpotWatch


@dataclass
class ApiContext:
    store: AdminStore
    clock: Clock
    # Log files of a job, oldest attempt first, one per worker (empty when it never ran here).
    log_paths: Callable[[JobId], Sequence[Path]] = lambda _job_id: ()
    # Reads part of one of those logs (offset, limit, tail -> data, start, size): from this machine's disk, or
    # through the agent of the node the log is on.
    read_log: Callable[[Path, int, int, int | None, float | None], tuple[bytes, int, int]] = read_log_file
    # Tell the control loop that something changed (a submit, a cancel, a quota), so it runs now.
    wake: Callable[[], None] = lambda: None
    emulated: bool = False
    # Whether a node's GPUs are emulated, when the fleet mixes both (nodes of a Ray cluster); None: `emulated`.
    emulated_node: Callable[[str], bool] | None = None
    inventory_source: str = "nvml"  # "nvml", "emulated: 8xA100-80GB", "emulated: cluster.yaml"
    policy: str = "default"
    # Prometheus exposition of /metrics (set by the process once telemetry is wired).
    metrics: Callable[[], tuple[bytes, str]] | None = None
    # /metrics lists job ids, queues and hostnames: it needs a metrics (or admin) token, on loopback too (a job
    # on this host is a local process), unless `up --public-metrics`.
    metrics_need_token: bool = True
    # The longest grace_period a job may ask in a queue whose admin set no maximum of its own.
    max_grace_s: float = DEFAULT_MAX_GRACE_S
    team_rate: Rate = TEAM_RATE  # requests per token of each role (see ratelimit.py)
    admin_rate: Rate = ADMIN_RATE
    idempotency_ttl_s: float = IDEMPOTENCY_TTL_S  # how long a submit's Idempotency-Key is remembered
    # Where `up` keeps its state; the dashboard opens simulation results under it (None: no such folder).
    data_dir: Path | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # Where the API writes temporary files (a backup on its way to the client); None: the system's temp dir.
    scratch_dir: Path | None = None
    # How jobs are isolated (None: not told, e.g. an API without an executor).
    isolation: IsolationReport | None = None
    # Why team tokens are refused (a control plane that runs every job as its own user); None: accepted.
    team_tokens_refused: str | None = None
    # Raises GpufleetError (with a fix) when a queue may not be mapped to this OS user.
    check_run_as: Callable[[str], None] = lambda _user: None
    # What the executor cannot run, refused at submit (SpecError): an image without a container runtime, a job
    # without one on Kubernetes.
    check_job: Callable[[Job], None] = lambda _job: None
    # Raises GpufleetError (with a fix) when a queue's disk quota may not become this size (queue, its mapped
    # user, the size; None: the default); applies it where it can at once.
    check_queue_disk: Callable[[str, str | None, int | None], None] = lambda _queue, _user, _size: None
    # Where queues stand against their budgets (None: the API makes its own, checked when a budget changes).
    budgets: BudgetWatch | None = None
    # The spot pools' circuit breakers (None: no spot watch runs, e.g. an API without `up`).
    spot: SpotWatch | None = None

    def is_emulated(self, node: str) -> bool:
        return self.emulated if self.emulated_node is None else self.emulated_node(node)
