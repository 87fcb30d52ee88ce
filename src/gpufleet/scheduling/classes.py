"""Which jobs share an outcome within a cycle: the keys of the core's caches, defined once.

- `RequestClass`: jobs of one queue asking for the same thing. Once one failed in a cycle, the others fail
  the same way (free resources and quota only shrink); the control loop groups pending jobs by it too.
- `JobClass`: a request class and a priority: jobs that also fare alike when preemption is tried.
- `PlacementClass`: jobs placed alike whatever their queue: request, gang size, the GPU models admission left.
- `FilterClass`: what one worker's filter results depend on: its request and the GPU models it may use.

Request and job classes hold the request's fields rather than the request: equal tuples of ints compare in C,
while equal-but-distinct requests would run the dataclass's Python `__eq__` on every look-up.
"""

from __future__ import annotations

from typing import NamedTuple

from gpufleet.domain.comm import CommNeeds
from gpufleet.domain.jobs import Job
from gpufleet.domain.resources import WorkerRequest

_new = tuple.__new__  # a NamedTuple from a tuple without its Python-level `__new__` (this runs per pending job)


class RequestClass(NamedTuple):
    queue: str
    gpus: int
    gpu_milli: int
    gpu_memory: int
    cpu_milli: int
    memory: int
    models: frozenset[str]
    spot: str
    checkpoints: bool
    gang_size: int  # the workers it needs at least (`Job.gang_size`)
    comm: CommNeeds | None  # what it synchronises: its placements may be refused for communication cost

    @classmethod
    def of(cls, job: Job) -> RequestClass:
        r = job.request
        return _new(
            cls,
            (
                job.queue,
                r.gpus,
                r.gpu_milli,
                r.gpu_memory,
                r.cpu_milli,
                r.memory,
                r.models,
                r.spot,
                r.checkpoints,
                job.min_workers or job.workers,
                job.comm,
            ),
        )


class JobClass(NamedTuple):
    queue: str
    gpus: int
    gpu_milli: int
    gpu_memory: int
    cpu_milli: int
    memory: int
    models: frozenset[str]
    spot: str
    checkpoints: bool
    gang_size: int
    comm: CommNeeds | None
    priority: int

    @classmethod
    def of(cls, job: Job) -> JobClass:
        r = job.request  # one flat tuple, fields read inline: this runs for every pending job in every cycle
        gang = job.min_workers or job.workers
        fields = (job.queue, r.gpus, r.gpu_milli, r.gpu_memory, r.cpu_milli, r.memory, r.models, r.spot, r.checkpoints)
        return _new(cls, (*fields, gang, job.comm, job.priority))

    @property
    def request_class(self) -> RequestClass:
        return _new(RequestClass, self[:-1])


# request, gang size, allowed GPU models (`JobView.model_lut`), communication needs
PlacementClass = tuple[WorkerRequest, int, bytes, CommNeeds | None]
FilterClass = tuple[WorkerRequest, bytes]  # request, allowed GPU models


def placement_class(job: Job, model_lut_bytes: bytes) -> PlacementClass:
    return (job.request, job.gang_size, model_lut_bytes, job.comm)


def filter_class(job: Job, model_lut_bytes: bytes) -> FilterClass:
    return (job.request, model_lut_bytes)
