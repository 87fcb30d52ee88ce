"""The execution backend on Kubernetes: where the local and Ray backends start processes, this one binds pods.

- `launch` binds each pod of the job to the node its worker was placed on, through the `pods/binding`
  subresource, many at once (a thread pool). The API server refuses to bind a pod twice (409), so a restarted
  control plane that binds again binds nothing twice: a conflict on the node asked for is the bind done
  before, one elsewhere loses the job.
- STARTED when every pod runs; EXITED when every pod succeeded, or one failed (its exit code; a gang's other
  pods are deleted, as they hold GPUs nobody counts any more).
- `stop` evicts the pods through the Eviction API with the grace asked for, which the kubelet gives as
  SIGTERM then SIGKILL (the checkpoint signal); PodDisruptionBudgets are respected (an eviction they refuse is
  tried again until it passes). `grace_s <= 0` deletes at once. STOPPED once every pod is gone.
- A pod that vanished under a running job (deleted by a user, its node removed) cancels the job through the
  fleet: a deleted pod never comes back.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.adapters.inbox import ObservationInbox
from gpufleet.adapters.kubernetes.kube_api import KubeApi, KubeApiError
from gpufleet.adapters.kubernetes.kube_fleet import KubeFleet
from gpufleet.adapters.kubernetes.objects import PodInfo
from gpufleet.adapters.kubernetes.pod_specs import dns_name, namespace_of, pod_bodies, service_body
from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.jobs import JobId
from gpufleet.ports import BackendCapabilities, Clock, Launch, Observation, ObservationKind

log = logging.getLogger("gpufleet.kubernetes")

BINDERS = 16
EVICT_RETRY_S = 2.0


@dataclass
class _Job:
    job_id: JobId
    attempt: int
    workers: tuple[WorkerPlacement, ...]  # where each pod was placed, by rank
    own: bool = False  # its pods are gpufleet's to make (a job submitted to gpufleet, with an image)
    namespace: str = ""
    started: bool = False
    stopping: bool = False
    stop_grace_s: float = 0.0
    done: bool = False
    seen: set[str] = field(default_factory=set)  # pods seen to exist: one of them gone is a deletion
    refused: dict[str, float] = field(default_factory=dict)  # pods whose eviction a PDB refused: when to retry


class KubernetesBackend:
    capabilities = BackendCapabilities(multi_node=True, gpu_isolation=True, checkpoint_signal=True)

    def __init__(
        self,
        api: KubeApi,
        fleet: KubeFleet,
        clock: Clock,
        binders: int = BINDERS,
        job_env: Callable[[JobId, int], Mapping[str, str]] | None = None,
    ) -> None:
        self.api = api
        self.fleet = fleet
        self.clock = clock
        self.inbox = ObservationInbox(clock)
        self._jobs: dict[JobId, _Job] = {}
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=binders, thread_name_prefix="gpufleet-k8s-bind")
        self.job_env = job_env
        self.binds = 0
        self.conflicts = 0
        fleet.backend = self

    # -- the port -------------------------------------------------------------------------------------------

    def launch(self, launch: Launch) -> None:
        job_id = launch.job.id
        with self._lock:
            known = self._jobs.get(job_id)
            if known is not None and known.attempt == launch.attempt:
                return
            nodes = tuple(worker.node for worker in launch.workers)
            own = launch.job.run is not None
            self._jobs[job_id] = _Job(job_id, launch.attempt, launch.workers, own=own, namespace=launch.job.queue)
        if own:
            self._make_pods(launch)
            return
        pods = self.fleet.pods_of(job_id)
        if not pods or any(pod is None for pod in pods):
            # Its pods were deleted while it waited; the fleet cancels it. Nothing to bind.
            self.fleet.request_cancel(job_id, "its pod was deleted from Kubernetes before it could start")
            return
        if len(pods) != len(nodes):
            self._lose(job_id, launch.attempt, f"placed {len(nodes)} worker(s) for {len(pods)} pod(s)")
            return
        for pod, node in zip(pods, nodes, strict=True):
            assert pod is not None
            self._pool.submit(self._bind, job_id, launch.attempt, pod, node)

    def _make_pods(self, launch: Launch, missing_only: bool = False) -> None:
        """A submitted job's pods for this attempt, made bound to their placement (and a multi-worker job's
        headless Service for MASTER_ADDR)."""
        job, attempt = launch.job, launch.attempt
        namespace = namespace_of(job)
        extra = dict(self.job_env(job.id, attempt)) if self.job_env is not None else {}
        bodies = pod_bodies(launch, extra)
        self.fleet.expect(job.id, [f"{namespace}/{body['metadata']['name']}" for body in bodies])

        def make() -> None:
            try:
                if len(bodies) > 1:
                    self._create(f"/api/v1/namespaces/{namespace}/services", service_body(job, attempt))
                existing = {pod.name for pod in self.fleet.pods_of(job.id) if pod is not None}
                for body in bodies:
                    if missing_only and body["metadata"]["name"] in existing:
                        continue
                    with self._lock:
                        current = self._jobs.get(job.id)
                        if current is None or current.attempt != attempt or current.stopping or current.done:
                            return  # stopped before its pods were all made
                    self._create(f"/api/v1/namespaces/{namespace}/pods", body)
                    with self._lock:
                        self.binds += 1
            except KubeApiError as error:
                why = error.message
                if error.status == 403:
                    why += f"; to fix: let gpufleet make pods in namespace {namespace} (deploy/kubernetes/team)"
                elif error.status == 404:
                    why += f"; to fix: create namespace {namespace}, the namespace of queue {job.queue}"
                self._fail(job.id, attempt, 126, f"cannot make its pods: {why}")

        self._pool.submit(make)

    def _create(self, path: str, body: Mapping[str, object]) -> None:
        try:
            self.api.create(path, body)
        except KubeApiError as error:
            if error.status != 409:  # made before a restart
                raise

    def _fail(self, job_id: JobId, attempt: int, code: int, why: str) -> None:
        """The attempt cannot run at all: it exits with `code` (no retry makes pods a namespace refuses)."""
        log.warning("kubernetes: job %s: %s", job_id, why)
        if not self._end(job_id, attempt):
            return
        self._finish(job_id)
        self.inbox.emit((job_id, attempt), ObservationKind.EXITED, exit_code=code, detail=why)

    def _end(self, job_id: JobId, attempt: int) -> bool:
        """Mark the attempt done; False when it was already (or is another attempt's)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.attempt != attempt or job.done:
                return False
            job.done = True
            return True

    def _finish(self, job_id: JobId) -> None:
        """An own job's attempt is over: its pods are forgotten (the next attempt makes new ones), its Service goes."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None or not job.own:
            return
        self.fleet.release(job_id)
        if len(job.workers) > 1:
            name = dns_name(f"{job_id}-a{job.attempt}")

            def delete() -> None:
                try:
                    self.api.call("DELETE", f"/api/v1/namespaces/{job.namespace}/services/{name}")
                except KubeApiError as error:
                    if error.status != 404:
                        log.warning("kubernetes: deleting service %s failed: %s", name, error)

            self._pool.submit(delete)

    def _bind(self, job_id: JobId, attempt: int, pod: PodInfo, node: str) -> None:
        for tries in range(5):
            try:
                self.api.bind(pod.namespace, pod.name, node, pod.uid)
                with self._lock:
                    self.binds += 1
                return
            except KubeApiError as error:
                if error.status == 409:
                    with self._lock:
                        self.conflicts += 1
                    if self._bound_to(pod, node):
                        return  # bound before (by this control plane, before a restart)
                    self._lose(job_id, attempt, f"pod {pod.key} was bound elsewhere: {error.message}")
                    return
                if error.status == 404:
                    self.fleet.request_cancel(job_id, f"pod {pod.key} was deleted before it was bound")
                    return
                if error.status in (0, 429, 500, 503, 504) and tries < 4:
                    time.sleep(0.2 * (tries + 1))
                    continue
                self._lose(job_id, attempt, f"binding pod {pod.key} to {node} failed: {error.message}")
                return

    def _bound_to(self, pod: PodInfo, node: str) -> bool:
        try:
            current = self.api.call("GET", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}")
        except KubeApiError:
            return False
        spec = (current or {}).get("spec") or {}
        return bool(spec.get("nodeName") == node and (current or {}).get("metadata", {}).get("uid") == pod.uid)

    def _lose(self, job_id: JobId, attempt: int, why: str) -> None:
        log.warning("kubernetes: job %s: %s", job_id, why)
        if not self._end(job_id, attempt):
            return
        # Pods of it that were bound hold resources the scheduler no longer counts: they go.
        for pod in self.fleet.pods_of(job_id):
            if pod is not None and pod.node:
                self._delete(pod, 0)
        self.inbox.lose((job_id, attempt), why)

    def stop(self, job_id: JobId, attempt: int, grace_s: float, reason: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.attempt != attempt or job.done:
                if job is None:
                    # Never launched here (cancelled before a bind): nothing runs. Its pods, if a team made them,
                    # go: cancelling a pod's job in gpufleet is deleting the pod.
                    self._jobs[job_id] = _Job(job_id, attempt, (), stopping=True, done=True)
                    self.inbox.emit((job_id, attempt), ObservationKind.STOPPED, detail=reason)
                    for pod in self.fleet.pods_of(job_id):
                        if pod is not None and not pod.ended and not pod.deleting:
                            self._delete(pod, 0)
                return
            again = job.stopping
            if again and grace_s >= job.stop_grace_s:
                return
            job.stopping = True
            job.stop_grace_s = max(0.0, grace_s)
        for pod in self.fleet.pods_of(job_id):
            if pod is not None and not pod.ended:
                self._pool.submit(self._evict, job_id, pod, grace_s)
        self.pods_changed(job_id)

    def _evict(self, job_id: JobId, pod: PodInfo, grace_s: float) -> None:
        # The pod's own grace period is the most it is given; gpufleet's (a queue's cap, a force-cancel) may cut it.
        grace = max(0, math.ceil(min(grace_s, pod.grace_s)))
        try:
            # Only a force-cancel (no grace asked) deletes outright; any other stop goes through the Eviction API,
            # so that PodDisruptionBudgets hold even for a pod whose own grace period is 0.
            if grace_s <= 0 or not pod.node:
                self.api.delete_pod(pod.namespace, pod.name, grace)
            else:
                self.api.evict(pod.namespace, pod.name, grace)
        except KubeApiError as error:
            if error.status == 404:
                return
            if error.status == 429:  # a PodDisruptionBudget says not now: try again
                with self._lock:
                    job = self._jobs.get(job_id)
                    if job is not None:
                        job.refused[pod.key] = time.monotonic() + EVICT_RETRY_S
                return
            log.warning("kubernetes: evicting %s failed: %s", pod.key, error)

    def _delete(self, pod: PodInfo, grace_s: int) -> None:
        def delete() -> None:
            try:
                self.api.delete_pod(pod.namespace, pod.name, grace_s)
            except KubeApiError as error:
                if error.status != 404:
                    log.warning("kubernetes: deleting %s failed: %s", pod.key, error)

        self._pool.submit(delete)

    def poll(self) -> Sequence[Observation]:
        self._retry_refused()
        return self.inbox.take()

    def _retry_refused(self) -> None:
        now = time.monotonic()
        due: list[tuple[JobId, str, float]] = []
        with self._lock:
            for job in self._jobs.values():
                for key, at in list(job.refused.items()):
                    if at <= now:
                        del job.refused[key]
                        due.append((job.job_id, key, job.stop_grace_s))
        for job_id, key, grace in due:
            for pod in self.fleet.pods_of(job_id):
                if pod is not None and pod.key == key:
                    self._pool.submit(self._evict, job_id, pod, grace)

    def resize(self, launch: Launch, grace_s: float, resize_count: int) -> None:
        raise NotImplementedError("the Kubernetes backend does not resize pods (its capabilities say so)")

    def adopt(self, live: Sequence[Launch]) -> None:
        """Jobs the store says hold resources: bound pods are watched again, unbound ones bound now (the control
        plane died between writing the placement and binding), gone ones cancel their job."""
        for launch in live:
            job_id = launch.job.id
            if launch.job.run is not None:
                with self._lock:
                    self._jobs[job_id] = _Job(
                        job_id, launch.attempt, launch.workers, own=True, namespace=launch.job.queue
                    )
                self._make_pods(launch, missing_only=True)
                self.pods_changed(job_id)
                continue
            pods = self.fleet.pods_of(job_id)
            if pods and all(pod is not None and pod.node for pod in pods):
                with self._lock:
                    self._jobs[job_id] = _Job(job_id, launch.attempt, launch.workers)
                self.pods_changed(job_id)
            else:
                self.launch(launch)

    # -- what the fleet tells -------------------------------------------------------------------------------

    def launched(self, job_id: JobId) -> bool:
        with self._lock:
            return job_id in self._jobs

    def live_jobs(self) -> set[JobId]:
        with self._lock:
            return {job_id for job_id, job in self._jobs.items() if not job.done}

    def live_placements(self) -> dict[JobId, tuple[WorkerPlacement, ...]]:
        with self._lock:
            return {job_id: job.workers for job_id, job in self._jobs.items() if not job.done}

    def pods_changed(self, job_id: JobId) -> None:
        """A pod of the job changed: what that makes of the job."""
        keys = self.fleet.pod_keys(job_id)
        pods = self.fleet.pods_of(job_id)
        cancel: str | None = None
        leftovers: list[PodInfo] = []
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.done:
                return
            key = (job_id, job.attempt)
            job.seen.update(k for k, pod in zip(keys, pods, strict=False) if pod is not None)
            gone = [k for k, pod in zip(keys, pods, strict=False) if pod is None and k in job.seen]
            present = [pod for pod in pods if pod is not None]
            failed = [pod for pod in present if pod.phase == "Failed"]
            if job.stopping:
                if all(pod is None or pod.ended for pod in pods):
                    job.done = True
                    self.inbox.emit(key, ObservationKind.STOPPED, detail="its pods are gone")
            elif gone or any(pod.deleting for pod in present):
                deleting = [pod.key for pod in present if pod.deleting]
                what = f"pod {deleting[0]} is being deleted" if deleting else "a pod of it was deleted"
                cancel = f"{what} (not by gpufleet)"
            elif failed or (present and all(pod.phase == "Succeeded" for pod in present)):
                job.done = True
                code = next((p.exit_code for p in failed if p.exit_code), None)
                code = code if code is not None else (1 if failed else 0)
                detail = f"pod {failed[0].key} failed" if failed else ""
                self.inbox.emit(key, ObservationKind.EXITED, exit_code=code, detail=detail)
                leftovers = [pod for pod in present if not pod.ended]
            elif (
                not job.started
                and len(present) == len(pods)
                and present
                and all(pod.phase == "Running" and pod.node for pod in present)
            ):
                job.started = True
                self.inbox.emit(key, ObservationKind.STARTED)
        with self._lock:
            ended = job.done
        if ended:
            self._finish(job_id)
        for pod in leftovers:
            self._delete(pod, 0)  # a gang's pods still running after one failed hold GPUs nobody counts
        if cancel is not None:
            self.fleet.request_cancel(job_id, cancel)
        self.fleet.wake()

    def node_gone(self, name: str) -> None:
        """A node left the cluster: its pods cannot run, and their jobs end (their pods are deleted, as the
        pod garbage collector would)."""
        with self._lock:
            hit = [job for job in self._jobs.values() if not job.done and any(w.node == name for w in job.workers)]
        for job in hit:
            for pod in self.fleet.pods_of(job.job_id):
                if pod is not None:
                    self._delete(pod, 0)
            with self._lock:
                if job.done:
                    continue
                job.done = True
            detail = f"node {name} left the cluster"
            self.inbox.emit((job.job_id, job.attempt), ObservationKind.EXITED, exit_code=137, detail=detail)

    # -- what the control plane asks beyond the port ---------------------------------------------------------

    def log_paths(self, job_id: JobId) -> list[Path]:
        return []

    def read_log(self, job_id: JobId, *args: object, **kwargs: object) -> str:
        texts = []
        for pod in self.fleet.pods_of(job_id):
            if pod is None:
                continue
            try:
                texts.append(self.api.pod_log(pod.namespace, pod.name))
            except KubeApiError as error:
                texts.append(f"(logs of pod {pod.key} cannot be read: {error.message})\n")
        return "".join(texts)

    def prune_logs(self, retention: object, finished: Callable[[str], bool]) -> dict[str, int]:
        return {"jobs": 0, "bytes": 0}  # pods' logs are the kubelet's to keep

    def shutdown(self, stop_jobs: bool, grace_s: float) -> None:
        if stop_jobs:
            with self._lock:
                running = [(job.job_id, job.attempt) for job in self._jobs.values() if not job.done]
            for job_id, attempt in running:
                self.stop(job_id, attempt, grace_s, "the control plane stopped with --stop-jobs")
        self._pool.shutdown(wait=True, cancel_futures=False)
