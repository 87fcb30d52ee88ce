"""Verbs on many jobs at once: cancel, hold, release and requeue by ids (an array's id means all its tasks,
ARRAYID_N one task), by name, queue and state; and update of a waiting job's priority, runtime limit, GPUs and
queue. The rules are cancel's: a job the caller may not see is not there; a team token acts on its queue only.
Each is a request the loop turns into a transition (the loop is the only writer of job state)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from gpufleet.control.holds import updated
from gpufleet.domain.dependencies import split_task_id
from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.domain.lifecycle import TERMINAL, JobState
from gpufleet.domain.records import JobRecord
from gpufleet.ports import RequestKind
from gpufleet.ports.admin import JobQuery
from gpufleet.server.auth import Principal
from gpufleet.server.http_errors import ConflictError, ForbiddenError, NotFoundError
from gpufleet.server.limits import MAX_GPUS_PER_WORKER
from gpufleet.server.schemas import JobOut
from gpufleet.server.spec import parse_duration
from gpufleet.server.views import job_out

if TYPE_CHECKING:
    from gpufleet.server.service import Service

MAX_SELECTED = 1_000_000
LISTED = 50  # ids an answer lists (it counts them all)

S = JobState
# The states each verb acts on; a selected job in another state is counted as skipped.
APPLIES: dict[str, frozenset[JobState]] = {
    "cancel": frozenset(s for s in JobState if s not in TERMINAL),
    "hold": frozenset({S.PENDING}),
    "release": frozenset({S.HELD}),
    "requeue": frozenset({S.RUNNING, S.LAUNCHING}),
}
KIND = {
    "hold": RequestKind.HOLD,
    "release": RequestKind.RELEASE,
    "requeue": RequestKind.REQUEUE,
}


class SelectIn(BaseModel):
    """Which jobs: the ids given (an array's id: all its tasks), narrowed by the filters given; without ids, every
    job the filters match (at least one filter then)."""

    ids: list[str] = Field([], max_length=10_000)
    name: str | None = Field(None, max_length=200)
    queue: str | None = Field(None, max_length=63)
    states: list[JobState] = []
    user: str | None = Field(None, max_length=200)
    dry_run: bool = Field(False, description="Only count and list what would be acted on.")
    force: bool = Field(False, description="cancel only: kill at once (SIGKILL), whatever the grace period.")


class BulkOut(BaseModel):
    verb: str
    matched: int = Field(description="Jobs selected and in a state the verb acts on.")
    skipped: int = Field(description="Jobs selected but in a state it does not act on (e.g. hold of a running job).")
    ids: list[str] = Field(description=f"The first {LISTED} matched ids.")
    requested: bool = Field(description="False on a dry run: nothing was asked of the loop.")
    message: str


class ArrayOut(BaseModel):
    id: str
    name: str
    queue: str
    tasks: int
    states: dict[str, int] = Field(description="Tasks by state (states with none left out).")


class UpdateIn(BaseModel):
    priority: int | None = Field(None, ge=-1_000_000, le=1_000_000)
    max_runtime: float | str | None = Field(None, description="Longest run of one attempt: 2h, 30m or seconds.")
    gpus: float | None = Field(None, gt=0, le=MAX_GPUS_PER_WORKER)
    queue: str | None = Field(None, max_length=63)


class JobVerbs:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.store = service.store

    def select(self, principal: Principal, body: SelectIn) -> list[JobRecord]:
        """The jobs `body` names that `principal` may see, oldest first."""
        if not body.ids and not (body.name or body.queue or body.states or body.user):
            raise SpecError(
                "selection",
                (FieldProblem("ids", "are empty and no filter is given", "name jobs, or give --name, --queue, "
                 "--state or --user"),),
            )  # fmt: skip
        queue = self.service._listable_queue(principal, body.queue)
        states = frozenset(body.states)
        if not body.ids:
            query = JobQuery(
                queue=queue, states=states, name=body.name, user=body.user, limit=MAX_SELECTED, ascending=True
            )
            return list(self.store.jobs(query))
        found: dict[str, JobRecord] = {}
        for job_id in dict.fromkeys(body.ids):
            for record in self._named(principal, job_id):
                found[record.id] = record
        kept = [
            r
            for r in found.values()
            if (queue is None or r.job.queue == queue)
            and (not states or r.state in states)
            and (body.name is None or r.job.name == body.name)
            and (body.user is None or r.job.user == body.user)
        ]
        return sorted(kept, key=lambda r: r.job.submit_seq)

    def _named(self, principal: Principal, job_id: str) -> Sequence[JobRecord]:
        record = self.store.get(job_id)
        if record is not None and principal.may_see(record.job.queue):
            return [record]
        if record is None and split_task_id(job_id)[1] is None:
            tasks = self.store.jobs(JobQuery(array_id=job_id, limit=MAX_SELECTED))
            if tasks and principal.may_see(tasks[0].job.queue):
                return tasks
        raise NotFoundError(f"no job or array {job_id!r}", "list your jobs with `gpufleet jobs`")

    def act(self, principal: Principal, verb: str, body: SelectIn) -> BulkOut:
        selected = self.select(principal, body)
        applies = APPLIES[verb]
        matched = [r for r in selected if r.state in applies]
        if body.force and verb != "cancel":
            raise SpecError("selection", (FieldProblem("force", f"is given to {verb}", "use it with cancel only"),))
        ids = [r.id for r in matched]
        if not body.dry_run and matched:
            who = principal.token.name
            kind = (RequestKind.FORCE_CANCEL if body.force else RequestKind.CANCEL) if verb == "cancel" else KIND[verb]
            self.store.request_many([(job_id, kind, f"by {who}") for job_id in ids], self.service.ctx.clock.now())
            if body.force:
                for record in matched:
                    self.service.audit.record(
                        principal, "job.force_cancel", record.id, {"queue": record.job.queue, "was": record.state}
                    )
            self.service.ctx.wake()
        skipped = len(selected) - len(matched)
        what = f"{len(matched)} job(s)" + (f", {skipped} skipped (not {'/'.join(sorted(applies))})" if skipped else "")
        said = "force-cancel" if body.force else verb
        message = f"would {said} {what}" if body.dry_run else f"{said} requested for {what}"
        if body.force:
            message += ": killed at once (SIGKILL), without their grace period"
        return BulkOut(
            verb=verb,
            matched=len(matched),
            skipped=skipped,
            ids=ids[:LISTED],
            requested=not body.dry_run and bool(matched),
            message=message,
        )

    def update(self, principal: Principal, job_id: str, body: UpdateIn) -> JobOut:
        """A waiting (pending or held) job's new priority, runtime limit, GPUs per worker or queue."""
        record = self.service.visible(principal, job_id)
        if record.state not in (S.PENDING, S.HELD):
            raise ConflictError(
                f"job {job_id!r} is {record.state.value}", "only a pending or held job can be updated; requeue it first"
            )
        fields: dict[str, object] = {}
        if body.priority is not None:
            fields["priority"] = body.priority
        if body.max_runtime is not None:
            fields["max_runtime_s"] = parse_duration(body.max_runtime)
        if body.gpus is not None:
            if body.gpus > 1 and body.gpus != int(body.gpus):
                raise SpecError(
                    "update", (FieldProblem("gpus", f"is {body.gpus}", "give a fraction below 1 or a whole number"),)
                )
            if body.gpus < 1 and record.job.workers > 1:
                raise SpecError("update", (FieldProblem("gpus", "is a fraction for a gang", "give whole GPUs"),))
            fields["gpus"] = body.gpus
        if body.queue is not None and body.queue != record.job.queue:
            if not principal.may_see(body.queue):
                raise ForbiddenError(
                    f"token {principal.token.name!r} may not move jobs to queue {body.queue!r}",
                    f"keep it in {principal.queue!r}",
                )
            if self.service.queue_specs.get(body.queue) is None:
                raise NotFoundError(f"queue {body.queue!r} does not exist", "list queues with `gpufleet queues`")
            fields["queue"] = body.queue
        if not fields:
            raise SpecError(
                "update", (FieldProblem("fields", "none given", "give --priority, --max-runtime, --gpus or --queue"),)
            )
        self.service.fleet_fit.check(updated(record.job, fields))  # refuses GPUs no node has
        fields["by"] = principal.token.name
        self.store.request(job_id, RequestKind.UPDATE, json.dumps(fields), self.service.ctx.clock.now())
        self.service.ctx.wake()
        return job_out(record, {})

    def array(self, principal: Principal, array_id: str) -> ArrayOut:
        """An array's tasks counted by state (counted by the store: a 10,000-task array is not decoded)."""
        first = self.store.jobs(JobQuery(array_id=array_id, limit=1))
        if not first or not principal.may_see(first[0].job.queue):
            raise NotFoundError(f"no array {array_id!r}", "list your jobs with `gpufleet jobs`")
        counts = {s.value: self.store.count_jobs(JobQuery(array_id=array_id, states=frozenset({s}))) for s in JobState}
        job = first[0].job
        return ArrayOut(
            id=array_id,
            name=job.name,
            queue=job.queue,
            tasks=sum(counts.values()),
            states={k: v for k, v in counts.items() if v},
        )
