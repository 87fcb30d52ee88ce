"""Kubernetes objects as gpufleet reads them: Nodes into `Node`s, the pods gpufleet schedules into `Job`s.

Pure functions over the JSON the API server sends (plain dicts), so that a list of 10,000 pods is read without
the client library's model classes, and every rule here is tested without a cluster.

The labels read are those the ecosystem writes: NVIDIA GPU feature discovery's `nvidia.com/gpu.product`,
`nvidia.com/gpu.memory` (MiB) and `nvidia.com/gpu.count`; `topology.kubernetes.io/zone`; the coscheduling
pod-group label `scheduling.x-k8s.io/pod-group` (its `PodGroup`'s `minMember`) and Kueue's
`kueue.x-k8s.io/pod-group-name` with the `kueue.x-k8s.io/pod-group-total-count` annotation.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from gpufleet.adapters.nvml.models import short_model_name
from gpufleet.domain.cluster import Gpu, Node
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.resources import MILLI_PER_GPU, WorkerRequest

SCHEDULER_NAME = "gpufleet"
GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, as GPU feature discovery writes it
ZONE_LABEL = "topology.kubernetes.io/zone"
RACK_LABEL = "gpufleet.io/rack"
NVLINK_LABEL = "gpufleet.io/nvlink-domain"
POOL_LABEL = "gpufleet.io/pool"  # on-demand, spot or reserved: the node's price
QUEUE_LABEL = "gpufleet.io/queue"  # a pod's queue; without it, its namespace's name
PREEMPTIBLE_LABEL = "gpufleet.io/preemptible"
GPU_MILLI_ANNOTATION = "gpufleet.io/gpu-milli"  # a share of one GPU (fractional pods ask for no nvidia.com/gpu)
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
JOB_ID_LABEL = "gpufleet.io/job"  # on pods gpufleet made itself (`gpufleet submit` on Kubernetes)
RANK_ANNOTATION = "gpufleet.io/rank"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal(10**3)}
_DECIMAL.update({"M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15)})
_DECIMAL["E"] = Decimal(10**18)
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


class ObjectError(ValueError):
    """An object gpufleet cannot read as it is: the message says what and how to fix it (shown as an Event)."""


def quantity(text: object) -> Decimal:
    """A Kubernetes resource quantity ("500m", "16Gi", "2", "1e3") as a number of base units."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ObjectError(f"{text!r} is not a resource quantity; to fix: write it as Kubernetes does: 500m, 16Gi")
    try:
        number = Decimal(match[1])
    except InvalidOperation:
        raise ObjectError(f"{text!r} is not a resource quantity; to fix: write e.g. 500m or 16Gi") from None
    suffix = match[2] or ""
    return number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])


def milli(text: object) -> int:
    return int((quantity(text) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def whole(text: object) -> int:
    return int(quantity(text).to_integral_value(rounding="ROUND_CEILING"))


@dataclass(frozen=True, slots=True)
class Usage:
    """What pods hold on a node: CPU (milli-cores), memory (bytes), whole GPUs."""

    cpu_milli: int = 0
    memory: int = 0
    gpus: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.cpu_milli + other.cpu_milli, self.memory + other.memory, self.gpus + other.gpus)


def gpu_model(labels: Mapping[str, str], memory_bytes: int | None) -> str:
    product = labels.get(PRODUCT_LABEL, "")
    return short_model_name(product, memory_bytes) if product else "unknown"


def node_from_k8s(obj: Mapping[str, Any], held_by_others: Usage = Usage(), highest_held: int = -1) -> Node:
    """The gpufleet node of a Kubernetes Node: its allocatable resources less what pods that gpufleet does not
    schedule hold there, cordoned when unschedulable, unhealthy unless Ready.

    Others' GPUs leave the node's GPU list from the highest index down (which devices the kubelet gave anyone is
    its business; gpufleet's indices only count). `highest_held` is the highest index gpufleet's own running
    jobs hold there: the list never ends below it, and while it would (others took GPUs that gpufleet's
    numbering has free below a job it placed), the node takes no new placement, so nothing is given twice."""
    meta = obj.get("metadata", {})
    name = meta["name"]
    labels: Mapping[str, str] = meta.get("labels") or {}
    status = obj.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    free_of_others = max(0, whole(allocatable.get(GPU_RESOURCE, 0)) - held_by_others.gpus)
    gpu_count = max(free_of_others, highest_held + 1)
    mib = labels.get(GPU_MEMORY_LABEL, "")
    gpu_memory = int(mib) * 2**20 if mib.isdigit() and int(mib) > 0 else 0
    model = gpu_model(labels, gpu_memory or None)
    nvlink = labels.get(NVLINK_LABEL, "")
    gpus = tuple(
        Gpu(i, f"{name}-gpu{i}", model, gpu_memory or 1, nvlink_group=int(nvlink) if nvlink.isdigit() else 0)
        for i in range(gpu_count)
    )
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    pool = labels.get(POOL_LABEL, "on-demand")
    return Node(
        name=name,
        gpus=gpus,
        cpu_milli=max(0, milli(allocatable.get("cpu", 0)) - held_by_others.cpu_milli),
        memory=max(0, whole(allocatable.get("memory", 0)) - held_by_others.memory),
        rack=labels.get(RACK_LABEL, ""),
        zone=labels.get(ZONE_LABEL, ""),
        cordoned=bool((obj.get("spec") or {}).get("unschedulable")) or gpu_count > free_of_others,
        healthy=ready,
        pool=pool if pool in ("on-demand", "spot", "reserved") else "on-demand",
    )


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What gpufleet reads of a pod."""

    namespace: str
    name: str
    uid: str
    scheduler: str
    node: str  # spec.nodeName: "" while unbound
    phase: str
    usage: Usage
    gpu_milli: int  # a fractional pod's share of one GPU; MILLI_PER_GPU otherwise
    priority: int
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    deleting: bool
    controlled: bool  # owned by a controller (a Job, a ReplicaSet…), which makes a new pod when this one goes
    exit_code: int | None
    images: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""
    grace_s: float = 30.0  # spec.terminationGracePeriodSeconds: the most a stop gives it

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ours(self) -> bool:
        return self.scheduler == SCHEDULER_NAME

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def holds(self) -> bool:
        """Whether it holds resources on its node: bound and not ended."""
        return bool(self.node) and not self.ended


def _container_usage(container: Mapping[str, Any]) -> Usage:
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    # Extended resources such as GPUs may be given as limits only; Kubernetes then requests the same.
    gpus = requests.get(GPU_RESOURCE, limits.get(GPU_RESOURCE, 0))
    return Usage(milli(requests.get("cpu", 0)), whole(requests.get("memory", 0)), whole(gpus))


def pod_usage(spec: Mapping[str, Any]) -> Usage:
    """What a pod requests: its containers' sum, or its largest init container where that is more (as the
    kubelet reserves), plus its overhead."""
    total = Usage()
    for container in spec.get("containers") or ():
        total = total + _container_usage(container)
    init = Usage()
    for container in spec.get("initContainers") or ():
        one = _container_usage(container)
        init = Usage(max(init.cpu_milli, one.cpu_milli), max(init.memory, one.memory), max(init.gpus, one.gpus))
    overhead = spec.get("overhead") or {}
    return Usage(
        max(total.cpu_milli, init.cpu_milli) + milli(overhead.get("cpu", 0)),
        max(total.memory, init.memory) + whole(overhead.get("memory", 0)),
        max(total.gpus, init.gpus),
    )


def _exit_code(status: Mapping[str, Any]) -> int | None:
    codes = [
        int(terminated["exitCode"])
        for container in status.get("containerStatuses") or ()
        if (terminated := (container.get("state") or {}).get("terminated")) and "exitCode" in terminated
    ]
    failed = [code for code in codes if code != 0]
    return failed[0] if failed else (0 if codes else None)


def pod_info(obj: Mapping[str, Any]) -> PodInfo:
    """A pod as gpufleet reads it; ObjectError when its requests cannot be read."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    usage = pod_usage(spec)
    share = annotations.get(GPU_MILLI_ANNOTATION)
    gpu_milli = MILLI_PER_GPU
    if share is not None:
        if not share.isdigit() or not 0 < int(share) < MILLI_PER_GPU or usage.gpus:
            raise ObjectError(
                f"annotation {GPU_MILLI_ANNOTATION}={share!r} is not a share of one GPU; to fix: give 1-999 "
                f"thousandths of a GPU and request no {GPU_RESOURCE}"
            )
        gpu_milli = int(share)
    return PodInfo(
        namespace=meta.get("namespace", "default"),
        name=meta["name"],
        uid=meta.get("uid", ""),
        scheduler=spec.get("schedulerName") or "default-scheduler",
        node=spec.get("nodeName") or "",
        phase=status.get("phase") or "Pending",
        usage=usage,
        gpu_milli=gpu_milli,
        priority=int(spec.get("priority") or 0),
        labels=meta.get("labels") or {},
        annotations=annotations,
        deleting=bool(meta.get("deletionTimestamp")),
        controlled=any(ref.get("controller") for ref in meta.get("ownerReferences") or ()),
        exit_code=_exit_code(status),
        images=tuple(c.get("image", "") for c in spec.get("containers") or () if c.get("image")),
        node_selector=spec.get("nodeSelector") or {},
        resource_version=meta.get("resourceVersion", ""),
        grace_s=float(spec.get("terminationGracePeriodSeconds", 30)),
    )


@dataclass(frozen=True, slots=True)
class GroupKey:
    """Which gang a pod belongs to: its namespace and group name, and how many pods the gang needs (None: read
    from its PodGroup object)."""

    namespace: str
    name: str
    size: int | None


def group_of(pod: PodInfo) -> GroupKey | None:
    """The gang a pod declares, or None for a pod on its own; ObjectError for a malformed declaration."""
    kueue = pod.labels.get(KUEUE_GROUP_LABEL)
    if kueue:
        total = pod.annotations.get(KUEUE_TOTAL_ANNOTATION, "")
        if not total.isdigit() or int(total) < 1:
            raise ObjectError(
                f"pod group {kueue!r} has {KUEUE_TOTAL_ANNOTATION}={total!r}; to fix: give the number of pods "
                "of the group (1 or more) in that annotation on each of them"
            )
        return GroupKey(pod.namespace, kueue, int(total))
    coscheduling = pod.labels.get(POD_GROUP_LABEL)
    if coscheduling:
        return GroupKey(pod.namespace, coscheduling, None)
    return None


def job_id_for(namespace: str, name: str, uid: str = "") -> JobId:
    """A pod's (or a pod group's) job id: the same every time gpufleet reads it, so a restart finds its jobs."""
    digest = hashlib.sha256(f"{namespace}/{name}/{uid}".encode()).hexdigest()[:12]
    return f"k8s-{digest}"


def queue_of(pod: PodInfo) -> str:
    return pod.labels.get(QUEUE_LABEL) or pod.namespace


def rank_order(pods: Iterable[PodInfo]) -> list[PodInfo]:
    """A gang's pods by rank: an explicit rank annotation, the Job controller's completion index, then name."""

    def key(pod: PodInfo) -> tuple[int, str]:
        for text in (pod.annotations.get(RANK_ANNOTATION), pod.annotations.get(COMPLETION_INDEX_ANNOTATION)):
            if text is not None and text.isdigit():
                return int(text), pod.name
        return 1 << 30, pod.name

    return sorted(pods, key=key)


def job_for_pods(job_id: JobId, pods: Sequence[PodInfo], submit_seq: int, at: float) -> Job:
    """The job a pod (or a gang's pods) makes: one worker per pod, the first pod's request for every worker;
    ObjectError when the gang's pods ask for different resources."""
    first = pods[0]
    for other in pods[1:]:
        if other.usage != first.usage or other.gpu_milli != first.gpu_milli:
            raise ObjectError(
                f"pods {first.name} and {other.name} of one group ask for different resources "
                f"({_words(first.usage)} vs {_words(other.usage)}); to fix: give every pod of a group the same requests"
            )
    models = frozenset(short_model_name(product) for product in [first.node_selector.get(PRODUCT_LABEL, "")] if product)
    fractional = first.gpu_milli < MILLI_PER_GPU
    request = WorkerRequest(
        gpus=1 if fractional else first.usage.gpus,
        gpu_milli=first.gpu_milli if fractional else MILLI_PER_GPU,
        cpu_milli=first.usage.cpu_milli,
        memory=first.usage.memory,
        models=models,
    )
    group = first.labels.get(KUEUE_GROUP_LABEL) or first.labels.get(POD_GROUP_LABEL)
    return Job(
        id=job_id,
        queue=queue_of(first),
        request=request,
        workers=len(pods),
        priority=first.priority,
        preemptible=first.labels.get(PREEMPTIBLE_LABEL, "true").lower() != "false",
        submit_seq=submit_seq,
        submitted_at=at,
        name=f"{first.namespace}/{group or first.name}",
        user=f"kubernetes:{first.namespace}",
    )


def _words(usage: Usage) -> str:
    return f"{usage.gpus} GPU, {usage.cpu_milli}m CPU, {usage.memory} B"
