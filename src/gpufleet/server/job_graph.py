"""Dependencies and arrays at submit: a dependency names jobs that exist and the submitter may see (an array's
id stands for all its tasks), and an array becomes one job per index, written in one batch.

Cycles cannot be made: a dependency names only jobs that exist when it is submitted, and no job's
dependencies change after. What a waiting job waits for, in words, is worked out here too for `explain`.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from gpufleet.domain.dependencies import ArrayTask, Dependency, DepKind, Verdict, judge, split_task_id, task_id
from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.domain.jobs import Job, RunSpec
from gpufleet.domain.records import JobRecord
from gpufleet.ports.admin import AdminStore, JobQuery
from gpufleet.server.auth import Principal

ARRAY_JOB_ENV = "GPUFLEET_ARRAY_JOB_ID"
ARRAY_TASK_ENV = "GPUFLEET_ARRAY_TASK_ID"
_T = TypeVar("_T")
MAX_EXPANDED = 100_000  # parent jobs one submit's dependencies may name, arrays expanded


def _unknown(job_id: str) -> SpecError:
    return SpecError(
        "job spec",
        (
            FieldProblem(
                "depends_on",
                f"names job {job_id!r}, which does not exist or is not yours to see",
                "give the id of a job you can list with `gpufleet jobs` (an array's id, or ARRAYID_N for one task)",
            ),
        ),
    )


def array_task_ids(store: AdminStore, array_id: str) -> list[str]:
    """The ids of an array's tasks, in task order (none: no such array)."""
    records = store.jobs(JobQuery(array_id=array_id, limit=MAX_EXPANDED + 1, ascending=True))
    return [r.id for r in records]


def resolve_dependencies(store: AdminStore, principal: Principal, job: Job) -> Job:
    """`job` with each dependency on an array expanded to its tasks; a SpecError for a job that does not exist
    or the submitter may not see."""
    if not job.depends_on:
        return job
    resolved: list[Dependency] = []
    for dep in job.depends_on:
        if dep.kind is DepKind.SINGLETON:
            resolved.append(dep)
            continue
        record = store.get(dep.job_id)
        if record is not None:
            if not principal.may_see(record.job.queue):
                raise _unknown(dep.job_id)
            resolved.append(dep)
            continue
        tasks = store.jobs(JobQuery(array_id=dep.job_id, limit=MAX_EXPANDED + 1))
        if not tasks or not principal.may_see(tasks[0].job.queue):
            raise _unknown(dep.job_id)
        resolved.extend(Dependency(dep.kind, t.id) for t in sorted(tasks, key=lambda r: r.job.submit_seq))
    if len(resolved) > MAX_EXPANDED:
        raise SpecError(
            "job spec",
            (FieldProblem("depends_on", f"names {len(resolved)} jobs", f"depend on at most {MAX_EXPANDED}"),),
        )
    return dataclasses.replace(job, depends_on=tuple(dict.fromkeys(resolved)))


def array_jobs(job: Job, array_id: str, indexes: tuple[int, ...], throttle: int | None) -> list[Job]:
    """One job per index: id ARRAYID_N, the array's ids in its environment, its place in the array.

    `job` was checked when it was built; a task differs from it only in its id, two environment variables
    gpufleet sets and its place in the array, none of which a check reads, so tasks are copied without running
    the checks again (10,000 tasks are made on one submit's path)."""
    tasks = []
    run = job.run
    base_env = run.env if run is not None else ()
    job_fields = {f: getattr(job, f) for f in _JOB_FIELDS}
    run_fields = {f: getattr(run, f) for f in _RUN_FIELDS} if run is not None else {}
    for index in indexes:
        task_run = None
        if run is not None:
            env = tuple(sorted((*base_env, (ARRAY_JOB_ENV, array_id), (ARRAY_TASK_ENV, str(index)))))
            task_run = _copy(RunSpec, run_fields, env=env)
        task = _copy(
            Job, job_fields, id=task_id(array_id, index), run=task_run, array=ArrayTask(array_id, index, throttle)
        )
        tasks.append(task)
    return tasks


_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job))
_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunSpec))
_set = object.__setattr__


def _copy(cls: type[_T], fields: dict[str, object], **changes: object) -> _T:
    made = cls.__new__(cls)
    for name, value in fields.items():
        _set(made, name, changes.get(name, value) if name in changes else value)
    return made


def waits_for(store: AdminStore, record: JobRecord, limit: int = 20) -> list[str]:
    """A pending job's dependencies that do not hold yet, each with its parent's state (at most `limit`)."""
    words: list[str] = []
    for dep in record.job.depends_on:
        if dep.kind is DepKind.SINGLETON:
            continue
        parent = store.get(dep.job_id)
        if parent is None:
            words.append(f"{dep}: no such job (never satisfied)")
            continue
        verdict = judge(dep.kind, parent.state, parent.first_started_at is not None or parent.holds_resources)
        if verdict is Verdict.WAIT:
            words.append(f"{dep} (now {parent.state.value})")
        elif verdict is Verdict.NEVER:
            words.append(f"{dep}: never satisfied ({dep.job_id} ended {parent.state.value})")
        if len(words) >= limit:
            words.append("…")
            break
    return words


def array_of(job_id: str) -> str | None:
    """The array an id names as a task (`ARRAYID_N`), else None."""
    head, task = split_task_id(job_id)
    return head if task is not None else None
