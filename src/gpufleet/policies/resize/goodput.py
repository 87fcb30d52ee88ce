"""Elastic jobs sized by goodput: grow into idle GPUs, shrink toward min to admit waiting jobs, chosen by
marginal goodput per GPU (the idea of Pollux, Qiao et al., OSDI'21; ours is a greedy allocation, not its
genetic search).

Each job's `goodput[g]` (throughput x statistical efficiency at g GPUs) is given as data. Then:

1. **Shrink to admit.** For each waiting job in order, if the free GPUs do not cover it (and its queue may
   take them), elastic jobs give back one step (a worker) at a time, the one that loses the least goodput
   per GPU first — a job whose loss has flattened loses nothing and gives first — never below its min and
   never a job resized less than `min_interval_s` ago. If even all of that would not admit the job, nobody
   shrinks for it (a shrink that admits nobody only costs restarts).
1b. **Shed** (`shed`, on in `default`): a job whose goodput is higher at a smaller size (a size past its
   node that pays more in synchronisation than it adds) shrinks to its best size when that pays its restart
   within the horizon, never below its min; the GPUs go to the grow below.
2. **Grow.** The free GPUs left go to the job that gains the most goodput per GPU, within its max and its
   queue's quota headroom, one grant at a time; a grant may be several steps when their gain per GPU together
   is the best (goodput need not rise step by step: a job whose next step would cross into another node may
   gain only once it holds several GPUs there); a job that gains nothing (flat goodput: its loss no longer
   falls faster with more GPUs) gets nothing.
3. **Restart cost.** A resize stops the job for `restart_s`. A grow is kept only if the goodput it adds over
   the horizon (`horizon_s`, or the job's remaining time if shorter) exceeds the progress lost while
   restarting; otherwise it is undone and its GPUs go to the next best job.
4. **Rebalance** (`rebalance`, on in `default`): with no GPU idle left, a step moves from the job that loses
   the least goodput per GPU to the one that gains the most, while what the receiver gains over the horizon
   exceeds what the giver loses plus both restarts (each counted once per decision, each job's gain and loss
   relative to its own goodput now, so that jobs reporting in different units compare), times
   `1 + rebalance_margin`. A job that receives does not give in the same decision, nor the reverse. This is
   how a job that starts at its minimum while the others hold every GPU gets its share (Pollux re-allocates
   the whole cluster each round; we move what pays).

5. **Less service first** (`service_scale_s`, `service_exponent`; on in `default`): each gain and loss of goodput
   above (shrink, grow, the restart check and rebalance) counts (1 + attained / service_scale_s) ^ -exponent
   times, attained the GPU-seconds the job has received: of two jobs that would gain alike, the one that has had
   less GPU time grows first and gives back last. Job lengths are unknown, and least attained service stands in
   for shortest remaining time (Tiresias' argument, Gu et al., NSDI'19), as mean JCT asks.

Non-elastic jobs are never given to this plugin; a job with `min_gpus == max_gpus` is never changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from gpufleet.domain.errors import FieldProblem, check
from gpufleet.scheduling.plugin_api import ElasticJob, ResizeInput

UNLIMITED = 1 << 40


@dataclass(frozen=True)
class GoodputResize:
    name: ClassVar[str] = "goodput"
    min_interval_s: float = 300.0
    restart_s: float = 30.0
    horizon_s: float = 1800.0
    rebalance: bool = False
    rebalance_margin: float = 0.0
    shed: bool = False  # a job whose goodput is higher at a smaller size shrinks to it (see the module)
    # Gains weigh less the more GPU time a job has had (see the module, 5); None: every job alike.
    service_scale_s: float | None = None
    service_exponent: float = 0.0

    def __post_init__(self) -> None:
        problems = [
            FieldProblem(name, f"is {value}", "give a finite number >= 0")
            for name, value in (
                ("min_interval_s", self.min_interval_s),
                ("restart_s", self.restart_s),
                ("horizon_s", self.horizon_s),
                ("rebalance_margin", self.rebalance_margin),
                ("service_exponent", self.service_exponent),
            )
            if not (math.isfinite(value) and value >= 0)
        ]
        scale = self.service_scale_s
        if scale is not None and not (math.isfinite(scale) and scale > 0):
            problems.append(FieldProblem("service_scale_s", f"is {scale}", "give GPU-seconds > 0 (None: no weight)"))
        check(problems, "goodput resize")

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
        if self.shed:
            free += self._shed(movable, size, headroom)
        shrunk = {job.id for job in given.jobs if size[job.id] < job.gpus}
        growable = [job for job in movable if job.id not in shrunk]
        free = self._grow(growable, size, headroom, free)
        if self.rebalance:
            self._rebalance(growable, size, headroom)
        return {job.id: size[job.id] for job in given.jobs if size[job.id] != job.gpus}

    def _shed(self, jobs: list[ElasticJob], size: dict[str, int], headroom: dict[str, int]) -> int:
        """Jobs whose goodput is higher at a smaller size (past the restart) shrink to their best size; the
        GPUs freed."""
        freed = 0
        for job in jobs:
            now_at = size[job.id]
            smaller = [g for g in range(job.min_gpus, now_at, job.step) if g in job.goodput]
            if now_at != job.gpus or not smaller:
                continue
            best = max(smaller, key=lambda g: (job.goodput[g], -g))
            if self._worth(job, best):
                back = now_at - best
                size[job.id] = best
                freed += back
                if job.queue in headroom:
                    headroom[job.queue] += back
        return freed

    def _may_resize(self, job: ElasticJob, now: float) -> bool:
        if job.min_gpus >= job.max_gpus:
            return False
        return job.last_resized_at is None or now - job.last_resized_at >= self.min_interval_s

    def _gain(self, job: ElasticJob, frm: int, to: int) -> float:
        """Goodput gained from `frm` to `to` GPUs, weighed by the service the job has had (module, 5)."""
        gained = job.goodput.get(to, 0.0) - job.goodput.get(frm, 0.0)
        if self.service_scale_s is None:
            return gained
        weight: float = (1.0 + job.attained_gpu_s / self.service_scale_s) ** -self.service_exponent
        return gained * weight

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
            best: tuple[float, str, int] | None = None
            for job in jobs:
                if job.id in refused:
                    continue
                now_at = size[job.id]
                room = min(free, headroom.get(job.queue, UNLIMITED))
                for to in range(now_at + job.step, min(job.max_gpus, now_at + room) + 1, job.step):
                    # Per GPU over the whole jump: a job whose next step loses (it would cross into another
                    # node) may still gain once it holds enough GPUs there.
                    gain = self._gain(job, now_at, to) / (to - now_at)
                    if gain > 0 and (best is None or (-gain, job.id, to) < (-best[0], best[1], best[2])):
                        best = (gain, job.id, to)
            if best is None:
                return
            job = next(j for j in jobs if j.id == best[1])
            grown = best[2] - size[job.id]
            size[job.id] = best[2]
            free -= grown
            if job.queue in headroom:
                headroom[job.queue] -= grown

    def _rebalance(self, jobs: list[ElasticJob], size: dict[str, int], headroom: dict[str, int]) -> None:
        """Move steps from the jobs that lose least to those that gain most, while it pays (see the module)."""
        changed = {job.id for job in jobs if size[job.id] != job.gpus}
        gave: set[str] = set()
        took: set[str] = set()
        steps = sorted({job.step for job in jobs})
        while True:
            best: tuple[float, str, str] | None = None
            for step in steps:
                receiver = self._receiver([j for j in jobs if j.step == step and j.id not in gave], size, headroom)
                giver = self._giver([j for j in jobs if j.step == step and j.id not in took], size, receiver)
                if receiver is None or giver is None:
                    continue
                net = self._net(receiver, giver, size, changed)
                if net > 0 and (best is None or (-net, receiver[1].id, giver[1].id) < (-best[0], best[1], best[2])):
                    best = (net, receiver[1].id, giver[1].id)
            if best is None:
                return
            to = next(j for j in jobs if j.id == best[1])
            frm = next(j for j in jobs if j.id == best[2])
            size[to.id] += to.step
            size[frm.id] -= frm.step
            if to.queue in headroom:
                headroom[to.queue] -= to.step
            if frm.queue in headroom:
                headroom[frm.queue] += frm.step
            changed |= {to.id, frm.id}
            took.add(to.id)
            gave.add(frm.id)

    def _relative(self, job: ElasticJob, frm: int, to: int) -> float:
        """Goodput gained from `frm` to `to` GPUs, as a share of the job's goodput at its size now."""
        base = job.goodput.get(job.gpus, 0.0)
        return self._gain(job, frm, to) / base if base > 0 else 0.0

    def _receiver(
        self, jobs: list[ElasticJob], size: dict[str, int], headroom: dict[str, int]
    ) -> tuple[float, ElasticJob] | None:
        best: tuple[float, ElasticJob] | None = None
        for job in jobs:
            to = size[job.id] + job.step
            if to > job.max_gpus or headroom.get(job.queue, UNLIMITED) < job.step:
                continue
            gain = self._relative(job, size[job.id], to)
            if gain > 0 and (best is None or (-gain, job.id) < (-best[0], best[1].id)):
                best = (gain, job)
        return best

    def _giver(
        self, jobs: list[ElasticJob], size: dict[str, int], receiver: tuple[float, ElasticJob] | None
    ) -> tuple[float, ElasticJob] | None:
        best: tuple[float, ElasticJob] | None = None
        for job in jobs:
            to = size[job.id] - job.step
            if to < job.min_gpus or (receiver is not None and job.id == receiver[1].id):
                continue
            loss = -self._relative(job, size[job.id], to)
            if best is None or (loss, job.id) < (best[0], best[1].id):
                best = (loss, job)
        return best

    def _net(
        self,
        receiver: tuple[float, ElasticJob],
        giver: tuple[float, ElasticJob],
        size: dict[str, int],
        changed: set[str],
    ) -> float:
        """What moving one step from giver to receiver pays over the horizon, in seconds of each job's progress
        at its rate now (positive: worth it)."""
        (gain, to), (loss, frm) = receiver, giver
        restart = self.restart_s
        gained = gain * max(0.0, self._horizon(to) - restart) - (0.0 if to.id in changed else restart)
        lost = loss * self._horizon(frm) + (0.0 if frm.id in changed else restart)
        return gained - lost * (1.0 + self.rebalance_margin)

    def _horizon(self, job: ElasticJob) -> float:
        return self.horizon_s if job.remaining_s is None else min(self.horizon_s, job.remaining_s)

    def _worth(self, job: ElasticJob, to: int) -> bool:
        """Whether growing `job` to `to` GPUs pays its restart within the horizon."""
        current = job.goodput.get(job.gpus, 0.0)
        horizon = self.horizon_s if job.remaining_s is None else min(self.horizon_s, job.remaining_s)
        return self._gain(job, job.gpus, to) * max(0.0, horizon - self.restart_s) > current * self.restart_s
