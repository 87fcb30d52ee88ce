"""What gpufleet knows of a Kubernetes cluster: its Nodes and Pods, listed and watched, and what follows from
them for the control plane.

- **Nodes** become the store's nodes: allocatable resources less what pods that gpufleet does not schedule
  hold (a DaemonSet's, another scheduler's), so those count as used; NotReady is unhealthy, unschedulable is
  cordoned. A change is written at most every `publish_s`.
- **Pods with `schedulerName: gpufleet`** become jobs (`objects.job_for_pods`): a pod on its own, or a gang's
  pods once all of them exist. The job id is derived from the pods, so a restarted control plane finds the
  jobs it stored and submits none twice. A pod that cannot be read as a job gets a Warning Event saying why.
- **Pods deleted under a job** (by a user, or by their controller) cancel it: Kubernetes never gives a deleted
  pod back, and a controller that wants one makes a new pod, which is a new job.
- **Why pending**: a waiting job's reason, in the core's words, goes to its pods as the `PodScheduled=False`
  condition and an Event, where `kubectl describe pod` shows it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from gpufleet.adapters.kubernetes.informer import Informer
from gpufleet.adapters.kubernetes.kube_api import KubeApi, KubeApiError
from gpufleet.adapters.kubernetes.objects import (
    JOB_ID_LABEL,
    GroupKey,
    ObjectError,
    PodInfo,
    Usage,
    group_of,
    job_for_pods,
    job_id_for,
    node_from_k8s,
    pod_info,
    rank_order,
)
from gpufleet.domain.cluster import Node, WorkerPlacement
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.jobs import Job, JobId
from gpufleet.domain.lifecycle import JobState
from gpufleet.domain.quotas import GPU, QueueSpec
from gpufleet.domain.records import JobRecord
from gpufleet.ports import Clock, RequestKind

if TYPE_CHECKING:
    from gpufleet.adapters.kubernetes.kube_backend import KubernetesBackend

log = logging.getLogger("gpufleet.kubernetes")

WAITING_REASON = "Unschedulable"
QUOTA_NAME = "gpufleet-gpus"  # the ResourceQuota gpufleet writes in each team namespace
PUBLISH_S = 0.2
REASONS_S = 2.0
REASONS_PER_PASS = 500


class JobStore(Protocol):
    """What the fleet needs of the control plane's store."""

    def submit_many(self, jobs: Sequence[Job], at: float) -> list[JobRecord | GpufleetError]: ...

    def get(self, job_id: JobId) -> JobRecord | None: ...

    def active(self) -> Sequence[JobRecord]: ...

    def request(self, job_id: JobId, kind: RequestKind, reason: str, at: float, value: float | None = None) -> None: ...

    def queues(self) -> tuple[QueueSpec, ...]: ...

    def cluster_version(self) -> int: ...


class KubeFleet:
    def __init__(self, api: KubeApi, store: JobStore, clock: Clock) -> None:
        self.api = api
        self.store = store
        self.clock = clock
        self.backend: KubernetesBackend | None = None
        self.on_nodes: Callable[[tuple[Node, ...]], None] | None = None
        self.wake: Callable[[], None] = lambda: None
        self._lock = threading.RLock()
        self._halt = threading.Event()
        self._dirty = threading.Event()
        self._raw_nodes: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, PodInfo] = {}
        self._pod_job: dict[str, JobId] = {}  # our pods that are part of a job
        self._job_pods: dict[JobId, list[str]] = {}  # the job's pods, by rank
        self._known: set[JobId] = set()  # jobs the store has (submitted now or before)
        self._own: set[JobId] = set()  # jobs whose pods gpufleet makes (`expect`)
        self._bad: dict[str, str] = {}  # pods that cannot be a job, and why (said once)
        self._said: dict[str, str] = {}  # the reason last written to each waiting pod
        self._writers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpufleet-k8s-say")
        self._pod_groups: dict[tuple[str, str], int | str] = {}  # PodGroup minMember, or why it is unreadable
        self._published: tuple[Node, ...] | None = None
        self._nodes_changed = True
        self._reasons_at = 0.0
        self._quotas_version: int | None = None
        self._quotas_written: dict[str, str | None] = {}
        self.submitted = 0
        self.found_at_start: dict[str, int] = {}
        self._informers = [
            Informer(api, "/api/v1/nodes", self._nodes_listed, self._node_event, name="nodes", halt=self._halt),
            Informer(api, "/api/v1/pods", self._pods_listed, self._pod_event, name="pods", halt=self._halt),
        ]
        self._sync = threading.Thread(target=self._run, name="gpufleet-k8s-sync", daemon=True)

    # -- start and stop -------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> tuple[Node, ...]:
        """List the cluster, and the nodes as the store should hold them now; the watches go on in threads."""
        for informer in self._informers:
            informer.start()
        deadline = time.monotonic() + timeout_s
        for informer in self._informers:
            if not informer.synced.wait(max(0.0, deadline - time.monotonic())):
                self.close()
                raise GpufleetError(
                    f"could not list {informer.path} from the Kubernetes API server at {self.api.server} "
                    f"within {timeout_s:.0f} s",
                    "check that the API server is up and that gpufleet's credentials may list nodes and pods "
                    "(apply deploy/kubernetes)",
                )
        # The jobs the store has not finished: their pods are mapped, not taken in again (a restart). A pod whose job
        # ended while the pod stayed is found by the store refusing its id again.
        self._known.update(record.job.id for record in self.store.active())
        self._take_in()  # maps the pods of jobs the store already has, so they are not counted as others' use
        live = self._live()
        with self._lock:
            ours = [p for p in self._pods.values() if p.ours]
            self.found_at_start = {
                "nodes": len(self._raw_nodes),
                "pods": len(ours),
                "bound": sum(1 for p in ours if p.node and not p.ended),
                "pending": sum(1 for p in ours if not p.node and not p.deleting),
            }
            return self._nodes(live)

    def run(self) -> None:
        """Begin publishing node changes and taking in pods (after the control loop's first step: adopt)."""
        self._sync.start()

    def close(self) -> None:
        self._halt.set()
        self._dirty.set()
        self._writers.shutdown(wait=False, cancel_futures=True)

    # -- what the watches tell ------------------------------------------------------------------------------

    def _nodes_listed(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._raw_nodes = {item["metadata"]["name"]: item for item in items}
            self._nodes_changed = True
        self._dirty.set()

    def _node_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        with self._lock:
            if kind == "DELETED":
                gone = self._raw_nodes.pop(name, None) is not None
            else:
                old = self._raw_nodes.get(name)
                self._raw_nodes[name] = obj
                gone = False
                if old is not None and _node_view(old) == _node_view(obj):
                    return  # a heartbeat: nothing gpufleet reads changed
            self._nodes_changed = True
        if gone and self.backend is not None:
            self.backend.node_gone(name)
        self._dirty.set()

    def _pods_listed(self, items: list[dict[str, Any]]) -> None:
        pods: dict[str, PodInfo] = {}
        for item in items:
            info = self._read_pod(item)
            if info is not None:
                pods[info.key] = info
        with self._lock:
            before = set(self._pods)
            self._pods = pods
            self._nodes_changed = True
            changed_jobs = {self._pod_job[key] for key in before ^ set(pods) if key in self._pod_job}
        for job_id in changed_jobs:
            self._tell_backend(job_id)
        self._dirty.set()

    def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        info = self._read_pod(obj)
        if info is None:
            return
        with self._lock:
            old = self._pods.get(info.key)
            if kind == "DELETED":
                self._pods.pop(info.key, None)
            else:
                if old is not None and old.uid != info.uid and old.key in self._pod_job:
                    # The same name, another pod: the old one's job lost its pod.
                    self._pods.pop(info.key, None)
                self._pods[info.key] = info
            if old is None or kind == "DELETED" or old.holds != info.holds or old.node != info.node:
                self._nodes_changed = True
            job_id = self._pod_job.get(info.key)
        if job_id is not None:
            self._tell_backend(job_id)
        self._dirty.set()

    def _read_pod(self, obj: dict[str, Any]) -> PodInfo | None:
        try:
            return pod_info(obj)
        except ObjectError as bad:
            meta = obj.get("metadata") or {}
            key = f"{meta.get('namespace')}/{meta.get('name')}"
            if (obj.get("spec") or {}).get("schedulerName") == "gpufleet" and self._bad.get(key) != str(bad):
                self._bad[key] = str(bad)
                self._warn(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""), str(bad))
            return None
        except (KeyError, TypeError, ValueError) as error:
            log.warning("kubernetes: a pod could not be read (%s); it is left out", error)
            return None

    def _tell_backend(self, job_id: JobId) -> None:
        if self.backend is not None:
            self.backend.pods_changed(job_id)

    # -- what the control plane reads -----------------------------------------------------------------------

    def pods_of(self, job_id: JobId) -> list[PodInfo | None]:
        """The job's pods by rank, None for those that no longer exist."""
        with self._lock:
            return [self._pods.get(key) for key in self._job_pods.get(job_id, ())]

    def pod_keys(self, job_id: JobId) -> list[str]:
        with self._lock:
            return list(self._job_pods.get(job_id, ()))

    def nodes(self) -> tuple[Node, ...]:
        live = self._live()
        with self._lock:
            return self._nodes(live)

    def _live(self) -> Mapping[JobId, tuple[WorkerPlacement, ...]]:
        """The jobs the scheduler counts as holding resources, with their placements: the backend's live jobs, or
        before it exists (at start) the store's. Asked before the fleet's lock is taken (the backend takes its
        own lock, then the fleet's)."""
        if self.backend is not None:
            return self.backend.live_placements()
        return {r.job.id: r.workers for r in self.store.active() if r.holds_resources and r.workers}

    def _nodes(self, live: Mapping[JobId, tuple[WorkerPlacement, ...]]) -> tuple[Node, ...]:
        others: dict[str, Usage] = {}
        for pod in self._pods.values():
            if not pod.holds:
                continue
            if pod.ours and self._pod_job.get(pod.key) in live:
                continue  # the scheduler counts what its running jobs hold
            others[pod.node] = others.get(pod.node, Usage()) + pod.usage
        highest: dict[str, int] = {}
        for workers in live.values():
            for worker in workers:
                for share in worker.gpus:
                    highest[worker.node] = max(highest.get(worker.node, -1), share.index)
        nodes = []
        for name, raw in sorted(self._raw_nodes.items()):
            try:
                nodes.append(node_from_k8s(raw, others.get(name, Usage()), highest.get(name, -1)))
            except (ObjectError, KeyError, ValueError) as error:
                log.warning("kubernetes: node %s cannot be read (%s); it is left out", name, error)
        return tuple(nodes)

    # -- the sync thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._halt.is_set():
            self._dirty.wait(REASONS_S)
            if self._halt.is_set():
                return
            self._dirty.clear()
            try:
                self.sync()
            except Exception:
                log.exception("kubernetes: sync failed; trying again")
            self._halt.wait(PUBLISH_S)

    def sync(self) -> None:
        """One pass: publish the nodes if they changed, take in new pods, cancel jobs whose pods are gone,
        tell waiting pods why."""
        live = self._live()
        with self._lock:
            publish = self._nodes_changed
            self._nodes_changed = False
            nodes = self._nodes(live) if publish else None
        if nodes is not None and nodes != self._published:
            self._published = nodes
            if self.on_nodes is not None:
                self.on_nodes(nodes)
            self.wake()
        if self._take_in():
            self.wake()
        version = self.store.cluster_version()
        if version != self._quotas_version:
            self._quotas_version = version
            self.sync_quotas(self.store.queues())
        now = time.monotonic()
        if now - self._reasons_at >= REASONS_S:
            self._reasons_at = now
            self._check_jobs()

    def _take_in(self) -> int:
        """Submit a job for every pod (or complete gang) of ours that no job holds yet."""
        with self._lock:
            singles: list[PodInfo] = []
            groups: dict[tuple[str, str], list[PodInfo]] = {}
            sizes: dict[tuple[str, str], GroupKey] = {}
            for pod in self._pods.values():
                if not pod.ours or pod.key in self._pod_job or pod.deleting or pod.ended:
                    continue
                if JOB_ID_LABEL in pod.labels:
                    continue  # made by gpufleet for a job it was given: never a job of its own
                try:
                    group = group_of(pod)
                except ObjectError as bad:
                    self._bad_pod(pod, str(bad))
                    continue
                if group is None:
                    singles.append(pod)
                else:
                    groups.setdefault((group.namespace, group.name), []).append(pod)
                    sizes[(group.namespace, group.name)] = group
        candidates: list[tuple[JobId, list[PodInfo]]] = [
            (job_id_for(pod.namespace, pod.name, pod.uid), [pod]) for pod in singles
        ]
        for key, pods in groups.items():
            declared = sizes[key].size
            size = declared if declared is not None else self._pod_group_size(key)
            if isinstance(size, str):
                for pod in pods:
                    self._bad_pod(pod, size)
                continue
            if len(pods) < size:  # the rest of the gang is not there yet
                why = f"pod group {key[1]}: {len(pods)} of its {size} pods exist; gpufleet binds them all at once"
                for pod in pods:
                    if self._said.get(pod.key) != why:
                        self._said[pod.key] = why
                        self._writers.submit(self._say, pod, why)
                continue
            ranked = rank_order(pods)[:size]
            job_id = job_id_for(key[0], key[1], min(p.uid for p in ranked))
            candidates.append((job_id, ranked))
        new: list[tuple[Job, list[PodInfo]]] = []
        now = self.clock.now()
        for job_id, pods in candidates:
            if job_id in self._known:
                self._map(job_id, pods)
                continue
            try:
                new.append((job_for_pods(job_id, pods, 0, now), pods))
            except (ObjectError, GpufleetError) as bad:
                for pod in pods:
                    self._bad_pod(pod, str(bad))
        if not new:
            return 0
        results = self.store.submit_many([job for job, _ in new], now)
        for (job, pods), result in zip(new, results, strict=True):
            if isinstance(result, GpufleetError):
                for pod in pods:
                    self._bad_pod(pod, f"{result.message}; to fix: {result.fix}" if result.fix else result.message)
                continue
            self._map(job.id, pods)
            self.submitted += 1
        return len(new)

    def _map(self, job_id: JobId, pods: Sequence[PodInfo]) -> None:
        with self._lock:
            self._known.add(job_id)
            self._job_pods[job_id] = [pod.key for pod in pods]
            for pod in pods:
                self._pod_job[pod.key] = job_id
        self._tell_backend(job_id)

    def expect(self, job_id: JobId, keys: Sequence[str]) -> None:
        """The pods gpufleet makes for a job it was given (`pod_specs`): theirs, by rank, before they exist."""
        with self._lock:
            self._known.add(job_id)
            self._own.add(job_id)
            for old in self._job_pods.get(job_id, ()):
                self._pod_job.pop(old, None)
            self._job_pods[job_id] = list(keys)
            for key in keys:
                self._pod_job[key] = job_id

    def release(self, job_id: JobId) -> None:
        """Forget an own job's pods: its attempt ended (a next one makes new pods)."""
        with self._lock:
            for key in self._job_pods.pop(job_id, ()):
                self._pod_job.pop(key, None)
            self._nodes_changed = True
        self._dirty.set()

    def _pod_group_size(self, key: tuple[str, str]) -> int | str:
        """A coscheduling PodGroup's minMember, or why it cannot be read."""
        cached = self._pod_groups.get(key)
        if isinstance(cached, int):
            return cached
        namespace, name = key
        try:
            group = self.api.call("GET", f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups/{name}")
            size = int(((group or {}).get("spec") or {}).get("minMember") or 0)
        except KubeApiError as error:
            why = (
                f"PodGroup {namespace}/{name} does not exist; to fix: create it (scheduling.x-k8s.io/v1alpha1, "
                "spec.minMember) or label the pods with kueue.x-k8s.io/pod-group-name and the total-count annotation"
                if error.status == 404
                else f"PodGroup {namespace}/{name} cannot be read: {error.message}"
            )
            self._pod_groups[key] = why
            return why
        if size < 1:
            why = f"PodGroup {namespace}/{name} has no spec.minMember; to fix: give the number of pods it needs"
            self._pod_groups[key] = why
            return why
        self._pod_groups[key] = size
        return size

    def sync_quotas(self, queues: Sequence[QueueSpec]) -> None:
        """Each queue's GPU ceiling (its nominal quota plus what it may borrow) as the ResourceQuota of the
        namespace of the same name, on `requests.nvidia.com/gpu`: pods made around gpufleet cannot exceed it
        either, and inside it gpufleet queues rather than refuses. A queue without a ceiling has none."""
        for queue in queues:
            quota = queue.quotas.get(GPU)
            ceiling = None
            if quota is not None and quota.nominal is not None and quota.borrowing_limit is not None:
                ceiling = f"{quota.nominal + quota.borrowing_limit}m"
            if self._quotas_written.get(queue.name, "unset") == ceiling:
                continue
            path = f"/api/v1/namespaces/{queue.name}/resourcequotas/{QUOTA_NAME}"
            try:
                if ceiling is None:
                    if queue.name in self._quotas_written:
                        self.api.call("DELETE", path)
                else:
                    body = {
                        "apiVersion": "v1",
                        "kind": "ResourceQuota",
                        "metadata": {
                            "name": QUOTA_NAME,
                            "namespace": queue.name,
                            "labels": {"app.kubernetes.io/managed-by": "gpufleet"},
                        },
                        "spec": {"hard": {"requests.nvidia.com/gpu": ceiling}},
                    }
                    self.api.apply(path, body)
            except KubeApiError as error:
                if error.status != 404:
                    log.warning("kubernetes: cannot write the GPU quota of namespace %s: %s", queue.name, error)
                    continue
            self._quotas_written[queue.name] = ceiling

    def _check_jobs(self) -> None:
        """Jobs whose pods are gone are cancelled; waiting jobs' reasons reach their pods."""
        live = self.backend.live_jobs() if self.backend is not None else set()
        due: list[tuple[PodInfo, str]] = []
        records = self.store.active()
        active = {record.job.id for record in records}
        with self._lock:
            ended = {job_id for job_id in self._job_pods if job_id not in active and job_id not in self._own}
        self._forget_ended(ended - live)
        for record in records:
            job_id = record.job.id
            with self._lock:
                keys = self._job_pods.get(job_id)
                if keys is None or job_id in self._own:
                    continue
                pods = [self._pods.get(key) for key in keys]
            if job_id not in live and any(p is None or p.deleting for p in pods):
                self.request_cancel(job_id, "its pod was deleted from Kubernetes")
                continue
            if record.state is JobState.PENDING and record.waiting_reason:
                for pod in pods:
                    if pod is not None and not pod.node and self._said.get(pod.key) != record.waiting_reason:
                        due.append((pod, record.waiting_reason))
        # Two writes per pod whose reason changed, off this thread and at most REASONS_PER_PASS a pass: 10,000
        # pods waiting at once must not hold up the nodes and the intake for minutes.
        for pod, reason in due[:REASONS_PER_PASS]:
            self._said[pod.key] = reason
            self._writers.submit(self._say, pod, reason)

    def _forget_ended(self, ended: set[JobId]) -> None:
        """Jobs that ended leave the fleet's maps. One that ended before it ever started (cancelled while it
        waited) takes its pods with it: a pod left pending would wait for a scheduler that no longer means to
        place it."""
        for job_id in ended:
            pods = self.pods_of(job_id)
            with self._lock:
                for key in self._job_pods.pop(job_id, ()):
                    self._pod_job.pop(key, None)
            if self.backend is not None and self.backend.launched(job_id):
                continue
            for pod in pods:
                if pod is not None and not pod.node and not pod.deleting:
                    try:
                        self.api.delete_pod(pod.namespace, pod.name, 0)
                    except KubeApiError as error:
                        if error.status != 404:
                            log.warning("kubernetes: deleting pod %s of an ended job failed: %s", pod.key, error)

    def request_cancel(self, job_id: JobId, why: str) -> None:
        record = self.store.get(job_id)
        if record is None or record.state.terminal or record.stop_cause is not None:
            return
        self.store.request(job_id, RequestKind.CANCEL, why, self.clock.now())
        self.wake()

    def _say(self, pod: PodInfo, reason: str) -> None:
        try:
            self.api.pod_condition(pod.namespace, pod.name, WAITING_REASON, reason)
            self.api.event(pod.namespace, pod.name, pod.uid, "Warning", "FailedScheduling", reason)
        except KubeApiError as error:
            if error.status != 404:
                log.warning("kubernetes: cannot tell pod %s why it waits: %s", pod.key, error)

    def _bad_pod(self, pod: PodInfo, why: str) -> None:
        if self._bad.get(pod.key) == why:
            return
        self._bad[pod.key] = why
        self._warn(pod.namespace, pod.name, pod.uid, why)

    def _warn(self, namespace: str, name: str, uid: str, why: str) -> None:
        log.warning("kubernetes: pod %s/%s: %s", namespace, name, why)
        self._writers.submit(self._write_warning, namespace, name, uid, why)

    def _write_warning(self, namespace: str, name: str, uid: str, why: str) -> None:
        try:
            self.api.pod_condition(namespace, name, "Invalid", why)
            self.api.event(namespace, name, uid, "Warning", "FailedScheduling", why)
        except KubeApiError as error:
            if error.status != 404:
                log.warning("kubernetes: cannot tell pod %s/%s what is wrong: %s", namespace, name, error)


def _node_view(obj: dict[str, Any]) -> tuple[object, ...]:
    """What gpufleet reads of a node, to tell a heartbeat (which changes only times) from a change."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    ready = [(c.get("type"), c.get("status")) for c in status.get("conditions") or () if c.get("type") == "Ready"]
    return (
        meta.get("labels"),
        (obj.get("spec") or {}).get("unschedulable"),
        status.get("allocatable"),
        ready,
        [tuple(i.get("names") or ()) for i in status.get("images") or ()],
    )
