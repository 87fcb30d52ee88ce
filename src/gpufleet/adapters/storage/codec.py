"""Pure functions between the domain's frozen types and JSON-able dicts, for the SQL store's JSON columns.

Every field of `JobRecord`, `Job`, `RunSpec`, `WorkerRequest`, `WorkerPlacement`, `QueueSpec`, `Quota`,
`Node` and `Gpu` is written, so `decode(encode(x)) == x`. Decoding passes only the keys it finds, so a
record written before a field with a default was added still decodes (the dataclass default applies).

JSON has no sets, tuples or infinities: frozensets become sorted lists, tuples lists, enums their values,
and non-finite floats the strings "inf", "-inf" (a strict JSON parser such as PostgreSQL's refuses the
bare `Infinity` that Python's json module would write).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from gpufleet.domain.checkpoints import AttemptLoss, CheckpointPlan
from gpufleet.domain.cluster import Gpu, GpuShare, Node, WorkerPlacement
from gpufleet.domain.comm import CommNeeds
from gpufleet.domain.dependencies import ArrayTask, Dependency, DepKind
from gpufleet.domain.jobs import Job, RunSpec
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.quotas import QueueSpec, Quota
from gpufleet.domain.records import JobRecord, StopCause
from gpufleet.domain.resources import WorkerRequest
from gpufleet.domain.windows import Window

Json = dict[str, Any]


def _float_out(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _float_in(value: float | int | str) -> float:
    return float(value)


def _opt_float_out(value: float | None) -> float | str | None:
    return None if value is None else _float_out(value)


def _opt_float_in(value: float | int | str | None) -> float | None:
    return None if value is None else float(value)


def _decode(data: Mapping[str, Any], readers: Mapping[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """The constructor arguments found in `data`, each read by its field's reader."""
    return {key: read(data[key]) for key, read in readers.items() if key in data}


# --- resources, run spec, job --------------------------------------------------------------------------


def encode_request(request: WorkerRequest) -> Json:
    return {
        "gpus": request.gpus,
        "gpu_milli": request.gpu_milli,
        "gpu_memory": request.gpu_memory,
        "cpu_milli": request.cpu_milli,
        "memory": request.memory,
        "models": sorted(request.models),
        "spot": request.spot,
        "checkpoints": request.checkpoints,
    }


_REQUEST_READERS: dict[str, Callable[[Any], Any]] = {
    "gpus": int,
    "gpu_milli": int,
    "gpu_memory": int,
    "cpu_milli": int,
    "memory": int,
    "models": frozenset,
    "spot": str,
    "checkpoints": bool,
}


def decode_request(data: Mapping[str, Any]) -> WorkerRequest:
    return WorkerRequest(**_decode(data, _REQUEST_READERS))


def encode_run(run: RunSpec) -> Json:
    return {
        "command": list(run.command),
        "shell": run.shell,
        "workdir": run.workdir,
        "env": [[name, value] for name, value in run.env],
        "checkpoint_signal": run.checkpoint_signal,
        "grace_s": _float_out(run.grace_s),
        "max_runtime_s": _opt_float_out(run.max_runtime_s),
        "retries": run.retries,
        "image": run.image,
    }


_RUN_READERS: dict[str, Callable[[Any], Any]] = {
    "command": tuple,
    "shell": bool,
    "workdir": str,
    "env": lambda pairs: tuple((str(name), str(value)) for name, value in pairs),
    "checkpoint_signal": str,
    "grace_s": _float_in,
    "max_runtime_s": _opt_float_in,
    "retries": int,
    "image": str,
}


def decode_run(data: Mapping[str, Any]) -> RunSpec:
    return RunSpec(**_decode(data, _RUN_READERS))


def encode_job(job: Job) -> Json:
    return {
        "id": job.id,
        "queue": job.queue,
        "request": encode_request(job.request),
        "workers": job.workers,
        "min_workers": job.min_workers,
        "priority": job.priority,
        "preemptible": job.preemptible,
        "submit_seq": job.submit_seq,
        "submitted_at": _float_out(job.submitted_at),
        "expected_duration": _opt_float_out(job.expected_duration),
        "checkpoint_interval": _opt_float_out(job.checkpoint_interval),
        "attained_gpu_seconds": _float_out(job.attained_gpu_seconds),
        "job_type": job.job_type,
        "name": job.name,
        "run": None if job.run is None else encode_run(job.run),
        "user": job.user,
        "comm": None if job.comm is None else encode_comm(job.comm),
        "depends_on": [[d.kind.value, d.job_id] for d in job.depends_on],
        "array": None if job.array is None else [job.array.array_id, job.array.task, job.array.throttle],
    }


_JOB_READERS: dict[str, Callable[[Any], Any]] = {
    "id": str,
    "queue": str,
    "request": decode_request,
    "workers": int,
    "min_workers": lambda v: None if v is None else int(v),
    "priority": int,
    "preemptible": bool,
    "submit_seq": int,
    "submitted_at": _float_in,
    "expected_duration": _opt_float_in,
    "checkpoint_interval": _opt_float_in,
    "attained_gpu_seconds": _float_in,
    "job_type": str,
    "name": str,
    "run": lambda v: None if v is None else decode_run(v),
    "user": str,  # absent in records written before it existed: "" (unknown)
    "comm": lambda v: None if v is None else decode_comm(v),  # absent before it existed: None
    "depends_on": lambda pairs: tuple(Dependency(DepKind(kind), str(job_id)) for kind, job_id in pairs),
    "array": lambda v: None if v is None else ArrayTask(str(v[0]), int(v[1]), None if v[2] is None else int(v[2])),
}


def encode_comm(comm: CommNeeds) -> Json:
    return {
        "grad_bytes": comm.grad_bytes,
        "step_time_s": _float_out(comm.step_time_s),
        "max_overhead": _opt_float_out(comm.max_overhead),
    }


def decode_comm(data: Mapping[str, Any]) -> CommNeeds:
    return CommNeeds(int(data["grad_bytes"]), _float_in(data["step_time_s"]), _opt_float_in(data.get("max_overhead")))


def decode_job(data: Mapping[str, Any]) -> Job:
    return Job(**_decode(data, _JOB_READERS))


# --- placements and records ----------------------------------------------------------------------------


def encode_placement(placement: WorkerPlacement) -> Json:
    return {
        "node": placement.node,
        # [index, milli, memory] per GPU: placements of big gangs repeat this many times.
        "gpus": [[share.index, share.milli, share.memory] for share in placement.gpus],
        "cpu_milli": placement.cpu_milli,
        "memory": placement.memory,
    }


_PLACEMENT_READERS: dict[str, Callable[[Any], Any]] = {
    "node": str,
    "gpus": lambda shares: tuple(GpuShare(int(i), int(m), int(mem)) for i, m, mem in shares),
    "cpu_milli": int,
    "memory": int,
}


def decode_placement(data: Mapping[str, Any]) -> WorkerPlacement:
    return WorkerPlacement(**_decode(data, _PLACEMENT_READERS))


def encode_workers(workers: tuple[WorkerPlacement, ...]) -> list[Json]:
    return [encode_placement(w) for w in workers]


def encode_record(record: JobRecord, parts: EncodedParts | None = None) -> Json:
    """`parts`: what encoded the record's job and workers before, to reuse (see `EncodedParts`)."""
    return {
        "job": encode_job(record.job) if parts is None else parts.job(record.job),
        "workers": encode_workers(record.workers) if parts is None else parts.workers(record.workers),
        **_record_state(record),
    }


# One encoder for every JSON column: `json.dumps` with these settings builds a new encoder per call, which cost
# as much as encoding a record's state.
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def json_text(value: Any) -> str:
    """`value` as the store writes a JSON column: compact, strict (no NaN or infinities)."""
    return _ENCODE(value)


def encode_record_text(record: JobRecord, parts: EncodedParts) -> str:
    """`json_text(encode_record(record, parts))`, the same text, without serialising the record's job and
    workers again: their texts are kept by `parts` while the loop rewrites the record step after step."""
    state = _ENCODE(_record_state(record))
    return f'{{"job":{parts.job_text(record.job)},"workers":{parts.workers_text(record.workers)},{state[1:]}'


def _record_state(record: JobRecord) -> Json:
    """What a record holds besides its job and workers: what changes as the loop moves it."""
    return {
        "state": record.state.value,
        "version": record.version,
        "attempt": record.attempt,
        "submitted_at": _float_out(record.submitted_at),
        "started_at": _opt_float_out(record.started_at),
        "first_started_at": _opt_float_out(record.first_started_at),
        "finished_at": _opt_float_out(record.finished_at),
        "last_checkpoint_at": _opt_float_out(record.last_checkpoint_at),
        "attained_gpu_seconds": _float_out(record.attained_gpu_seconds),
        "evicting_for": record.evicting_for,
        "preemptions": record.preemptions,
        "exit_code": record.exit_code,
        "waiting_code": record.waiting_code,
        "waiting_reason": record.waiting_reason,
        "stop_cause": None if record.stop_cause is None else record.stop_cause.value,
        "failures": record.failures,
        "reason": record.reason,
        "checkpoint_cost_s": _opt_float_out(record.checkpoint_cost_s),
        "checkpoint_plan": None if record.checkpoint_plan is None else record.checkpoint_plan.to_dict(),
        "attempt_loss": None if record.attempt_loss is None else record.attempt_loss.to_dict(),
        "resizes": record.resizes,
        "resized_at": _opt_float_out(record.resized_at),
        "resize_to": encode_workers(record.resize_to),
        "resizing": record.resizing,
    }


class EncodedParts:
    """`encode_job` and `encode_workers`, remembering what they encoded by the object: a record's job and its
    workers stay the same objects while the record moves from state to state, so a writer that writes the
    same jobs again and again (the control loop) encodes each once. Keeps at most `limit` of each (then
    starts afresh); a hit is the same object."""

    def __init__(self, limit: int = 65_536) -> None:
        self.limit = limit
        self._jobs: dict[int, tuple[Job, Json]] = {}
        self._workers: dict[int, tuple[tuple[WorkerPlacement, ...], list[Json]]] = {}
        self._job_texts: dict[int, tuple[Job, str]] = {}
        self._worker_texts: dict[int, tuple[tuple[WorkerPlacement, ...], str]] = {}

    def job(self, job: Job) -> Json:
        hit = self._jobs.get(id(job))
        if hit is not None and hit[0] is job:
            return hit[1]
        if len(self._jobs) >= self.limit:
            self._jobs.clear()
        encoded = encode_job(job)
        self._jobs[id(job)] = (job, encoded)
        return encoded

    def job_text(self, job: Job) -> str:
        """`json_text(self.job(job))`, kept as `job` is."""
        hit = self._job_texts.get(id(job))
        if hit is not None and hit[0] is job:
            return hit[1]
        if len(self._job_texts) >= self.limit:
            self._job_texts.clear()
        text = json_text(self.job(job))
        self._job_texts[id(job)] = (job, text)
        return text

    def workers_text(self, workers: tuple[WorkerPlacement, ...]) -> str:
        """`json_text(self.workers(workers))`, kept as `workers` are."""
        if not workers:
            return "[]"
        hit = self._worker_texts.get(id(workers))
        if hit is not None and hit[0] is workers:
            return hit[1]
        if len(self._worker_texts) >= self.limit:
            self._worker_texts.clear()
        text = json_text(self.workers(workers))
        self._worker_texts[id(workers)] = (workers, text)
        return text

    def read_record(self, data: Mapping[str, Any]) -> JobRecord:
        """`decode_record`, remembering the stored job as the decoded job's encoding when it is exactly what
        `encode_job` writes (every field, in its order: a record stored before a field was added is encoded
        afresh when written). The loop reads each new job once and writes its record soon after: its job is
        then not encoded a second time."""
        record = decode_record(data)
        stored = data.get("job")
        if isinstance(stored, dict) and _encoded_as_now(stored):
            if len(self._jobs) >= self.limit:
                self._jobs.clear()
            self._jobs[id(record.job)] = (record.job, stored)
        return record

    def workers(self, workers: tuple[WorkerPlacement, ...]) -> list[Json]:
        if not workers:
            return []
        hit = self._workers.get(id(workers))
        if hit is not None and hit[0] is workers:
            return hit[1]
        if len(self._workers) >= self.limit:
            self._workers.clear()
        encoded = encode_workers(workers)
        self._workers[id(workers)] = (workers, encoded)
        return encoded


_RECORD_READERS: dict[str, Callable[[Any], Any]] = {
    "job": decode_job,
    "state": JobState,
    "version": int,
    "attempt": int,
    "workers": lambda ws: tuple(decode_placement(w) for w in ws),
    "submitted_at": _float_in,
    "started_at": _opt_float_in,
    "first_started_at": _opt_float_in,
    "finished_at": _opt_float_in,
    "last_checkpoint_at": _opt_float_in,
    "attained_gpu_seconds": _float_in,
    "evicting_for": lambda v: None if v is None else str(v),
    "preemptions": int,
    "exit_code": lambda v: None if v is None else int(v),
    "waiting_code": str,
    "waiting_reason": str,
    "stop_cause": lambda v: None if v is None else StopCause(v),
    "failures": int,
    "reason": str,
    "checkpoint_cost_s": _opt_float_in,
    "checkpoint_plan": lambda v: None if v is None else CheckpointPlan.from_dict(v),
    "attempt_loss": lambda v: None if v is None else AttemptLoss.from_dict(v),
    "resizes": int,
    "resized_at": _opt_float_in,
    "resize_to": lambda ws: tuple(decode_placement(w) for w in ws),
    "resizing": bool,
}


def decode_record(data: Mapping[str, Any]) -> JobRecord:
    return JobRecord(**_decode(data, _RECORD_READERS))


_JOB_FIELDS = list(_JOB_READERS)
_REQUEST_FIELDS = list(_REQUEST_READERS)
_RUN_FIELDS = list(_RUN_READERS)


def _encoded_as_now(job: Mapping[str, Any]) -> bool:
    """Whether a stored job is what `encode_job` writes for the job it decodes to: the same fields in the same
    order (the readers list them in the encoders' order), and models sorted as the encoder sorts them."""
    request = job.get("request")
    run = job.get("run")
    return (
        list(job) == _JOB_FIELDS
        and isinstance(request, dict)
        and list(request) == _REQUEST_FIELDS
        and isinstance(request["models"], list)
        and request["models"] == sorted(request["models"])
        and (run is None or (isinstance(run, dict) and list(run) == _RUN_FIELDS))
    )


# --- queues ------------------------------------------------------------------------------------------------


def encode_quota(quota: Quota) -> Json:
    return {
        "nominal": quota.nominal,
        "borrowing_limit": quota.borrowing_limit,
        "lending_limit": quota.lending_limit,
    }


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


_QUOTA_READERS: dict[str, Callable[[Any], Any]] = {
    "nominal": _opt_int,
    "borrowing_limit": _opt_int,
    "lending_limit": _opt_int,
}


def decode_quota(data: Mapping[str, Any]) -> Quota:
    return Quota(**_decode(data, _QUOTA_READERS))


def encode_queue(spec: QueueSpec) -> Json:
    data: Json = {
        "name": spec.name,
        "quotas": {key: encode_quota(quota) for key, quota in sorted(spec.quotas.items())},
        "cohort": spec.cohort,
        "weight": _float_out(spec.weight),
    }
    # Limits only when set: a queue without them is stored as before they existed.
    if spec.max_pending is not None:
        data["max_pending"] = spec.max_pending
    if spec.max_grace_s is not None:
        data["max_grace_s"] = _float_out(spec.max_grace_s)
    if spec.run_as is not None:
        data["run_as"] = spec.run_as
    for key in ("memory_per_gpu", "memory_no_gpu", "disk"):
        if getattr(spec, key) is not None:
            data[key] = getattr(spec, key)
    return data


_QUEUE_READERS: dict[str, Callable[[Any], Any]] = {
    "name": str,
    "quotas": lambda quotas: {str(key): decode_quota(q) for key, q in quotas.items()},
    "cohort": lambda v: None if v is None else str(v),
    "weight": _float_in,
    "run_as": lambda v: None if v is None else str(v),
    "max_pending": _opt_int,
    "max_grace_s": _opt_float_in,
    "memory_per_gpu": _opt_int,
    "memory_no_gpu": _opt_int,
    "disk": _opt_int,
}


def decode_queue(data: Mapping[str, Any]) -> QueueSpec:
    return QueueSpec(**_decode(data, _QUEUE_READERS))


# --- nodes -------------------------------------------------------------------------------------------------


def encode_gpu(gpu: Gpu) -> Json:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.model,
        "memory": gpu.memory,
        "nvlink_group": gpu.nvlink_group,
    }


_GPU_READERS: dict[str, Callable[[Any], Any]] = {
    "index": int,
    "uuid": str,
    "model": str,
    "memory": int,
    "nvlink_group": int,
}


def decode_gpu(data: Mapping[str, Any]) -> Gpu:
    return Gpu(**_decode(data, _GPU_READERS))


def encode_node(node: Node) -> Json:
    return {
        "name": node.name,
        "gpus": [encode_gpu(g) for g in node.gpus],
        "cpu_milli": node.cpu_milli,
        "memory": node.memory,
        "rack": node.rack,
        "zone": node.zone,
        "cordoned": node.cordoned,
        "healthy": node.healthy,
        "pool": node.pool,
        "admits": node.admits,
        "nvlink_gbps": _opt_float_out(node.nvlink_gbps),
        "pcie_gbps": _opt_float_out(node.pcie_gbps),
        "network_gbps": _opt_float_out(node.network_gbps),
    }


_NODE_READERS: dict[str, Callable[[Any], Any]] = {
    "name": str,
    "gpus": lambda gpus: tuple(decode_gpu(g) for g in gpus),
    "cpu_milli": int,
    "memory": int,
    "rack": str,
    "zone": str,
    "cordoned": bool,
    "healthy": bool,
    "pool": str,
    "admits": str,
    # Absent in nodes stored before the interconnect existed: None (the GPU model's default).
    "nvlink_gbps": _opt_float_in,
    "pcie_gbps": _opt_float_in,
    "network_gbps": _opt_float_in,
}


def decode_node(data: Mapping[str, Any]) -> Node:
    return Node(**_decode(data, _NODE_READERS))


__all__ = [
    "EncodedParts",
    "decode_comm",
    "decode_gpu",
    "decode_job",
    "decode_node",
    "decode_placement",
    "decode_queue",
    "decode_quota",
    "decode_record",
    "decode_request",
    "decode_run",
    "encode_comm",
    "encode_gpu",
    "encode_job",
    "encode_node",
    "encode_placement",
    "encode_queue",
    "encode_quota",
    "encode_record",
    "encode_record_text",
    "encode_request",
    "encode_run",
    "encode_workers",
    "json_text",
]


# --- windows -----------------------------------------------------------------------------------------------


def encode_window(window: Window) -> Json:
    return {
        "name": window.name,
        "nodes": list(window.nodes),
        "start": window.start,
        "end": window.end,
        "queue": window.queue,
    }


def decode_window(data: Mapping[str, Any]) -> Window:
    return Window(
        str(data["name"]),
        tuple(str(n) for n in data["nodes"]),
        float(data["start"]),
        float(data["end"]),
        None if data.get("queue") is None else str(data["queue"]),
    )
