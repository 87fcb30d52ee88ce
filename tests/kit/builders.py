"""Builders for the domain types the scheduling core reads: jobs, nodes, clusters, queues.

Builders, not mocks: every `build()` returns the real frozen domain object, so its validation runs.
Units in the builder API are the ones people think in (GPUs, GiB, cores); `build()` converts them
to the base units of the domain (milli-GPU, bytes, milli-cores).

    make_job("a").gpus(4).queue("team-a").priority(3).build()
    cluster().nodes(4, "A100-80GB", gpus=8, nvlink_groups=2, rack="r1").snapshot(queues=[...])
    queue("team-a").gpus(16).cohort("research").build()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from gpufleet.domain import (
    MILLI_PER_GPU,
    ClusterSnapshot,
    GiB,
    Job,
    Node,
    QueueSpec,
    Quota,
    RunningJob,
    WorkerRequest,
    gpu_model_key,
    make_node,
)

# GPU memory per model, as the hardware has it. Unknown models get 80 GiB.
GPU_MEMORY_GIB: dict[str, int] = {
    "A100-80GB": 80,
    "A100-40GB": 40,
    "H100": 80,
    "V100": 32,
    "L4": 24,
    "T4": 16,
}
DEFAULT_QUEUE = "default"


def milli(gpus: float) -> int:
    """GPUs (possibly fractional) in milli-GPU."""
    return round(gpus * MILLI_PER_GPU)


class JobBuilder:
    """A job with one whole GPU per worker in queue `default`, unless told otherwise."""

    def __init__(self, job_id: str) -> None:
        self._id = job_id
        self._queue = DEFAULT_QUEUE
        self._gpus = 1
        self._gpu_milli = MILLI_PER_GPU
        self._gpu_memory = 0
        self._cpu_milli = 0
        self._memory = 0
        self._models: frozenset[str] = frozenset()
        self._workers = 1
        self._min_workers: int | None = None
        self._priority = 0
        self._preemptible = True
        self._submit_seq = 0
        self._submitted_at = 0.0
        self._expected_duration: float | None = None
        self._checkpoint_interval: float | None = None
        self._attained = 0.0
        self._job_type = ""

    def gpus(self, count: int) -> JobBuilder:
        self._gpus = count
        self._gpu_milli = MILLI_PER_GPU
        return self

    def fraction(self, share: float) -> JobBuilder:
        """A share of one GPU, e.g. 0.5."""
        self._gpus = 1
        self._gpu_milli = milli(share)
        return self

    def gpu_milli(self, value: int) -> JobBuilder:
        """The raw milli-GPU field (for validation tests: no conversion, no rounding)."""
        self._gpu_milli = value
        return self

    def cpu_only(self) -> JobBuilder:
        self._gpus = 0
        self._gpu_milli = MILLI_PER_GPU
        return self

    def gpu_memory(self, gib: float) -> JobBuilder:
        self._gpu_memory = round(gib * GiB)
        return self

    def cpu(self, cores: float) -> JobBuilder:
        self._cpu_milli = round(cores * 1000)
        return self

    def memory(self, gib: float) -> JobBuilder:
        self._memory = round(gib * GiB)
        return self

    def models(self, *names: str) -> JobBuilder:
        self._models = frozenset(names)
        return self

    def queue(self, name: str) -> JobBuilder:
        self._queue = name
        return self

    def priority(self, value: int) -> JobBuilder:
        self._priority = value
        return self

    def workers(self, count: int) -> JobBuilder:
        self._workers = count
        return self

    def elastic(self, min_workers: int, max_workers: int) -> JobBuilder:
        self._min_workers = min_workers
        self._workers = max_workers
        return self

    def min_workers(self, count: int | None) -> JobBuilder:
        self._min_workers = count
        return self

    def preemptible(self, flag: bool = True) -> JobBuilder:
        self._preemptible = flag
        return self

    def non_preemptible(self) -> JobBuilder:
        return self.preemptible(False)

    def seq(self, value: int) -> JobBuilder:
        self._submit_seq = value
        return self

    def submitted(self, at: float) -> JobBuilder:
        self._submitted_at = at
        return self

    def attained(self, gpu_seconds: float) -> JobBuilder:
        self._attained = gpu_seconds
        return self

    def duration(self, seconds: float | None) -> JobBuilder:
        self._expected_duration = seconds
        return self

    def checkpoint_every(self, seconds: float | None) -> JobBuilder:
        self._checkpoint_interval = seconds
        return self

    def spot(self, use: str) -> JobBuilder:
        """never, allowed or preferred."""
        self._spot = use
        return self

    def job_type(self, value: str) -> JobBuilder:
        self._job_type = value
        return self

    def request(self) -> WorkerRequest:
        return WorkerRequest(
            gpus=self._gpus,
            gpu_milli=self._gpu_milli,
            gpu_memory=self._gpu_memory,
            cpu_milli=self._cpu_milli,
            memory=self._memory,
            models=self._models,
            spot=getattr(self, "_spot", "never"),
            checkpoints=self._checkpoint_interval is not None,
        )

    def build(self) -> Job:
        return Job(
            id=self._id,
            queue=self._queue,
            request=self.request(),
            workers=self._workers,
            min_workers=self._min_workers,
            priority=self._priority,
            preemptible=self._preemptible,
            submit_seq=self._submit_seq,
            submitted_at=self._submitted_at,
            expected_duration=self._expected_duration,
            checkpoint_interval=self._checkpoint_interval,
            attained_gpu_seconds=self._attained,
            job_type=self._job_type,
        )


def make_job(job_id: str) -> JobBuilder:
    return JobBuilder(job_id)


class QueueBuilder:
    """A queue; quota amounts are given in GPUs, cores and GiB."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._quotas: dict[str, Quota] = {}
        self._cohort: str | None = None
        self._weight = 1.0

    def _quota(self, key: str, nominal: int | None, borrowing_limit: int | None, lending_limit: int | None) -> None:
        self._quotas[key] = Quota(nominal, borrowing_limit, lending_limit)

    def gpus(
        self, nominal: float | None, *, borrowing_limit: float | None = None, lending_limit: float | None = None
    ) -> QueueBuilder:
        self._quota(
            "gpu",
            None if nominal is None else milli(nominal),
            None if borrowing_limit is None else milli(borrowing_limit),
            None if lending_limit is None else milli(lending_limit),
        )
        return self

    def model_gpus(
        self,
        model: str,
        nominal: float | None,
        *,
        borrowing_limit: float | None = None,
        lending_limit: float | None = None,
    ) -> QueueBuilder:
        self._quota(
            gpu_model_key(model),
            None if nominal is None else milli(nominal),
            None if borrowing_limit is None else milli(borrowing_limit),
            None if lending_limit is None else milli(lending_limit),
        )
        return self

    def cpu(self, cores: float, *, borrowing_limit: float | None = None) -> QueueBuilder:
        borrow = None if borrowing_limit is None else round(borrowing_limit * 1000)
        self._quota("cpu", round(cores * 1000), borrow, None)
        return self

    def memory(self, gib: float) -> QueueBuilder:
        self._quota("memory", round(gib * GiB), None, None)
        return self

    def quota(self, key: str, quota: Quota) -> QueueBuilder:
        """A quota in base units under any key (for validation tests)."""
        self._quotas[key] = quota
        return self

    def cohort(self, name: str | None) -> QueueBuilder:
        self._cohort = name
        return self

    def weight(self, value: float) -> QueueBuilder:
        self._weight = value
        return self

    def deprioritised(self) -> QueueBuilder:
        """As the store marks a queue whose budget is spent with the action `deprioritise`."""
        self._deprioritised = True
        return self

    def build(self) -> QueueSpec:
        spent = getattr(self, "_deprioritised", False)
        return QueueSpec(self._name, dict(self._quotas), self._cohort, self._weight, deprioritised=spent)


def queue(name: str) -> QueueBuilder:
    return QueueBuilder(name)


class ClusterBuilder:
    """Nodes named `<prefix>-NN` in the order they are added (so sorting by name keeps that order)."""

    def __init__(self) -> None:
        self._nodes: list[Node] = []
        self._queues: list[QueueSpec] = []
        self._counters: dict[str, int] = {}

    def _next_name(self, prefix: str) -> str:
        k = self._counters.get(prefix, 0)
        self._counters[prefix] = k + 1
        return f"{prefix}-{k:02d}"

    def nodes(
        self,
        count: int,
        model: str,
        *,
        gpus: int = 8,
        nvlink_groups: int = 1,
        rack: str = "",
        zone: str = "",
        gpu_memory: float | None = None,
        cpu: float = 96,
        memory: float = 1024,
        prefix: str = "node",
        cordoned: bool = False,
        healthy: bool = True,
    ) -> ClusterBuilder:
        """`count` identical nodes; `gpu_memory` in GiB (default: the model's), `cpu` in cores, `memory` in GiB."""
        mem_gib = gpu_memory if gpu_memory is not None else GPU_MEMORY_GIB.get(model, 80)
        for _ in range(count):
            node = make_node(
                self._next_name(prefix),
                model,
                gpus,
                round(mem_gib * GiB),
                cpu_milli=round(cpu * 1000),
                memory=round(memory * GiB),
                nvlink_groups=nvlink_groups,
                rack=rack,
                zone=zone,
            )
            self._nodes.append(dataclasses.replace(node, cordoned=cordoned, healthy=healthy))
        return self

    def cpu_nodes(self, count: int, *, cpu: float = 64, memory: float = 256, prefix: str = "cpu") -> ClusterBuilder:
        for _ in range(count):
            self._nodes.append(
                Node(self._next_name(prefix), (), cpu_milli=round(cpu * 1000), memory=round(memory * GiB))
            )
        return self

    def add(self, *nodes: Node) -> ClusterBuilder:
        self._nodes.extend(nodes)
        return self

    def queue(self, *specs: QueueSpec | QueueBuilder) -> ClusterBuilder:
        for spec in specs:
            self._queues.append(spec.build() if isinstance(spec, QueueBuilder) else spec)
        return self

    def build(self) -> tuple[Node, ...]:
        return tuple(self._nodes)

    def names(self) -> list[str]:
        return [n.name for n in self._nodes]

    def snapshot(
        self,
        running: Iterable[RunningJob] = (),
        queues: Iterable[QueueSpec | QueueBuilder] = (),
        *,
        now: float = 0.0,
        seed: int = 0,
    ) -> ClusterSnapshot:
        specs = [*self._queues, *(q.build() if isinstance(q, QueueBuilder) else q for q in queues)]
        return ClusterSnapshot(tuple(self._nodes), tuple(running), tuple(specs), now=now, seed=seed)


def cluster() -> ClusterBuilder:
    return ClusterBuilder()
