"""`gpufleet.Client`: the Python SDK, typed and synchronous, a thin layer over the HTTP API (the CLI uses it).

    from gpufleet import Client

    with Client() as fleet:  # GPUFLEET_URL / GPUFLEET_TOKEN, else `gpufleet login`'s config, else localhost
        job = fleet.run(["python", "train.py"], gpus=1, queue="team-a", output=print)
        print(job.state, job.exit_status)
        prep = fleet.submit(command="python prep.py", gpus=0)
        sweep = fleet.submit(command="python sweep.py", array="0-99%8", depends_on=f"afterok:{prep.id}")
        fleet.wait(sweep.array_id)

Every method raises a `GpufleetError` that says what was wrong and how to fix it: `SpecError` (with each field's
problem) for a spec the control plane refused, `ApiError` (with the HTTP status) for any other refusal,
`JobTimeoutError` when `wait` gave up.

A job's exit status as a shell gives it (`Job.exit_status`): 0 when it succeeded, the code its first failed
worker exited with, 128+N for one killed by signal N (the executors record codes so: 143 for a job cancelled
while it ran), and 1 for a job that ended without an exit code of its own (cancelled before it started,
refused, lost with its node).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.client.transport import (
    IDEMPOTENCY_HEADER,
    ApiError,
    Target,
    Transport,
    new_idempotency_key,
    resolve,
)
from gpufleet.domain.errors import GpufleetError

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
NO_CODE = 1  # a job that ended without an exit code of its own
POLL_S = 0.3
TAIL_FIRST = 64 * 1024  # bytes first asked for `tail_lines`; doubled until that many lines are in
TAIL_MOST = 1 << 20  # the API's largest logs chunk
LIST_PAGE = 1000  # the API's largest page of jobs


class JobTimeoutError(GpufleetError):
    """`Client.wait` gave up before the job (or array) ended; `job` is how it stood then."""

    def __init__(self, job: Job, timeout_s: float) -> None:
        self.job = job
        super().__init__(
            f"job {job.id} is still {job.state} after {timeout_s:g} s",
            "wait longer (timeout=None waits until it ends), or cancel it",
        )


@dataclass(frozen=True)
class Job:
    """A job as the API shows it. The common fields are attributes; `raw` holds every field of the answer."""

    id: str
    name: str
    queue: str
    state: str
    reason: str
    attempt: int
    exit_code: int | None
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    depends_on: tuple[str, ...] = ()
    array_id: str | None = None
    array_task: int | None = None
    array_tasks: int | None = None  # at an array's submit: how many tasks it made
    warnings: tuple[str, ...] = ()  # at submit: what the submitter should know (a quota that never admits it)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, body: Mapping[str, Any]) -> Job:
        return cls(
            id=str(body["id"]),
            name=str(body.get("name") or ""),
            queue=str(body.get("queue") or ""),
            state=str(body["state"]),
            reason=str(body.get("reason") or ""),
            attempt=int(body.get("attempt") or 0),
            exit_code=body.get("exit_code"),
            submitted_at=float(body.get("submitted_at") or 0.0),
            started_at=body.get("started_at"),
            finished_at=body.get("finished_at"),
            depends_on=tuple(body.get("depends_on") or ()),
            array_id=body.get("array_id"),
            array_task=body.get("array_task"),
            array_tasks=body.get("array_tasks"),
            warnings=tuple(body.get("warnings") or ()),
            raw=dict(body),
        )

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def exit_status(self) -> int:
        """The exit status a shell would give for the job (see the module's docstring); 1 while it has not
        ended."""
        if self.state == "succeeded":
            return 0
        if isinstance(self.exit_code, int) and self.exit_code > 0:
            return min(self.exit_code, 255)
        return NO_CODE


@dataclass(frozen=True)
class ArrayStatus:
    """An array's tasks counted by state."""

    id: str
    name: str
    queue: str
    tasks: int
    states: Mapping[str, int]

    @property
    def ended(self) -> bool:
        return sum(n for state, n in self.states.items() if state in TERMINAL_STATES) >= self.tasks

    @property
    def exit_status(self) -> int:
        """0 once every task succeeded, 1 while any has not ended or when one did not succeed."""
        return 0 if self.states.get("succeeded", 0) == self.tasks else NO_CODE


@dataclass(frozen=True)
class BulkResult:
    """What a cancel, hold, release or requeue acted on."""

    verb: str
    matched: int  # jobs selected and in a state the verb acts on
    skipped: int  # selected but in a state it does not act on (a hold of a running job)
    ids: tuple[str, ...]  # the first matched ids
    requested: bool  # False on a dry run
    message: str


@dataclass(frozen=True)
class ConfigChange:
    """One change an apply made (or, on a dry run, would make): `fields` maps a field to (live, file)."""

    kind: str  # queue, budget, price or token
    name: str
    action: str  # create, update or delete
    fields: Mapping[str, tuple[Any, Any]]


@dataclass(frozen=True)
class ApplyResult:
    changes: tuple[ConfigChange, ...]
    unchanged: int  # entries of the config the fleet already matched
    applied: bool  # False on a dry run, or when nothing was to change
    secrets: Mapping[str, str]  # token name -> secret, for the tokens this apply made (shown only here)


class Client(Transport):
    """The control plane's API as Python calls (see the module's docstring). `url` and `token`: given, else
    GPUFLEET_URL and GPUFLEET_TOKEN, else the file `gpufleet login` writes, else http://127.0.0.1:8080 with no
    token."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        target: Target | None = None,
    ) -> None:
        super().__init__(target or resolve(url, token, environment=True), timeout)

    # --- submit -------------------------------------------------------------------------------------------

    def submit(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        command: str | Sequence[str] | None = None,
        retry_for: float = 30.0,
        on_retry: Callable[[str], None] | None = None,
        **fields: Any,
    ) -> Job:
        """Submit a job: `spec` (the fields of a job spec, as in its YAML), with `command` and `fields` added
        (any spec field: gpus, workers, queue, name, env, workdir, array="0-99%8", depends_on="afterok:ID",
        …). A string command runs in a shell; a list runs as given. The submit carries an idempotency key and is
        sent again (for up to `retry_for` seconds) when the control plane cannot be reached, restarts or asks
        to slow down: a retry never makes a second job. Returns the job, or an array's first task with
        `array_id` and `array_tasks` set."""
        body: dict[str, Any] = dict(spec or {})
        if command is not None:
            body["command"] = command if isinstance(command, str) else list(command)
        body.update({key: value for key, value in fields.items() if value is not None})
        answer = self.call(
            "POST",
            "/v1/jobs",
            json_body=body,
            headers={IDEMPOTENCY_HEADER: new_idempotency_key()},
            retry_s=retry_for,
            on_retry=on_retry,
        )
        return Job.from_api(answer)

    def run(
        self,
        command: str | Sequence[str],
        *,
        output: Callable[[str], None] | None = None,
        worker: int = 0,
        timeout: float | None = None,
        **fields: Any,
    ) -> Job:
        """Submit `command` as a job (with any spec `fields`), wait until it ends and return it; with `output`,
        worker `worker`'s output is passed to it as it comes. Raises JobTimeoutError after `timeout` seconds (the
        job goes on: cancel it if you will not wait)."""
        job = self.submit(command=command, **fields)
        if job.array_id:
            raise GpufleetError("run waits for one job, not an array", "submit the array, then `wait(job.array_id)`")
        if output is None:
            return self.wait(job.id, timeout=timeout)
        for text in self.follow(job.id, worker=worker, timeout=timeout):
            output(text)
        return self.job(job.id)

    # --- read ---------------------------------------------------------------------------------------------

    def job(self, job_id: str) -> Job:
        return Job.from_api(self.get(f"/v1/jobs/{job_id}"))

    def jobs(
        self,
        *,
        queue: str | None = None,
        states: Sequence[str] = (),
        name: str | None = None,
        array: str | None = None,
        limit: int = 100,
    ) -> list[Job]:
        """Jobs, newest first (as many as `limit`, fetched a page at a time); `array`: the tasks of that array."""
        found: list[Job] = []
        before: int | None = None
        while len(found) < limit:
            params: dict[str, Any] = {
                "queue": queue,
                "state": list(states) or None,
                "name": name,
                "array": array,
                "limit": min(LIST_PAGE, limit - len(found)),
                "before_seq": before,
            }
            page = self.get("/v1/jobs", **params)
            found.extend(Job.from_api(body) for body in page["jobs"])
            before = page.get("next_before_seq")
            if before is None:
                break
        return found

    def array(self, array_id: str) -> ArrayStatus:
        body = self.get(f"/v1/arrays/{array_id}")
        return ArrayStatus(body["id"], body["name"], body["queue"], int(body["tasks"]), dict(body["states"]))

    def wait(self, job_id: str, *, timeout: float | None = None, poll_s: float = 0.5) -> Job:
        """The job once it has ended (an array's id: its newest task, once every task has ended). Raises
        JobTimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job, ended = self._job_or_array(job_id)
            if ended:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeoutError(job, timeout or 0.0)
            time.sleep(poll_s)

    def _job_or_array(self, job_id: str) -> tuple[Job, bool]:
        try:
            job = self.job(job_id)
            return job, job.ended
        except ApiError as error:
            if error.status != 404:
                raise
            status = self.array(job_id)  # an array's id is no job's: its tasks are ID_N
            tasks = self.jobs(array=job_id, limit=1)
            first = tasks[0] if tasks else None
            if first is None:
                raise
            return first, status.ended

    def logs(
        self,
        job_id: str,
        *,
        worker: int = 0,
        attempt: int | None = None,
        tail_lines: int | None = None,
        since: float | str | None = None,
    ) -> str:
        """A worker's output (of its latest attempt by default): whole, its last `tail_lines` lines, or what it
        wrote `since` a time (epoch seconds, an ISO 8601 time, or an age such as "10m", "2h": see
        `parse_since`), to within a second before."""
        if tail_lines is not None and since is not None:
            raise GpufleetError("logs takes tail_lines or since, not both", "give one of them")
        offset = 0
        if tail_lines is not None:
            offset = self.tail_offset(job_id, tail_lines, worker=worker, attempt=attempt)
        elif since is not None:
            offset = self.since_offset(job_id, since, worker=worker, attempt=attempt)
        parts = []
        while True:
            chunk = self.get(f"/v1/jobs/{job_id}/logs", worker=worker, attempt=attempt, offset=offset)
            parts.append(chunk["text"])
            if chunk["next_offset"] == offset:
                return "".join(parts)
            offset = chunk["next_offset"]

    def since_offset(self, job_id: str, since: float | str, *, worker: int = 0, attempt: int | None = None) -> int:
        """The byte offset in a worker's log where what it wrote `since` a time starts (see `logs`)."""
        at = parse_since(since) if isinstance(since, str) else float(since)
        chunk = self.get(f"/v1/jobs/{job_id}/logs", worker=worker, attempt=attempt, since=at)
        return int(chunk["offset"])

    def tail_offset(self, job_id: str, lines: int, *, worker: int = 0, attempt: int | None = None) -> int:
        """The byte offset where the last `lines` lines of a worker's log start (0 lines: its end). The server
        reads the tail; a log longer than the API's largest chunk gives what that chunk holds."""
        if lines <= 0:
            chunk = self.get(f"/v1/jobs/{job_id}/logs", worker=worker, attempt=attempt, tail=1)
            return int(chunk["offset"]) + len(chunk["text"].encode())
        want = TAIL_FIRST
        while True:
            chunk = self.get(f"/v1/jobs/{job_id}/logs", worker=worker, attempt=attempt, tail=want)
            start, text = int(chunk["offset"]), str(chunk["text"])
            parts = text.splitlines(keepends=True)
            whole = parts[1:] if start > 0 else parts  # the first one may be the end of a line cut by the tail
            if len(whole) >= lines or start == 0 or want >= TAIL_MOST:
                kept = "".join(whole[-lines:])
                return int(chunk["next_offset"]) - len(kept.encode())
            want = min(want * 2, TAIL_MOST)

    def follow(
        self,
        job_id: str,
        *,
        worker: int = 0,
        note: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> Iterator[str]:
        """Worker `worker`'s output as it comes, every attempt in turn from its start (`note` hears when a
        retry starts), until the job has ended and its output is all given. Raises JobTimeoutError after
        `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        reading = 0  # the attempt whose log is being read
        offset = 0
        while True:
            job = self.job(job_id)
            moved = False
            while reading or job.attempt:
                if reading == 0:
                    reading, offset = 1, 0
                complete = False
                for text, next_offset, done in self._available(job_id, worker, reading, offset):
                    offset, complete = next_offset, done
                    if text:
                        moved = True
                        yield text
                if reading >= job.attempt or not complete:
                    break
                reading, offset = reading + 1, 0  # that attempt is over: on to the next
                if note is not None:
                    note(f"attempt {reading} of {job_id} starts")
            if job.ended:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeoutError(job, timeout or 0.0)
            if not moved:
                time.sleep(POLL_S)

    def _available(self, job_id: str, worker: int, attempt: int, offset: int) -> Iterator[tuple[str, int, bool]]:
        """What the attempt's log holds from `offset`, chunk by chunk: (text, the next offset, whether that log
        is complete; a log not there, or no longer, counts as complete once a later attempt exists)."""
        while True:
            try:
                chunk = self.get(f"/v1/jobs/{job_id}/logs", worker=worker, attempt=attempt, offset=offset)
            except ApiError as error:
                if error.status == 404:  # not launched on this worker yet, or its log is gone
                    yield "", offset, True
                    return
                raise
            step = chunk["next_offset"] != offset
            offset = int(chunk["next_offset"])
            done = bool(chunk["complete"])
            yield str(chunk["text"]), offset, done
            if not step or done:
                return

    # --- the fleet's config (admin) ------------------------------------------------------------------------

    def fleet_config(self) -> dict[str, Any]:
        """The fleet's queues, quotas, cohorts, budgets, prices and token bindings, as `apply_config` takes
        them (and `gpufleet export` writes them)."""
        config: dict[str, Any] = self.get("/v1/config")
        return config

    def apply_config(self, config: Mapping[str, Any], *, dry_run: bool = False, prune: bool = False) -> ApplyResult:
        """Make the fleet match `config` for what it names (see `gpufleet apply`): every entry checked first,
        all or nothing (a SpecError names each bad entry); `dry_run` only lists the changes; `prune` also
        removes the queues and prices it does not list."""
        answer = self.post("/v1/config/apply", {"config": dict(config), "dry_run": dry_run, "prune": prune})
        changes = tuple(
            ConfigChange(c["kind"], c["name"], c["action"], {k: (v[0], v[1]) for k, v in c["fields"].items()})
            for c in answer["changes"]
        )
        secrets = {str(t["name"]): str(t["secret"]) for t in answer["tokens"]}
        return ApplyResult(changes, int(answer["unchanged"]), bool(answer["applied"]), secrets)

    # --- act ----------------------------------------------------------------------------------------------

    def cancel(self, *job_ids: str, force: bool = False) -> BulkResult:
        """Cancel these jobs (an array's id: every task of it not ended): checkpoint signal, grace period, then
        kill (`force`: kill now)."""
        return self._bulk("cancel", ids=list(job_ids), force=force)

    def cancel_where(
        self,
        *,
        queue: str | None = None,
        name: str | None = None,
        states: Sequence[str] = (),
        user: str | None = None,
        dry_run: bool = False,
        force: bool = False,
    ) -> BulkResult:
        """Cancel every job the filters match (at least one filter); `dry_run` only counts them."""
        return self._bulk(
            "cancel", queue=queue, name=name, states=list(states), user=user, dry_run=dry_run, force=force
        )

    def hold(self, *job_ids: str, queue: str | None = None, user: str | None = None) -> BulkResult:
        """Hold pending jobs (these, or a queue's, or a user's): the scheduler skips them until released."""
        return self._bulk("hold", ids=list(job_ids), queue=queue, user=user)

    def release(self, *job_ids: str, queue: str | None = None, user: str | None = None) -> BulkResult:
        return self._bulk("release", ids=list(job_ids), queue=queue, user=user)

    def requeue(self, *job_ids: str) -> BulkResult:
        """Stop running jobs (checkpoint signal first) and put them back in their queues."""
        return self._bulk("requeue", ids=list(job_ids))

    def update(
        self,
        job_id: str,
        *,
        priority: int | None = None,
        max_runtime: float | str | None = None,
        gpus: float | None = None,
        queue: str | None = None,
    ) -> Job:
        """Change a pending or held job's priority, runtime limit, GPUs per worker or queue."""
        body = {"priority": priority, "max_runtime": max_runtime, "gpus": gpus, "queue": queue}
        return Job.from_api(self.post(f"/v1/jobs/{job_id}/update", {k: v for k, v in body.items() if v is not None}))

    def _bulk(self, verb: str, **select: Any) -> BulkResult:
        body = {key: value for key, value in select.items() if value not in (None, [], False)}
        if not body.get("ids") and not any(body.get(k) for k in ("queue", "name", "states", "user")):
            raise GpufleetError(f"{verb} needs job ids or a filter", "give ids, or queue=, name=, states= or user=")
        answer = self.post(f"/v1/jobs/{verb}", body)
        return BulkResult(
            verb=str(answer["verb"]),
            matched=int(answer["matched"]),
            skipped=int(answer["skipped"]),
            ids=tuple(answer["ids"]),
            requested=bool(answer["requested"]),
            message=str(answer["message"]),
        )


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """A time as epoch seconds, from an age (`90s`, `10m`, `2h`, `1d`: that long before `now`), an ISO 8601
    time (`2026-12-07T09:30`, local time unless it names its zone), or epoch seconds. Raises GpufleetError."""
    import datetime as dt

    given = text.strip()
    if given and given[-1] in _UNITS:
        try:
            age = float(given[:-1])
        except ValueError:
            age = -1.0
        if age >= 0:
            return (time.time() if now is None else now) - age * _UNITS[given[-1]]
    try:
        return float(given)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(given).timestamp()
    except ValueError:
        raise GpufleetError(
            f"cannot read {text!r} as a time",
            "give an age such as 90s, 10m, 2h or 1d, an ISO 8601 time such as 2026-12-07T09:30, or epoch seconds",
        ) from None
