"""Elastic jobs sized by goodput: grow into idle GPUs, shrink toward min to admit waiting jobs, chosen by
marginal goodput per GPU (the idea of Pollux, Qiao et al., OSDI'21; ours is a greedy allocation, not its
genetic search).

Each job's `goodput[g]` (throughput x statistical efficiency at g GPUs) is given as data. Then:

1. **Shrink to admit.** For each waiting job in order, if the free GPUs do not cover it (and its queue may
   take them), elastic jobs give back one step (a worker) at a time, the one that loses the least goodput
   per GPU first — a job whose loss has flattened loses nothing and gives first — never below its min and
   never a job resized less than `min_interval_s` ago. If even all of that would not admit the job, nobody
   shrinks for it (a shrink that admits nobody only costs restarts).
2. **Grow.** The free GPUs left go, one step at a time, to the job that gains the most goodput per GPU, within
   its max and its queue's quota headroom; a job that gains nothing (flat goodput: its loss no longer falls
   faster with more GPUs) gets nothing.
3. **Restart cost.** A resize stops the job for `restart_s`. A grow is kept only if the goodput it adds over
   the horizon (`horizon_s`, or the job's remaining time if shorter) exceeds the progress lost while
   restarting; otherwise it is undone and its GPUs go to the next best job.

Non-elastic jobs are never given to this plugin; a job with `min_gpus == max_gpus` is never changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from gpufleet.scheduling.plugin_api import ElasticJob, ResizeInput

UNLIMITED = 1 << 40


@dataclass(frozen=True)
class GoodputResize:
    name: ClassVar[str] = "goodput"
    min_interval_s: float = 300.0
    restart_s: float = 30.0
    horizon_s: float = 1800.0

    def resize(self, given: ResizeInput) -> Mapping[str, int]:
        size = {job.id: job.gpus for job in given.jobs}
        movable = [job for job in given.jobs if self._may_resize(job, given.now)]
        headroom = {queue: int(room) for queue, room in given.headroom.items()}
        free = given.free_gpus
        for queue, need in given.waiting:
            if headroom.get(queue, UNLIMITED) < need:
                continue  # its quota would refuse it anyway: shrinking others would not admit it
            if free < need:
                taken = self._shrink(movable, size, need - free)
                if taken is None:
                    continue
                for job_id, gpus in taken.items():
                    queue_of = next(j.queue for j in movable if j.id == job_id)
                    if queue_of in headroom:
                        headroom[queue_of] += size[job_id] - gpus
                    free += size[job_id] - gpus
                    size[job_id] = gpus
            free -= need
            if queue in headroom:
                headroom[queue] -= need
        shrunk = {job.id for job in given.jobs if size[job.id] < job.gpus}
        growable = [job for job in movable if job.id not in shrunk]
        free = self._grow(growable, size, headroom, free)
        return {job.id: size[job.id] for job in given.jobs if size[job.id] != job.gpus}

    def _may_resize(self, job: ElasticJob, now: float) -> bool:
        if job.min_gpus >= job.max_gpus:
            return False
        return job.last_resized_at is None or now - job.last_resized_at >= self.min_interval_s

    @staticmethod
    def _gain(job: ElasticJob, frm: int, to: int) -> float:
        return job.goodput.get(to, 0.0) - job.goodput.get(frm, 0.0)

    def _shrink(self, jobs: list[ElasticJob], size: dict[str, int], need: int) -> dict[str, int] | None:
        """New sizes that free at least `need` GPUs, cheapest goodput per GPU first; None if impossible."""
        trial = {job.id: size[job.id] for job in jobs}
        freed = 0
        while freed < need:
            best: tuple[float, str] | None = None
            for job in jobs:
                now_at = trial[job.id]
                if now_at - job.step < job.min_gpus:
                    continue
                loss = -self._gain(job, now_at, now_at - job.step) / job.step
                if best is None or (loss, job.id) < best:
                    best = (loss, job.id)
            if best is None:
                return None
            job = next(j for j in jobs if j.id == best[1])
            trial[job.id] -= job.step
            freed += job.step
        return {job_id: gpus for job_id, gpus in trial.items() if gpus != size[job_id]}

    def _grow(self, jobs: list[ElasticJob], size: dict[str, int], headroom: dict[str, int], free: int) -> int:
        refused: set[str] = set()
        while True:
            start = {job.id: size[job.id] for job in jobs}
            self._fill(jobs, size, headroom, free, refused)
            used = sum(size[j.id] - start[j.id] for j in jobs)
            free -= used
            # Undo the grows not worth their restart; their GPUs go round again to the others.
            undone = [job for job in jobs if size[job.id] > job.gpus and not self._worth(job, size[job.id])]
            if not undone:
                return free
            for job in undone:
                back = size[job.id] - job.gpus
                free += back
                if job.queue in headroom:
                    headroom[job.queue] += back
                size[job.id] = job.gpus
                refused.add(job.id)

    def _fill(
        self, jobs: list[ElasticJob], size: dict[str, int], headroom: dict[str, int], free: int, refused: set[str]
    ) -> None:
        while True:
            best: tuple[float, str] | None = None
            for job in jobs:
                now_at = size[job.id]
                to = now_at + job.step
                if job.id in refused or to > job.max_gpus or job.step > free:
                    continue
                if headroom.get(job.queue, UNLIMITED) < job.step:
                    continue
                gain = self._gain(job, now_at, to) / job.step
                if gain <= 0:
                    continue
                if best is None or (-gain, job.id) < (-best[0], best[1]):
                    best = (gain, job.id)
            if best is None:
                return
            job = next(j for j in jobs if j.id == best[1])
            size[job.id] += job.step
            free -= job.step
            if job.queue in headroom:
                headroom[job.queue] -= job.step

    def _worth(self, job: ElasticJob, to: int) -> bool:
        """Whether growing `job` to `to` GPUs pays its restart within the horizon."""
        current = job.goodput.get(job.gpus, 0.0)
        horizon = self.horizon_s if job.remaining_s is None else min(self.horizon_s, job.remaining_s)
        return self._gain(job, job.gpus, to) * max(0.0, horizon - self.restart_s) > current * self.restart_s
