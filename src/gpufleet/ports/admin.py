"""What the control plane's API needs from its store beyond the loop's `StateStore`: queues, nodes,
tokens, job queries, idempotency keys, the audit log and jobs' progress histories. Implemented by the SQL
store; every method is one short transaction."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpufleet.domain.checkpoints import AttemptLoss
from gpufleet.domain.cluster import Node
from gpufleet.domain.costs import Budget, BudgetLevel, Charge, Pool, Price, PriceTable
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.progress import JobProgress
from gpufleet.domain.quotas import QueueSpec
from gpufleet.domain.records import JobRecord
from gpufleet.domain.windows import Window
from gpufleet.ports import RequestKind, StateStore


class Role(enum.StrEnum):
    ADMIN = "admin"  # everything
    TEAM = "team"  # submit to, see and cancel the jobs of one queue
    METRICS = "metrics"  # scrape /metrics, nothing else (for Prometheus)


# How long a submit's idempotency key is remembered: a retry within this time returns the job it made.
IDEMPOTENCY_TTL_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Token:
    """An API token as stored: never the secret, only its hash (`secret_hash`, hex SHA-256)."""

    id: str
    name: str
    role: Role
    queue: str | None
    secret_hash: str
    created_at: float
    revoked: bool = False


@dataclass(frozen=True, slots=True)
class Notice:
    """Something worth telling about a job that is not a change of its state (e.g. flagged reserved but
    idle). Transitions are the job's history; notices are remarks beside it."""

    job_id: str
    kind: str
    message: str
    at: float


class JobOrder(enum.StrEnum):
    """What a job listing is sorted by; ties are broken by submission order."""

    SUBMITTED = "submitted"
    NAME = "name"
    QUEUE = "queue"
    STATE = "state"
    USER = "user"


@dataclass(frozen=True, slots=True)
class SubmitKey:
    """A submit's `Idempotency-Key`, per token, with the SHA-256 of what was asked (to tell a retry of the
    same request from a different request under a key already used)."""

    token_id: str
    key: str
    body_hash: str


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One admin action: who (`actor`, the token's name), what (`action` on `target`, with `detail`), when,
    from where (`source`: the client's address, or `local`), and whether it was done or `denied`."""

    at: float
    actor: str
    action: str
    target: str
    detail: str = ""
    source: str = "local"
    token_id: str | None = None
    outcome: str = "ok"


@dataclass(frozen=True, slots=True)
class JobQuery:
    """Filters (all given ones must hold), an order and a page. `before_seq` pages newest first by keys;
    `offset` skips that many matches in the chosen order (pages of a sorted table)."""

    queue: str | None = None
    states: frozenset[JobState] = frozenset()
    name: str | None = None  # exact name
    limit: int = 100
    before_seq: int | None = None  # paging: jobs submitted before this `submit_seq`, newest first
    user: str | None = None  # exact submitter (token name)
    name_contains: str | None = None  # part of the name, any case
    order: JobOrder = JobOrder.SUBMITTED
    ascending: bool = False
    offset: int = 0
    array_id: str | None = None  # the tasks of this array


class AdminStore(StateStore, Protocol):
    def submit_many(
        self,
        jobs: Sequence[Job],
        at: float,
        keys: Sequence[SubmitKey | None] | None = None,
        key_ttl_s: float = IDEMPOTENCY_TTL_S,
    ) -> list[JobRecord | GpufleetError]:
        """Store several new jobs in one transaction; per job, its record or the error that refused it
        (LimitError when its queue's `max_pending` is reached). A job with a key that was used in the last
        `key_ttl_s` gets the job that key made instead (a record with another id), or a SpecError if the key
        came with a different body."""
        ...

    def request_many(self, items: Sequence[tuple[JobId, RequestKind, str]], at: float) -> None:
        """Record requests (job, kind, reason) for many jobs in one transaction."""
        ...

    def set_window(self, window: Window) -> bool:
        """Create or replace a maintenance window or queue reservation (the cluster changes). True if it is new."""
        ...

    def delete_window(self, name: str) -> None:
        """Remove one; UnknownNameError if there is none of that name."""
        ...

    def forget_idempotency_keys(self, before: float) -> int:
        """Drop the keys made before `before`; returns how many."""
        ...

    def backup(self, destination: Path) -> object:
        """Write a consistent copy of the store to `destination` while it stays in use. Raises
        GpufleetError where the store cannot copy itself (its fix names the tool that can)."""
        ...

    def audit(self, entry: AuditEntry) -> None:
        """Add an entry to the audit log."""
        ...

    def audit_log(self, since: float | None = None, limit: int = 1000) -> Sequence[AuditEntry]:
        """Audit entries at or after `since`, oldest first, at most `limit` (the newest ones)."""
        ...

    def set_queue(self, spec: QueueSpec) -> None:
        """Create or replace a queue; bumps the cluster version."""
        ...

    def delete_queue(self, name: str) -> None:
        """Remove a queue. Raises SpecError if it has active jobs or tokens; UnknownNameError if absent."""
        ...

    def set_nodes(self, nodes: Sequence[Node]) -> None:
        """Replace the inventory (at start, from discovery), keeping each node's cordon flag."""
        ...

    def set_node_flags(
        self, name: str, *, cordoned: bool | None = None, healthy: bool | None = None, admits: str | None = None
    ) -> Node:
        """Cordon/uncordon or mark health; bumps the cluster version. UnknownNameError if absent."""
        ...

    def create_token(self, token: Token) -> None: ...

    def token_by_hash(self, secret_hash: str) -> Token | None: ...

    def tokens(self) -> Sequence[Token]: ...

    def revoke_token(self, token_id: str) -> None: ...

    def jobs(self, query: JobQuery) -> Sequence[JobRecord]:
        """Jobs matching the query, in its order (default newest first)."""
        ...

    def count_jobs(self, query: JobQuery) -> int:
        """How many jobs match the query's filters (its order and page ignored)."""
        ...

    def pending_ahead(self, queue: str, priority: int, submit_seq: int, limit: int) -> tuple[int, list[str]]:
        """The pending jobs of `queue` that go before a job of `priority` submitted at `submit_seq` (higher
        priority first, then earlier submission): how many, and the ids of the first `limit` in that order."""
        ...

    def add_notice(self, notice: Notice) -> None:
        """Record a notice on a job. UnknownNameError if there is no such job."""
        ...

    def notices(self, job_id: str) -> Sequence[Notice]:
        """A job's notices, oldest first."""
        ...

    def get_setting(self, key: str) -> str | None: ...

    def set_setting(self, key: str, value: str) -> None: ...

    def job_progress(self, job_id: str) -> JobProgress | None:
        """What the job reported about itself (`domain/progress.py`), or None if it never reported."""
        ...

    def update_progress(self, job_id: str, now: float, update: Callable[[JobProgress], JobProgress]) -> JobProgress:
        """Apply `update` to the job's history in one transaction and return the result."""
        ...

    # --- cost control ---------------------------------------------------------------------------------------

    def prices(self) -> PriceTable:
        """The GPU prices an admin set."""
        ...

    def set_prices(self, prices: Iterable[Price], at: float) -> None:
        """Set these prices (replacing the same model and pool), all or none."""
        ...

    def delete_price(self, model: str, pool: Pool) -> None:
        """UnknownNameError if no price is set for them."""
        ...

    def charges(self, job_ids: Sequence[str]) -> dict[str, dict[float, tuple[Charge, ...]]]:
        """Per job, per the start time of each attempt, the GPUs it held per model and pool, priced then."""
        ...

    def attempt_losses(self, since: float, until: float) -> list[tuple[str, AttemptLoss]]:
        """(job id, the work it lost) of every attempt that ended by preemption, node loss or failure in
        [since, until], oldest first."""
        ...

    def budgets(self) -> dict[str, tuple[Budget, BudgetLevel]]:
        """Every queue's budget and the level it was last found at."""
        ...

    def set_budget(self, budget: Budget) -> None:
        """Set a queue's budget; UnknownNameError for a queue that does not exist."""
        ...

    def delete_budget(self, queue: str) -> None:
        """UnknownNameError if the queue has no budget."""
        ...

    def set_budget_level(self, queue: str, level: BudgetLevel, at: float) -> None:
        """Record the level a queue's budget is at (a spent budget with the action `deprioritise` makes the
        store's `queues()` mark the queue deprioritised)."""
        ...
