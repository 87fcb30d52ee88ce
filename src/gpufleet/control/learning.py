"""What the profile's learner is told about the jobs the loop runs, and what it predicted for pending jobs.

The loop tells the learner (`api.Learner`) when a job starts holding resources and when it stops, and whether
it ran to its own end (it exited) or was stopped, preempted or lost. When a job becomes pending the learner
estimates its run time; the estimates go into every cycle as data (`ClusterView.estimates`), never by the
cycle calling the learner. An estimate stays with its job until the job ends a run on its own (a retried job
is estimated afresh) or leaves for good. Live and simulated loops take this same path.
"""

from __future__ import annotations

from gpufleet.domain.jobs import Job, JobId, RunningJob
from gpufleet.scheduling.plugin_api import Learner, RunEstimate


class Learning:
    def __init__(self, learner: Learner | None) -> None:
        self.learner = learner
        self.estimates: dict[JobId, RunEstimate] = {}

    def started(self, run: RunningJob) -> None:
        if self.learner is not None:
            self.learner.started(run)

    def ended(self, job_id: JobId, now: float, *, finished: bool) -> None:
        if self.learner is None:
            return
        self.learner.ended(job_id, now, finished=finished)
        if finished:
            self.estimates.pop(job_id, None)

    def pending(self, job: Job, now: float) -> None:
        """A job becomes pending (submitted, back after a stop, or found pending at start): estimate it."""
        if self.learner is not None:
            self.estimates[job.id] = self.learner.estimate(job, now, self.estimates.get(job.id))

    def forget(self, job_id: JobId) -> None:
        """The job left for good (succeeded, failed, cancelled)."""
        self.estimates.pop(job_id, None)
