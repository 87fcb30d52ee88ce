"""What the API does, without HTTP: every rule about who may see and do what lives here.

The loop is the only writer of job state: the service stores submissions and requests (cancel, requeue)
and wakes the loop. Errors are `GpufleetError`s that the API turns into status codes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet import __version__
from gpufleet.domain.cluster import Node
from gpufleet.domain.errors import FieldProblem, GpufleetError, SpecError
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.quotas import DEFAULT_QUEUE, GPU_MODEL_PREFIX, QueueSpec
from gpufleet.domain.records import JobRecord
from gpufleet.ports import RequestKind
from gpufleet.ports.admin import JobQuery, Role, Token
from gpufleet.server.auth import Authenticator, Principal, create_token
from gpufleet.server.batcher import SubmitBatcher
from gpufleet.server.context import ApiContext
from gpufleet.server.errors import ConflictError, ForbiddenError, NotFoundError, UnavailableError
from gpufleet.server.schemas import (
    CancelOut,
    DrainOut,
    EventsOut,
    ExplainOut,
    InfoOut,
    JobListOut,
    JobOut,
    LogsOut,
    NodeOut,
    NoticeOut,
    QueueIn,
    QueueOut,
    QuotaUseOut,
    TokenCreatedOut,
    TokenOut,
)
from gpufleet.server.spec import JobSpec
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

MAX_LOG_CHUNK = 1 << 20  # bytes per logs call; clients follow with `offset`
_ATTEMPT_RE = re.compile(r"attempt[-_.]?(\d+)", re.IGNORECASE)
_WORKER_RE = re.compile(r"(?:worker|rank)[-_.]?(\d+)", re.IGNORECASE)


def new_job_id() -> JobId:
    return "j-" + secrets.token_hex(4)


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


class Service:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.auth = Authenticator(ctx.store, refuse_team=ctx.team_tokens_refused)
        self.batcher = SubmitBatcher(ctx.store, ctx.wake)

    # ------------------------------------------------------------------------------------ helpers

    def _nodes(self) -> dict[str, Node]:
        return {n.name: n for n in self.store.nodes()}

    def _queue_names(self) -> set[str]:
        return {q.name for q in self.store.queues()}

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

    async def submit_async(self, principal: Principal, spec: JobSpec) -> JobOut:
        """Submit from the event loop: the commit happens in the batcher's thread, grouped with others."""
        job = self.prepare_submit(principal, spec)
        for _ in range(5):
            try:
                return self.submitted(await asyncio.wrap_future(self.batcher.submit(job, job.submitted_at)))
            except SpecError as error:
                job = self._redraw(job, error)
        raise ConflictError("could not draw a free job id", "submit again")  # pragma: no cover

    def prepare_submit(self, principal: Principal, spec: JobSpec) -> Job:
        queue = spec.queue or principal.queue or DEFAULT_QUEUE
        if not principal.may_see(queue):
            raise ForbiddenError(
                f"token {principal.token.name!r} may submit only to queue {principal.token.queue!r}, not {queue!r}",
                f"set `queue: {principal.token.queue}` or leave it out",
            )
        now = self.ctx.clock.now()
        return spec.to_job(new_job_id(), queue, now)

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
    ) -> JobListOut:
        if principal.queue is not None:
            if queue is not None and queue != principal.queue:
                raise ForbiddenError(
                    f"token {principal.token.name!r} may list only queue {principal.queue!r}",
                    f"use --queue {principal.queue} or leave it out",
                )
            queue = principal.queue
        records = self.store.jobs(
            JobQuery(queue=queue, states=frozenset(states), name=name, limit=limit + 1, before_seq=before_seq)
        )
        page = list(records[:limit])
        more = len(records) > limit
        nodes = self._nodes()
        return JobListOut(
            jobs=[job_out(r, nodes) for r in page],
            next_before_seq=page[-1].job.submit_seq if more and page else None,
        )

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
        active = self.store.active()
        position: int | None = None
        ahead: list[str] = []
        if record.state is JobState.PENDING:
            waiting = sorted(
                (r for r in active if r.job.queue == queue and r.state is JobState.PENDING),
                key=lambda r: (-r.job.priority, r.job.submit_seq, r.id),
            )
            ids = [r.id for r in waiting]
            if job_id in ids:
                position = ids.index(job_id) + 1
                ahead = ids[: position - 1]
        use = queue_usage(active, nodes).get(queue, {})
        spec = next((q for q in self.store.queues() if q.name == queue), None)
        quota = self._quota_use(spec, use, record)
        events = [event_out(t) for t in self.store.history(job_id)]
        return ExplainOut(
            id=job_id,
            state=record.state.value,
            summary=self._summary(record, position, len(ahead), spec),
            reason=record.reason,
            waiting_code=record.waiting_code,
            waiting_reason=record.waiting_reason,
            queue=queue,
            position=position,
            ahead=ahead[:50],
            quota=quota,
            placement=workers_out(record.workers, nodes),
            exit_code=record.exit_code,
            events=events,
            idle=self._idle(job_id),
            notices=[NoticeOut(kind=n.kind, message=n.message, at=n.at) for n in self.store.notices(job_id)],
        )

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
        return f"{state.value}{code}: {record.reason}"

    def cancel(self, principal: Principal, job_id: JobId) -> CancelOut:
        record = self._visible(principal, job_id)
        if record.state.terminal:
            raise ConflictError(
                f"job {job_id!r} already {record.state.value}", "nothing to cancel; submit it again to rerun it"
            )
        who = principal.token.name
        self.store.request(job_id, RequestKind.CANCEL, f"cancelled by {who}", self.ctx.clock.now())
        self.ctx.wake()
        return CancelOut(
            id=job_id, state=record.state.value, requested=True, message="cancel requested; the loop stops it shortly"
        )

    def logs(self, principal: Principal, job_id: JobId, *, worker: int, attempt: int | None, offset: int) -> LogsOut:
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
            data, start, size = self.ctx.read_log(chosen.path, offset, MAX_LOG_CHUNK)
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

    # ------------------------------------------------------------------------------------- queues

    def queues(self, principal: Principal) -> list[QueueOut]:
        active = self.store.active()
        usage = queue_usage(active, self._nodes())
        return [
            queue_out(spec, usage.get(spec.name, {}))
            for spec in sorted(self.store.queues(), key=lambda q: q.name)
            if principal.admin or spec.name == principal.queue
        ]

    def set_queue(self, principal: Principal, name: str, body: QueueIn) -> QueueOut:
        principal.require_admin("changing a queue")
        check_queue_name(name)
        spec = queue_spec(name, body)
        if spec.run_as is not None:
            try:
                self.ctx.check_run_as(spec.run_as)
            except GpufleetError as error:
                raise SpecError(f"queue {name!r}", (FieldProblem("run_as", error.message, error.fix),)) from None
        self.store.set_queue(spec)
        self.ctx.wake()
        usage = queue_usage(self.store.active(), self._nodes())
        return queue_out(spec, usage.get(name, {}))

    def delete_queue(self, principal: Principal, name: str) -> None:
        principal.require_admin("deleting a queue")
        if name not in self._queue_names():
            raise NotFoundError(f"no queue named {name!r}", "list queues with `gpufleet queues`")
        try:
            self.store.delete_queue(name)
        except SpecError as error:
            raise ConflictError(
                f"queue {name!r} cannot be deleted: " + "; ".join(f.problem for f in error.fields),
                "; ".join(f.fix for f in error.fields) or "cancel its jobs and revoke its tokens first",
            ) from None
        self.ctx.wake()

    # -------------------------------------------------------------------------------------- nodes

    def nodes(self) -> list[NodeOut]:
        active = self.store.active()
        return [node_out(n, active, self.ctx.emulated) for n in sorted(self.store.nodes(), key=lambda n: n.name)]

    def _node(self, name: str) -> Node:
        node = self._nodes().get(name)
        if node is None:
            raise NotFoundError(f"no node named {name!r}", "list nodes with `gpufleet nodes`")
        return node

    def set_cordon(self, principal: Principal, name: str, cordoned: bool) -> NodeOut:
        principal.require_admin("cordoning a node" if cordoned else "uncordoning a node")
        self._node(name)
        node = self.store.set_node_flags(name, cordoned=cordoned)
        self.ctx.wake()
        return node_out(node, self.store.active(), self.ctx.emulated)

    def drain(self, principal: Principal, name: str) -> DrainOut:
        principal.require_admin("draining a node")
        self._node(name)
        node = self.store.set_node_flags(name, cordoned=True)
        now = self.ctx.clock.now()
        requeued: list[str] = []
        for record in self.store.active():
            if record.state in HOLDING and any(w.node == name for w in record.workers):
                self.store.request(
                    record.id, RequestKind.REQUEUE, f"node {name} drained by {principal.token.name}", now
                )
                requeued.append(record.id)
        self.ctx.wake()
        return DrainOut(node=node_out(node, self.store.active(), self.ctx.emulated), requeued=requeued)

    # ------------------------------------------------------------------------------------- tokens

    def create_token(self, principal: Principal, name: str, role: Role, queue: str | None) -> TokenCreatedOut:
        principal.require_admin("creating tokens")
        token, secret = create_token(self.store, self.ctx.clock, name, role, queue)
        return TokenCreatedOut(**token_out(token).model_dump(), secret=secret)

    def tokens(self, principal: Principal) -> list[TokenOut]:
        principal.require_admin("listing tokens")
        return [token_out(t) for t in sorted(self.store.tokens(), key=lambda t: (t.created_at, t.id))]

    def revoke_token(self, principal: Principal, token_id: str) -> TokenOut:
        principal.require_admin("revoking tokens")
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
        return token_out(next(t for t in self.store.tokens() if t.id == token_id))


def check_queue_name(name: str) -> None:
    """Queue names travel in URLs and YAML: keep them plain."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", name):
        raise SpecError(
            f"queue {name!r}",
            (FieldProblem("name", "is not a plain name", "use letters, digits, '.', '_' or '-', up to 63 chars"),),
        )
