"""The JSON codec: every field written, and decode(encode(x)) == x for generated records, queues, nodes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.adapters.storage import codec
from gpufleet.domain import Gpu, GpuShare, Job, JobState, Node, QueueSpec, Quota, WorkerPlacement, WorkerRequest
from gpufleet.domain.comm import CommNeeds
from gpufleet.domain.jobs import SIGNALS, RunSpec
from gpufleet.domain.quotas import CPU, GPU, MEMORY
from gpufleet.domain.records import JobRecord, StopCause

texts = st.text(max_size=12)
names = st.text(min_size=1, max_size=12)
sizes = st.integers(min_value=0, max_value=2**62)
# Times and durations: any float but NaN (a NaN is not equal to itself, and no time is NaN), infinities included.
times = st.floats(allow_nan=False)
positive = st.floats(min_value=0.0, exclude_min=True, allow_nan=False)
non_negative = st.floats(min_value=0.0, allow_nan=False)
model = st.text(alphabet=st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=8)


@st.composite
def requests(draw: st.DrawFn) -> WorkerRequest:
    if draw(st.booleans()):
        return WorkerRequest(
            gpus=1,
            gpu_milli=draw(st.integers(1, 999)),
            gpu_memory=draw(sizes),
            cpu_milli=draw(sizes),
            memory=draw(sizes),
            models=draw(st.frozensets(model, max_size=3)),
        )
    gpus = draw(st.integers(0, 16))
    return WorkerRequest(
        gpus=gpus,
        gpu_memory=draw(sizes) if gpus else 0,
        cpu_milli=draw(sizes),
        memory=draw(sizes),
        models=draw(st.frozensets(model, max_size=3)) if gpus else frozenset(),
    )


@st.composite
def run_specs(draw: st.DrawFn) -> RunSpec:
    shell = draw(st.booleans())
    command = (draw(names),) if shell else tuple(draw(st.lists(names, min_size=1, max_size=4)))
    return RunSpec(
        command=command,
        shell=shell,
        workdir=draw(texts),
        env=tuple(draw(st.lists(st.tuples(names, texts), max_size=3))),
        checkpoint_signal=draw(st.sampled_from(SIGNALS)),
        grace_s=draw(non_negative),
        max_runtime_s=draw(st.none() | positive),
        retries=draw(st.integers(0, 100)),
    )


comm_needs = st.builds(
    CommNeeds,
    st.integers(1, 2**50),
    st.floats(min_value=1e-6, max_value=1e6),
    st.none() | st.floats(min_value=0.0, max_value=1.0, exclude_min=True, exclude_max=True),
)
bandwidths = st.none() | st.floats(min_value=0.0, max_value=1e4, exclude_min=True)


@st.composite
def jobs(draw: st.DrawFn) -> Job:
    request = draw(requests())
    workers = 1 if request.fractional else draw(st.integers(1, 64))
    return Job(
        id=draw(names),
        queue=draw(names.filter(str.strip)),
        request=request,
        workers=workers,
        min_workers=draw(st.none() | st.integers(1, workers)),
        priority=draw(st.integers(-(2**31), 2**31)),
        preemptible=draw(st.booleans()),
        submit_seq=draw(st.integers(0, 2**62)),
        submitted_at=draw(times),
        expected_duration=draw(st.none() | positive),
        checkpoint_interval=draw(st.none() | positive),
        attained_gpu_seconds=draw(non_negative),
        job_type=draw(texts),
        name=draw(texts),
        run=draw(st.none() | run_specs()),
        comm=draw(st.none() | comm_needs),
    )


placements = st.builds(
    WorkerPlacement,
    node=names,
    gpus=st.lists(st.builds(GpuShare, st.integers(0, 15), st.integers(1, 1000), sizes), max_size=4).map(tuple),
    cpu_milli=sizes,
    memory=sizes,
)

records = st.builds(
    JobRecord,
    job=jobs(),
    state=st.sampled_from(JobState),
    version=st.integers(1, 2**31),
    attempt=st.integers(0, 1000),
    workers=st.lists(placements, max_size=3).map(tuple),
    submitted_at=times,
    started_at=st.none() | times,
    first_started_at=st.none() | times,
    finished_at=st.none() | times,
    last_checkpoint_at=st.none() | times,
    attained_gpu_seconds=non_negative,
    evicting_for=st.none() | texts,
    preemptions=st.integers(0, 1000),
    exit_code=st.none() | st.integers(-255, 255),
    waiting_code=texts,
    waiting_reason=texts,
    stop_cause=st.none() | st.sampled_from(StopCause),
    failures=st.integers(0, 100),
    reason=texts,
    resizes=st.integers(0, 1000),
    resized_at=st.none() | times,
    resize_to=st.lists(placements, max_size=3).map(tuple),
    resizing=st.booleans(),
)


@st.composite
def quotas(draw: st.DrawFn) -> Quota:
    nominal = draw(st.none() | sizes)
    return Quota(
        nominal=nominal,
        borrowing_limit=None if nominal is None else draw(st.none() | sizes),
        lending_limit=None if nominal is None else draw(st.none() | st.integers(0, nominal)),
    )


queue_specs = st.builds(
    QueueSpec,
    name=names.filter(str.strip),
    quotas=st.dictionaries(st.sampled_from([GPU, CPU, MEMORY, "gpu:A100-80GB", "gpu:H100"]), quotas(), max_size=4),
    cohort=st.none() | names.filter(str.strip),
    weight=positive,
    run_as=st.none() | st.from_regex(r"[a-z_][a-z0-9_-]{0,31}", fullmatch=True),
    max_pending=st.none() | st.integers(0, 10**6),
    max_grace_s=st.none() | st.floats(0, 7 * 86400),
)


@st.composite
def node_specs(draw: st.DrawFn) -> Node:
    gpus = tuple(
        Gpu(i, draw(texts), draw(model), draw(st.integers(1, 2**40)), draw(st.integers(0, 3)))
        for i in range(draw(st.integers(0, 8)))
    )
    return Node(
        name=draw(names),
        gpus=gpus,
        cpu_milli=draw(sizes),
        memory=draw(sizes),
        rack=draw(texts),
        zone=draw(texts),
        cordoned=draw(st.booleans()),
        healthy=draw(st.booleans()),
        nvlink_gbps=draw(bandwidths),
        pcie_gbps=draw(bandwidths),
        network_gbps=draw(bandwidths),
    )


def through_json(data: dict[str, Any]) -> dict[str, Any]:
    """What comes back from a JSON column: strict JSON (no NaN or Infinity), as the store writes it."""
    loaded: dict[str, Any] = json.loads(json.dumps(data, allow_nan=False))
    return loaded


@settings(max_examples=300)
@given(records)
def test_records_round_trip(record: JobRecord) -> None:
    assert codec.decode_record(through_json(codec.encode_record(record))) == record


@given(queue_specs)
def test_queues_round_trip(spec: QueueSpec) -> None:
    assert codec.decode_queue(through_json(codec.encode_queue(spec))) == spec


@given(node_specs())
def test_nodes_round_trip(node: Node) -> None:
    assert codec.decode_node(through_json(codec.encode_node(node))) == node


def init_fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.init}


def test_every_field_is_encoded() -> None:
    run = RunSpec(("x",))
    job = Job("a", "q", WorkerRequest(gpus=1), run=run)
    placement = WorkerPlacement("n", (GpuShare(0),))
    record = JobRecord(job, JobState.RUNNING, workers=(placement,))
    node = Node("n", (Gpu(0, "u", "H100", 1),))
    encoded = codec.encode_record(record)
    assert set(encoded) == init_fields(JobRecord)
    assert set(encoded["job"]) == init_fields(Job)
    assert set(encoded["job"]["request"]) == init_fields(WorkerRequest)
    assert set(encoded["job"]["run"]) == init_fields(RunSpec)
    assert set(encoded["workers"][0]) == init_fields(WorkerPlacement)
    full = QueueSpec(
        "q",
        max_pending=3,
        max_grace_s=60.0,
        run_as="alice",
        memory_per_gpu=1 << 30,
        memory_no_gpu=1 << 30,
        disk=1 << 30,
    )
    # `deprioritised` is not the admin's: the store derives it from the queue's budget (the budgets table).
    stored = init_fields(QueueSpec) - {"deprioritised"}
    assert set(codec.encode_queue(full)) == stored
    assert codec.decode_queue(through_json(codec.encode_queue(full))) == full
    # A queue without limits or a mapped user is stored as before they existed (no key to migrate).
    optional = {"max_pending", "max_grace_s", "run_as", "memory_per_gpu", "memory_no_gpu", "disk"}
    assert set(codec.encode_queue(QueueSpec("q"))) == stored - optional
    assert set(codec.encode_quota(Quota())) == init_fields(Quota)
    assert set(codec.encode_node(node)) == init_fields(Node)
    assert set(codec.encode_node(node)["gpus"][0]) == init_fields(Gpu)


def test_a_record_written_before_a_field_existed_gets_its_default() -> None:
    record = JobRecord(Job("a", "q", WorkerRequest()), JobState.PENDING, failures=0, reason="")
    old = codec.encode_record(record)
    del old["failures"], old["reason"], old["job"]["run"]
    del old["resizes"], old["resized_at"], old["resize_to"], old["resizing"]
    assert codec.decode_record(old) == record


def test_infinities_are_written_as_strict_json() -> None:
    job = Job("a", "q", WorkerRequest(), expected_duration=float("inf"), submitted_at=float("-inf"))
    text = json.dumps(codec.encode_job(job), allow_nan=False)
    assert '"inf"' in text
    assert '"-inf"' in text
    assert codec.decode_job(json.loads(text)) == job


@settings(max_examples=200)
@given(records)
def test_a_read_record_is_written_back_as_encoding_it_afresh_would(record: JobRecord) -> None:
    parts = codec.EncodedParts()
    read = parts.read_record(through_json(codec.encode_record(record)))
    assert read == record
    # The stored job is reused for the decoded job (not encoded again), and writes the very same JSON.
    assert parts.job(read.job) == codec.encode_job(read.job)
    assert json.dumps(codec.encode_record(read, parts)) == json.dumps(codec.encode_record(read))


def test_a_job_stored_before_a_field_existed_is_encoded_afresh() -> None:
    record = JobRecord(Job("a", "q", WorkerRequest(gpus=1, models=frozenset({"B", "A"}))), JobState.PENDING)
    for drop in ("user", "run"):
        old = codec.encode_record(record)
        del old["job"][drop]
        parts = codec.EncodedParts()
        read = parts.read_record(old)
        assert parts.job(read.job) is not old["job"]
        assert set(parts.job(read.job)) == init_fields(Job)
    stored = codec.encode_record(record)
    stored["job"]["request"]["models"] = ["B", "A"]  # not as the encoder writes it: not reused
    parts = codec.EncodedParts()
    assert parts.job(parts.read_record(stored).job)["request"]["models"] == ["A", "B"]
    fresh = codec.encode_record(record)
    parts = codec.EncodedParts()
    assert parts.job(parts.read_record(fresh).job) is fresh["job"]  # as the encoder writes it: reused


# A loaded machine must not make it fail: no deadline, and slow generation of records is not an error.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records, st.integers(1, 3))
def test_a_record_text_is_the_text_of_its_encoding(record: JobRecord, writes: int) -> None:
    """The loop writes `encode_record_text`, built from kept texts of the job and workers: it must be the very
    text the engine's serialiser writes for `encode_record`, on the first write and on the ones after it."""
    parts = codec.EncodedParts()
    read = parts.read_record(through_json(codec.encode_record(record)))
    for attempt in range(writes):
        moved = dataclasses.replace(read, version=read.version + attempt, attempt=attempt)
        text = codec.encode_record_text(moved, parts)
        assert text == codec.json_text(codec.encode_record(moved))
        assert codec.decode_record(json.loads(text)) == moved
