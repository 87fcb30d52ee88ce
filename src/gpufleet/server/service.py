"""What the API does, without HTTP: every rule about who may see and do what lives here.

The loop is the only writer of job state: the service stores submissions and requests (cancel, requeue)
and wakes the loop. Errors are `GpufleetError`s that the API turns into status codes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import math
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet import __version__
from gpufleet.adapters.storage.health import BackupUnsupportedError
from gpufleet.adapters.storage.sql_engine import StoreUnavailableError
from gpufleet.domain.cluster import Node
from gpufleet.domain.errors import FieldProblem, GpufleetError, SpecError
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.quotas import DEFAULT_QUEUE, GPU_MODEL_PREFIX, QueueSpec
from gpufleet.domain.records import JobRecord
from gpufleet.ports import RequestKind
from gpufleet.ports.admin import AdminStore, JobQuery, Role, SubmitKey, Token
from gpufleet.server.admission import FleetFit
from gpufleet.server.array_submit import submit_array
from gpufleet.server.audit import Auditor
from gpufleet.server.auth import Authenticator, Principal, create_token
from gpufleet.server.batcher import SubmitBatcher
from gpufleet.server.chargeback import BudgetWatch
from gpufleet.server.context import ApiContext
from gpufleet.server.gpu_monitor import Telemetry
from gpufleet.server.http_errors import ConflictError, ForbiddenError, NotFoundError, UnavailableError
from gpufleet.server.job_graph import resolve_dependencies, waits_for
from gpufleet.server.log_files import index_logs
from gpufleet.server.ratelimit import RateLimits
from gpufleet.server.schemas import (
    CancelOut,
    DrainOut,
    EventsOut,
    ExplainOut,
    InfoOut,
    JobListOut,
    JobOut,
    JobUsageOut,
    LogsOut,
    NodeOut,
    NoticeOut,
    QueueIn,
    QueueOut,
    QuotaUseOut,
    TelemetryOut,
    TokenCreatedOut,
    TokenOut,
)
from gpufleet.server.spec import JobSpec, format_duration
from gpufleet.server.telemetry_views import fleet_now, job_usage
from gpufleet.server.usage import UsageBook
from gpufleet.server.views import (
    HOLDING,
    event_out,
    from_base,
    job_out,
    node_out,
    queue_out,
    queue_spec,
    queue_usage,
    resource_unit,
    token_out,
    workers_out,
)
from gpufleet.server.views_cost import budget_of

EXPLAIN_AHEAD = 50  # ids of the jobs ahead that `explain` lists (it counts them all)
MAX_LOG_CHUNK = 1 << 20  # bytes per logs call; clients follow with `offset`


def new_job_id() -> JobId:
    return "j-" + secrets.token_hex(4)


@dataclass(frozen=True)
class JobPage:
    jobs: list[JobOut]
    total: int  # jobs matching the filters, over all pages


class QueueCache:
    """Queue specs for checks on the submit path, read from the store at most every `ttl_s` (changes made
    through this process apply at once; another process's within `ttl_s`)."""

    def __init__(self, store: AdminStore, ttl_s: float = 2.0) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._specs: dict[str, QueueSpec] = {}
        self._read_at = -math.inf

    def get(self, name: str) -> QueueSpec | None:
        now = time.monotonic()
        if now - self._read_at > self.ttl_s:
            self._specs = {q.name: q for q in self.store.queues()}
            self._read_at = now
        return self._specs.get(name)

    def forget(self) -> None:
        self._read_at = -math.inf


class Service:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.auth = Authenticator(ctx.store, refuse_team=ctx.team_tokens_refused)
        self.batcher = SubmitBatcher(ctx.store, ctx.wake, key_ttl_s=ctx.idempotency_ttl_s)
        self.audit = Auditor(ctx.store, ctx.clock)
        self.queue_specs = QueueCache(ctx.store)
        self.fleet_fit = FleetFit(ctx.store)
        self.limits = RateLimits(team=ctx.team_rate, admin=ctx.admin_rate)
        self.budgets = ctx.budgets if ctx.budgets is not None else BudgetWatch(ctx.store, ctx.clock, self.usage_book)

    def usage_book(self) -> UsageBook | None:
        """Measured GPU use per job (None where no telemetry runs)."""
        found = self.ctx.extra.get("telemetry")
        return found.book if isinstance(found, Telemetry) else None

    # ------------------------------------------------------------------------------------ helpers

    def _nodes(self) -> dict[str, Node]:
        return {n.name: n for n in self.store.nodes()}

    def _holding(self) -> Sequence[JobRecord]:
        """The jobs that hold resources now: an indexed query, not every active job (pending ones can be
        tens of thousands, and decoding them all would cost seconds)."""
        return self.store.jobs(JobQuery(states=frozenset(HOLDING), limit=1_000_000))

    def _usage(self, queues: Sequence[str]) -> dict[str, dict[str, int]]:
        """`queue_usage` of the holding jobs, with each queue's pending jobs counted by the store."""
        usage = queue_usage(self._holding(), self._nodes())
        for name in queues:
            use = usage.setdefault(name, {"running": 0, "pending": 0})
            use["pending"] = self.store.count_jobs(JobQuery(queue=name, states=frozenset({JobState.PENDING})))
        return usage

    def _queue_names(self) -> set[str]:
        return {q.name for q in self.store.queues()}

    def visible(self, principal: Principal, job_id: JobId) -> JobRecord:
        """The job if the principal may see it; NotFoundError otherwise."""
        return self._visible(principal, job_id)

    def _visible(self, principal: Principal, job_id: JobId) -> JobRecord:
        record = self.store.get(job_id)
        # Another team's job answers as missing, not forbidden: its existence is not theirs to learn.
        if record is None or not principal.may_see(record.job.queue):
            raise NotFoundError(f"no job {job_id!r}", "list your jobs with `gpufleet jobs`")
        return record

    def info(self, principal: Principal) -> InfoOut:
        nodes = self.store.nodes()
        by_model: dict[str, int] = {}
        for node in nodes:
            for gpu in node.gpus:
                by_model[gpu.model] = by_model.get(gpu.model, 0) + 1
        return InfoOut(
            version=__version__,
            emulated=self.ctx.emulated,
            inventory_source=self.ctx.inventory_source,
            policy=self.ctx.policy,
            nodes=len(nodes),
            gpus=sum(by_model.values()),
            gpus_by_model=dict(sorted(by_model.items())),
            role=principal.token.role.value,
            queue=principal.queue,
        )

    # --------------------------------------------------------------------------------------- jobs

    async def submit_async(
        self, principal: Principal, spec: JobSpec, idempotency_key: str | None = None
    ) -> tuple[JobOut, bool]:
        """Submit from the event loop: the commit happens in the batcher's thread, grouped with others.
        Returns the job and whether it was made by an earlier request with the same idempotency key."""
        job = resolve_dependencies(self.store, principal, self.prepare_submit(principal, spec))
        warnings = self.fleet_fit.check(job)
        key = None
        if idempotency_key is not None:
            key = SubmitKey(principal.token.id, idempotency_key, request_hash(job.queue, spec))
        array = spec.array_indexes()
        if array is not None:
            return await asyncio.to_thread(submit_array, self, job, array, key, warnings)
        for _ in range(5):
            try:
                record = await asyncio.wrap_future(self.batcher.submit(job, job.submitted_at, key))
                out = self.submitted(record)
                if warnings:
                    out.warnings = warnings
                return out, record.id != job.id
            except SpecError as error:
                job = self._redraw(job, error)
        raise ConflictError("could not draw a free job id", "submit again")  # pragma: no cover

    @staticmethod
    def new_id() -> JobId:
        return new_job_id()

    def prepare_submit(self, principal: Principal, spec: JobSpec) -> Job:
        queue = spec.queue or principal.queue or DEFAULT_QUEUE
        if not principal.may_see(queue):
            raise ForbiddenError(
                f"token {principal.token.name!r} may submit only to queue {principal.token.queue!r}, not {queue!r}",
                f"set `queue: {principal.token.queue}` or leave it out",
            )
        self._check_grace(queue, float(spec.grace_period))
        self.budgets.blocking(queue)
        now = self.ctx.clock.now()
        job = dataclasses.replace(spec.to_job(new_job_id(), queue, now), user=principal.token.name)
        self.ctx.check_job(job)
        return job

    def _check_grace(self, queue: str, grace_s: float) -> None:
        spec = self.queue_specs.get(queue)
        own = spec.max_grace_s if spec is not None else None
        most = own if own is not None else self.ctx.max_grace_s
        if grace_s > most:
            whose = f"queue {queue!r}'s maximum" if own is not None else "the maximum"
            raise SpecError(
                "job spec",
                (
                    FieldProblem(
                        "grace_period",
                        f"is {format_duration(grace_s)}, above {whose} of {format_duration(most)}",
                        f"give at most {format_duration(most)} (an admin may change it with "
                        f"`gpufleet quota set {queue} --max-grace …`)",
                    ),
                ),
            )

    @staticmethod
    def _redraw(job: Job, error: SpecError) -> Job:
        # A duplicate id (1 in 4 billion): draw another. Any other problem is the user's.
        if not any(f.field == "id" for f in error.fields):
            raise error
        return dataclasses.replace(job, id=new_job_id())

    @staticmethod
    def submitted(record: JobRecord) -> JobOut:
        return job_out(record, {})  # a new job holds nothing: no node look-up (a query) on the hot path

    def list_jobs(
        self,
        principal: Principal,
        *,
        queue: str | None,
        states: Sequence[JobState],
        name: str | None,
        limit: int,
        before_seq: int | None,
        array: str | None = None,
    ) -> JobListOut:
        queue = self._listable_queue(principal, queue)
        query = JobQuery(
            queue=queue, states=frozenset(states), name=name, array_id=array, limit=limit + 1, before_seq=before_seq
        )
        records = self.store.jobs(query)
        page = list(records[:limit])
        more = len(records) > limit
        nodes = self._nodes()
        return JobListOut(
            jobs=[job_out(r, nodes) for r in page],
            next_before_seq=page[-1].job.submit_seq if more and page else None,
        )

    @staticmethod
    def _listable_queue(principal: Principal, queue: str | None) -> str | None:
        """The queue a listing is limited to: a team token lists its own queue only."""
        if principal.queue is None:
            return queue
        if queue is not None and queue != principal.queue:
            raise ForbiddenError(
                f"token {principal.token.name!r} may list only queue {principal.queue!r}",
                f"use --queue {principal.queue} or leave it out",
            )
        return principal.queue

    def find_jobs(self, principal: Principal, query: JobQuery) -> JobPage:
        """One page of the jobs matching `query` (any filters, order and offset) and how many match in all;
        a team token's query is limited to its queue."""
        query = dataclasses.replace(query, queue=self._listable_queue(principal, query.queue))
        records = self.store.jobs(query)
        nodes = self._nodes() if any(r.workers for r in records) else {}
        return JobPage([job_out(r, nodes) for r in records], self.store.count_jobs(query))

    def get_job(self, principal: Principal, job_id: JobId) -> JobOut:
        return job_out(self._visible(principal, job_id), self._nodes())

    def events(self, principal: Principal, job_id: JobId) -> EventsOut:
        self._visible(principal, job_id)
        return EventsOut(
            job_id=job_id,
            events=[event_out(t) for t in self.store.history(job_id)],
            notices=[NoticeOut(kind=n.kind, message=n.message, at=n.at) for n in self.store.notices(job_id)],
        )

    def explain(self, principal: Principal, job_id: JobId) -> ExplainOut:
        record = self._visible(principal, job_id)
        nodes = self._nodes()
        queue = record.job.queue
        position: int | None = None
        ahead: list[str] = []
        if record.state is JobState.PENDING:
            count, ahead = self.store.pending_ahead(queue, record.job.priority, record.job.submit_seq, EXPLAIN_AHEAD)
            position = count + 1
        use = queue_usage(self._holding(), nodes).get(queue, {})
        spec = next((q for q in self.store.queues() if q.name == queue), None)
        quota = self._quota_use(spec, use, record)
        events = [event_out(t) for t in self.store.history(job_id)]
        summary = self._summary(record, position, 0 if position is None else position - 1, spec)
        waits = waits_for(self.store, record) if record.state is JobState.PENDING else []
        array = record.job.array
        if waits:
            summary = f"waiting for its dependencies: {'; '.join(waits)}"
        elif record.state is JobState.PENDING and array is not None and array.throttle and not record.waiting_code:
            summary = f"waiting for a slot of its array: at most {array.throttle} tasks of {array.array_id} run at once"
        return ExplainOut(
            id=job_id,
            state=record.state.value,
            summary=summary,
            waits_for=waits,
            reason=record.reason,
            waiting_code=record.waiting_code,
            waiting_reason=record.waiting_reason,
            queue=queue,
            position=position,
            ahead=ahead,
            quota=quota,
            placement=workers_out(record.workers, nodes),
            exit_code=record.exit_code,
            events=events,
            idle=self._idle(job_id),
            notices=[NoticeOut(kind=n.kind, message=n.message, at=n.at) for n in self.store.notices(job_id)],
            spot_pools=self._spot_words(record),
            budget=self._budget_words(queue),
            elastic=self._elastic_words(record),
        )

    def _elastic_words(self, record: JobRecord) -> str | None:
        """Why a running elastic job holds fewer workers than its most, as far as the API can tell: whether the
        control plane's scheduling profile resizes running jobs at all, and when its resize policy grows one."""
        job = record.job
        held = len(record.workers)
        if not job.resizable or record.state is not JobState.RUNNING or held >= job.workers:
            return None
        start = f"elastic: holds {held} of at most {job.workers} workers"
        if record.resizing:
            return f"{start}; a resize is under way"
        from gpufleet.policies.catalog import profile

        try:
            resize = profile(self.ctx.policy).resize
        except GpufleetError:
            return start
        if resize is None:
            return (
                f"{start}, and stays so: the {self.ctx.policy!r} scheduling profile never resizes a running job "
                "(`gpufleet up --policy default` runs one that does)"
            )
        return (
            f"{start}; the {self.ctx.policy!r} profile's resize policy ({resize.name}) grows a job only into GPUs "
            "no waiting job needs, when the larger size raises its goodput, and not sooner than its last resize "
            "allows; `gpufleet nodes` shows what is free"
        )

    def _spot_words(self, record: JobRecord) -> list[str]:
        """Spot pools whose breaker is not closed, for a waiting job that may use spot capacity."""
        if self.ctx.spot is None or record.job.request.spot == "never" or record.state is not JobState.PENDING:
            return []
        return [p.description for p in self.ctx.spot.pools() if p.state != "closed"]

    def _budget_words(self, queue: str) -> str | None:
        status = self.budgets.status(queue)
        if status is None or status.level.value == "ok":
            return None
        return f"{status.summary()}; action {status.budget.action.value}; {status.reset_text()}"

    def _idle(self, job_id: JobId) -> str | None:
        """The reserved-but-idle flag in words, from the telemetry service when it runs."""
        telemetry: Any = self.ctx.extra.get("telemetry")
        if telemetry is None:
            return None
        flag = telemetry.detector.flagged_jobs().get(job_id)
        if flag is not None:
            minutes = max(0.0, self.ctx.clock.now() - flag.idle_since) / 60
            return (
                f"reserved but idle: its {flag.gpu_milli / 1000:g} GPU(s) have been under "
                f"{telemetry.settings.idle_threshold_pct:g} % utilisation for {minutes:.0f} min"
            )
        last = telemetry.last_flag(job_id)
        if last is not None:
            at = last.get("flagged_at")
            when = (
                datetime.fromtimestamp(at, tz=UTC).isoformat(timespec="seconds")
                if isinstance(at, int | float)
                else "an unknown time"
            )
            return f"was flagged reserved but idle at {when}"
        return None

    @staticmethod
    def _quota_use(spec: QueueSpec | None, use: dict[str, int], record: JobRecord) -> list[QuotaUseOut]:
        keys = set(spec.quotas) if spec is not None else set()
        keys |= {k for k in ("gpu", "cpu", "memory") if use.get(k)}
        keys |= {GPU_MODEL_PREFIX + m for m in record.job.request.models if GPU_MODEL_PREFIX + m in use}
        out: list[QuotaUseOut] = []
        for key in sorted(keys):
            quota = spec.quotas.get(key) if spec is not None else None
            out.append(
                QuotaUseOut(
                    resource=key,
                    used=from_base(key, use.get(key, 0)) or 0.0,
                    nominal=from_base(key, quota.nominal) if quota else None,
                    borrowing_limit=from_base(key, quota.borrowing_limit) if quota else None,
                    unit=resource_unit(key),
                )
            )
        return out

    @staticmethod
    def _summary(record: JobRecord, position: int | None, ahead: int, spec: QueueSpec | None) -> str:
        state = record.state
        if state is JobState.PENDING:
            if spec is None:
                return f"waiting: its queue {record.job.queue!r} no longer exists"
            why = record.waiting_reason or "not considered by the scheduler yet"
            place = f"; #{position} in queue {record.job.queue!r} ({ahead} ahead)" if position else ""
            return f"waiting ({record.waiting_code or 'new'}): {why}{place}"
        nodes = ", ".join(sorted({w.node for w in record.workers}))
        if state in (JobState.ADMITTED, JobState.LAUNCHING):
            return f"starting on {nodes}: {record.reason}"
        if state is JobState.RUNNING:
            return f"running on {nodes} (attempt {record.attempt}): {record.reason}"
        if state is JobState.EVICTING:
            return f"stopping ({record.stop_cause or 'stop'}) on {nodes}: {record.reason}"
        code = f" with exit code {record.exit_code}" if record.exit_code is not None else ""
        # A reason that names the state already ("cancelled: by admin") is not said twice.
        why = record.reason
        if why == state.value or why.startswith(f"{state.value}:"):
            why = why[len(state.value) :].removeprefix(":").strip()
        return f"{state.value}{code}: {why}" if why else f"{state.value}{code}"

    def cancel(self, principal: Principal, job_id: JobId, *, force: bool = False) -> CancelOut:
        """Ask the loop to stop a job for good: with its checkpoint signal and grace period, or, `force`d (its
        owner or an admin), with SIGKILL at once."""
        record = self._visible(principal, job_id)
        if record.state.terminal:
            raise ConflictError(
                f"job {job_id!r} already {record.state.value}", "nothing to cancel; submit it again to rerun it"
            )
        who = principal.token.name
        kind = RequestKind.FORCE_CANCEL if force else RequestKind.CANCEL
        self.store.request(job_id, kind, f"by {who}", self.ctx.clock.now())
        if force:
            self.audit.record(principal, "job.force_cancel", job_id, {"queue": record.job.queue, "was": record.state})
        self.ctx.wake()
        message = (
            "force-cancel requested; the loop kills it (SIGKILL) at once"
            if force
            else "cancel requested; the loop stops it shortly"
        )
        return CancelOut(id=job_id, state=record.state.value, requested=True, message=message)

    def logs(
        self,
        principal: Principal,
        job_id: JobId,
        *,
        worker: int,
        attempt: int | None,
        offset: int,
        tail: int | None = None,
        since: float | None = None,
    ) -> LogsOut:
        """A chunk of a worker's log from byte `offset`, or, with `tail`, its last `tail` bytes, or, with
        `since` (epoch seconds), from the output written then on (to within a second before)."""
        record = self._visible(principal, job_id)
        files = index_logs(list(self.ctx.log_paths(job_id)), record.job.workers)
        available = [f"attempt {f.attempt} worker {f.worker}" for f in files]
        finished = record.state.terminal
        if not files:
            if record.attempt > 0 and not finished:
                # Launched, but the files are not there yet: an empty read, not an error, so `-f` keeps going.
                return LogsOut(
                    job_id=job_id, attempt=record.attempt, worker=worker, path=None, offset=offset,
                    next_offset=offset, text="", complete=False, available=[],
                )  # fmt: skip
            raise NotFoundError(
                f"job {job_id!r} has no logs ({record.state.value}, never started here)",
                "wait until it starts; `gpufleet explain` says why it waits",
            )
        want_attempt = attempt if attempt is not None else max(f.attempt for f in files)
        chosen = next((f for f in files if f.attempt == want_attempt and f.worker == worker), None)
        if chosen is None:
            raise NotFoundError(
                f"job {job_id!r} has no log for attempt {want_attempt}, worker {worker}",
                f"pick one of: {', '.join(available)}",
            )
        try:
            data, start, size = self.ctx.read_log(chosen.path, offset, MAX_LOG_CHUNK, tail, since)
        except GpufleetError as error:
            raise UnavailableError(error.message, error.fix) from None
        next_offset = start + len(data)
        latest = want_attempt == max(f.attempt for f in files)
        complete = next_offset >= size and (finished or not latest)
        return LogsOut(
            job_id=job_id,
            attempt=want_attempt,
            worker=worker,
            path=str(chosen.path),
            offset=start,
            next_offset=next_offset,
            text=data.decode("utf-8", errors="replace"),
            complete=complete,
            available=available,
        )

    # ---------------------------------------------------------------------------------- telemetry

    def gpu_telemetry(self) -> Telemetry:
        """The control plane's GPU telemetry; NotFoundError where it does not run (an API without `up`)."""
        found = self.ctx.extra.get("telemetry")
        if not isinstance(found, Telemetry):
            raise NotFoundError(
                "GPU telemetry is not enabled in this control plane",
                "telemetry runs in a control plane started by `up`",
            )
        return found

    def telemetry(self, who: Principal) -> TelemetryOut:
        """Every GPU's last sample with the job on it and its idle state; each visible queue's waits and use."""
        return fleet_now(self.gpu_telemetry(), self.store, self.ctx, who)

    def job_usage(self, who: Principal, job_id: JobId) -> JobUsageOut:
        """A job's measured GPU use and whether it is reserved-but-idle (and the last time it was flagged)."""
        tel = self.gpu_telemetry()
        return job_usage(tel, self.store, self._visible(who, job_id))

    # ------------------------------------------------------------------------------------- queues

    def queues(self, principal: Principal) -> list[QueueOut]:
        shown = [q for q in sorted(self.store.queues(), key=lambda q: q.name) if principal.may_see(q.name)]
        usage = self._usage([q.name for q in shown])
        budgets, statuses = self.store.budgets(), self.budgets.statuses()
        return [queue_out(spec, usage.get(spec.name, {}), budget_of(budgets, statuses, spec.name)) for spec in shown]

    def set_queue(self, principal: Principal, name: str, body: QueueIn) -> QueueOut:
        self.audit.require_admin(principal, "changing a queue", "queue.set", name)
        check_queue_name(name)
        spec = queue_spec(name, body)
        if spec.run_as is not None:
            try:
                self.ctx.check_run_as(spec.run_as)
            except GpufleetError as error:
                raise SpecError(f"queue {name!r}", (FieldProblem("run_as", error.message, error.fix),)) from None
        try:
            self.ctx.check_queue_disk(name, spec.run_as, spec.disk)
        except GpufleetError as error:
            raise SpecError(f"queue {name!r}", (FieldProblem("disk", error.message, error.fix),)) from None
        self.store.set_queue(spec)
        self.queue_specs.forget()
        self.fleet_fit.forget()
        self.audit.record(principal, "queue.set", name, body.model_dump(exclude_none=True))
        self.ctx.wake()
        budget = budget_of(self.store.budgets(), self.budgets.statuses(), name)
        return queue_out(spec, self._usage([name]).get(name, {}), budget)

    def delete_queue(self, principal: Principal, name: str) -> None:
        self.audit.require_admin(principal, "deleting a queue", "queue.delete", name)
        if name not in self._queue_names():
            raise NotFoundError(f"no queue named {name!r}", "list queues with `gpufleet queues`")
        try:
            self.store.delete_queue(name)
            self.queue_specs.forget()
        except SpecError as error:
            raise ConflictError(
                f"queue {name!r} cannot be deleted: " + "; ".join(f.problem for f in error.fields),
                "; ".join(f.fix for f in error.fields) or "cancel its jobs and revoke its tokens first",
            ) from None
        self.audit.record(principal, "queue.delete", name)
        self.ctx.wake()

    # -------------------------------------------------------------------------------------- nodes

    def nodes(self) -> list[NodeOut]:
        holding = self._holding()
        return [
            node_out(n, holding, self.ctx.is_emulated(n.name)) for n in sorted(self.store.nodes(), key=lambda n: n.name)
        ]

    def _node(self, name: str) -> Node:
        node = self._nodes().get(name)
        if node is None:
            raise NotFoundError(f"no node named {name!r}", "list nodes with `gpufleet nodes`")
        return node

    def set_cordon(self, principal: Principal, name: str, cordoned: bool) -> NodeOut:
        action = "node.cordon" if cordoned else "node.uncordon"
        self.audit.require_admin(principal, "cordoning a node" if cordoned else "uncordoning a node", action, name)
        self._node(name)
        node = self.store.set_node_flags(name, cordoned=cordoned)
        self.audit.record(principal, action, name)
        self.ctx.wake()
        return node_out(node, self._holding(), self.ctx.is_emulated(node.name))

    def drain(self, principal: Principal, name: str) -> DrainOut:
        self.audit.require_admin(principal, "draining a node", "node.drain", name)
        self._node(name)
        node = self.store.set_node_flags(name, cordoned=True)
        now = self.ctx.clock.now()
        requeued: list[str] = []
        for record in self._holding():
            if record.state in HOLDING and any(w.node == name for w in record.workers):
                self.store.request(
                    record.id, RequestKind.REQUEUE, f"node {name} drained by {principal.token.name}", now
                )
                requeued.append(record.id)
        self.audit.record(principal, "node.drain", name, {"requeued": requeued})
        self.ctx.wake()
        return DrainOut(node=node_out(node, self._holding(), self.ctx.is_emulated(node.name)), requeued=requeued)

    def remove_node(self, principal: Principal, name: str) -> None:
        """Forget a node: it leaves `nodes`, the GPU counts and the scheduler's view. Refused while jobs hold
        resources on it (they would lose their place unseen)."""
        self.audit.require_admin(principal, "removing a node", "node.remove", name)
        self._node(name)
        held = sorted(r.id for r in self._holding() if any(w.node == name for w in r.workers))
        if held:
            shown = ", ".join(held[:10]) + (" …" if len(held) > 10 else "")
            raise ConflictError(
                f"node {name!r} holds {len(held)} job(s): {shown}",
                f"drain it first (`gpufleet drain {name}`), wait until they have left it, then remove it",
            )
        self.store.set_nodes([n for n in self.store.nodes() if n.name != name])
        forget = self.ctx.extra.get("forget_node")  # a fleet that keeps its own node list (Ray) forgets it too
        if callable(forget):
            forget(name)
        self.fleet_fit.forget()
        self.audit.record(principal, "node.remove", name)
        self.ctx.wake()

    # ------------------------------------------------------------------------------------- tokens

    def create_token(self, principal: Principal, name: str, role: Role, queue: str | None) -> TokenCreatedOut:
        self.audit.require_admin(principal, "creating tokens", "token.create", name)
        token, secret = create_token(self.store, self.ctx.clock, name, role, queue)
        self.audit.record(principal, "token.create", token.id, {"name": token.name, "role": role.value, "queue": queue})
        return TokenCreatedOut(**token_out(token).model_dump(), secret=secret)

    def tokens(self, principal: Principal) -> list[TokenOut]:
        principal.require_admin("listing tokens")
        return [token_out(t) for t in sorted(self.store.tokens(), key=lambda t: (t.created_at, t.id))]

    def revoke_token(self, principal: Principal, token_id: str) -> TokenOut:
        self.audit.require_admin(principal, "revoking tokens", "token.revoke", token_id)
        tokens: dict[str, Token] = {t.id: t for t in self.store.tokens()}
        token = tokens.get(token_id)
        if token is None:
            raise NotFoundError(f"no token {token_id!r}", "list tokens with `gpufleet token list`")
        if token.revoked:
            raise ConflictError(f"token {token_id!r} is already revoked", "nothing to do")
        admins = [t for t in tokens.values() if t.role is Role.ADMIN and not t.revoked]
        if token.role is Role.ADMIN and len(admins) == 1:
            raise ConflictError(
                "this is the last admin token; revoking it would lock everyone out",
                "create another admin token first (`gpufleet token create NAME --role admin`)",
            )
        self.store.revoke_token(token_id)
        self.auth.forget()
        self.audit.record(principal, "token.revoke", token_id, {"name": token.name, "role": token.role.value})
        return token_out(next(t for t in self.store.tokens() if t.id == token_id))

    # ------------------------------------------------------------------------------------- backup

    def backup(self, principal: Principal) -> Path:
        """A consistent copy of the store in a private temporary folder (the caller sends it, then deletes the
        folder). ConflictError where the store cannot copy itself (PostgreSQL: use pg_dump)."""
        folder = Path(tempfile.mkdtemp(prefix="gpufleet-backup-", dir=self.ctx.scratch_dir))
        path = folder / "gpufleet-backup.db"
        try:
            self.store.backup(path)
        except BackupUnsupportedError as error:
            shutil.rmtree(folder, ignore_errors=True)
            raise ConflictError(error.message, error.fix) from None
        except GpufleetError as error:
            shutil.rmtree(folder, ignore_errors=True)
            raise StoreUnavailableError(f"the backup failed on the server: {error.message}", error.fix) from None
        self.audit.record(principal, "store.backup", "store", {"bytes": path.stat().st_size})
        return path


def request_hash(queue: str, spec: JobSpec) -> str:
    """What a submit asked for, as a SHA-256 of the validated spec (fields in the model's order) and its queue:
    the same request gives the same hash however its JSON was spaced or its fields ordered."""
    return hashlib.sha256(f"{queue}\n{spec.model_dump_json()}".encode()).hexdigest()


def check_queue_name(name: str) -> None:
    """Queue names travel in URLs and YAML: keep them plain."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", name):
        raise SpecError(
            f"queue {name!r}",
            (FieldProblem("name", "is not a plain name", "use letters, digits, '.', '_' or '-', up to 63 chars"),),
        )
