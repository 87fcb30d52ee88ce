"""Value types and rules of gpufleet: stdlib and numpy only, importing nothing else of ours."""

from gpufleet.domain.cluster import Gpu, GpuShare, Node, WorkerPlacement, make_node
from gpufleet.domain.errors import (
    FieldProblem,
    GpufleetError,
    InvalidTransitionError,
    LimitError,
    SpecError,
    UnknownNameError,
    WorkloadError,
)
from gpufleet.domain.jobs import Job, JobId, RunningJob
from gpufleet.domain.lifecycle import TRANSITIONS, JobState, Transition, transition
from gpufleet.domain.quotas import CPU, GPU, MEMORY, QueueSpec, Quota, gpu_model_key
from gpufleet.domain.resources import MILLI_PER_GPU, GiB, MiB, WorkerRequest, parse_models
from gpufleet.domain.snapshot import ClusterSnapshot, Placement, Preemption
from gpufleet.domain.throughput_table import ThroughputEntry, ThroughputTable

__all__ = [
    "CPU",
    "GPU",
    "MEMORY",
    "MILLI_PER_GPU",
    "TRANSITIONS",
    "ClusterSnapshot",
    "FieldProblem",
    "GiB",
    "Gpu",
    "GpuShare",
    "GpufleetError",
    "InvalidTransitionError",
    "Job",
    "JobId",
    "JobState",
    "LimitError",
    "MiB",
    "Node",
    "Placement",
    "Preemption",
    "QueueSpec",
    "Quota",
    "RunningJob",
    "SpecError",
    "ThroughputEntry",
    "ThroughputTable",
    "Transition",
    "UnknownNameError",
    "WorkerPlacement",
    "WorkerRequest",
    "WorkloadError",
    "gpu_model_key",
    "make_node",
    "parse_models",
    "transition",
]
