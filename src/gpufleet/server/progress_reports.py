"""Progress reports: running jobs send them with their job token (`job_tokens.py`); users read the history.

The rules of the history (what each report kind changes, the bounds) are `domain/progress.py`'s; this module
authenticates the job, checks the batch, and hands it to the store in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.domain.errors import FieldProblem, SpecError
from gpufleet.domain.progress import (
    MAX_REPORTS_PER_BATCH,
    JobProgress,
    ReportContext,
    fold,
    parse_report,
    progress_to_dict,
)
from gpufleet.domain.records import JobRecord
from gpufleet.domain.throughput_table import model_key
from gpufleet.ports import Clock, RequestKind
from gpufleet.ports.admin import AdminStore
from gpufleet.server.http_errors import NotFoundError, UnauthorizedError
from gpufleet.server.job_tokens import JobTokens, check_current


def gpus_held(record: JobRecord) -> int:
    """The job's size for throughput: the GPUs its workers hold (its worker count if it holds none)."""
    gpus = sum(len(worker.gpus) for worker in record.workers)
    return gpus or len(record.workers)


class ProgressService:
    def __init__(self, store: AdminStore, clock: Clock, tokens: JobTokens) -> None:
        self.store = store
        self.clock = clock
        self.tokens = tokens
        # (cluster version, (node, GPU index) -> GPU model), read again when nodes change
        self._models: tuple[int, dict[tuple[str, int], str]] = (-1, {})

    def model_held(self, record: JobRecord) -> str:
        """The GPU model the job's workers hold (upper case), or "" when they hold several, or none we know."""
        version = self.store.cluster_version()
        if version != self._models[0]:
            nodes = self.store.nodes()
            self._models = (version, {(n.name, g.index): model_key(g.model) for n in nodes for g in n.gpus})
        models = {self._models[1].get((w.node, share.index), "") for w in record.workers for share in w.gpus}
        return models.pop() if len(models) == 1 else ""

    def receive(self, job_id: str, authorization: str | None, body: Mapping[str, Any]) -> JobProgress:
        """Fold a batch `{"reports": [...]}` into the job's history. Unauthorized (401) for a token that is not
        this job's current attempt's; SpecError (422) naming every bad report field, and then nothing is kept."""
        attempt = self.tokens.attempt_of(authorization, job_id)
        record = self.store.get(job_id)
        if record is None:
            # Only a holder of a valid token of this id gets here: the job was deleted.
            raise UnauthorizedError(f"job {job_id!r} no longer exists", "nothing to do")
        check_current(record, attempt)
        raw = body.get("reports")
        if not isinstance(raw, list) or not raw:
            fix = 'send {"reports": [{"kind": "progress", "samples": …, "loss": …}, …]}'
            raise SpecError("reports", (FieldProblem("reports", "is missing or empty", fix),))
        if len(raw) > MAX_REPORTS_PER_BATCH:
            fix = f"send at most {MAX_REPORTS_PER_BATCH} reports per request"
            raise SpecError("reports", (FieldProblem("reports", f"has {len(raw)} reports", fix),))
        now = self.clock.now()
        problems: list[FieldProblem] = []
        reports = []
        for index, item in enumerate(raw):
            where = f"reports[{index}]"
            if not isinstance(item, dict):
                problems.append(FieldProblem(where, "is not an object", 'send {"kind": …, …}'))
                continue
            try:
                reports.append(parse_report(item, where, now))
            except SpecError as error:
                problems.extend(error.fields)
        if problems:
            raise SpecError("reports", tuple(problems))
        ctx = ReportContext(attempt=attempt, gpus=gpus_held(record), now=now, model=self.model_held(record))
        progress = self.store.update_progress(job_id, now, lambda progress: fold(progress, reports, ctx))
        saved = [r for r in reports if r.kind == "checkpoint"]
        if saved:
            # The control loop learns of it as of a user's request: victim choice and the next start's
            # checkpoint interval read it from the job's record (`Reconciler._checkpoints`).
            last = max(saved, key=lambda r: r.at)
            duration = last.values["duration_s"]
            self.store.request(
                job_id, RequestKind.CHECKPOINT, f"checkpoint saved in {duration:g} s", last.at, value=duration
            )
        return progress

    def history(self, record: JobRecord) -> dict[str, Any] | None:
        progress = self.store.job_progress(record.id)
        if progress is None:
            return None
        out = progress_to_dict(progress)
        del out["anchor"], out["anchor_step"]  # bookkeeping, not facts about the job
        for entry in out["throughput"]:  # type: ignore[attr-defined]
            entry["samples_per_s"] = entry["samples"] / entry["seconds"] if entry["seconds"] > 0 else None
        return out


def not_reported(job_id: str) -> NotFoundError:
    return NotFoundError(
        f"job {job_id!r} has not reported progress",
        "call gpufleet.runtime.report(...) in the job, or POST to $GPUFLEET_REPORT_URL with $GPUFLEET_REPORT_TOKEN",
    )
