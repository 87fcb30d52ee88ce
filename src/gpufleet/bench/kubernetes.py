"""`gpufleet bench kubernetes`: gpufleet and kube-scheduler binding the same GPU pods on the same API server.

The test cluster (`adapters/kubernetes/testenv`: etcd, kube-apiserver, kube-controller-manager and kube-scheduler
of one Kubernetes release, kwok as the kubelet of N GPU nodes of 8 GPUs in three models) is started once. Then,
for each scheduler in turn, M pending pods are made (the same pods: whole GPUs, since kube-scheduler cannot
place a share of one), the scheduler is started, and a watch records when each pod is bound. After a run every
pod is deleted before the next.

Per scheduler: `bound`, `seconds` (first bind to last), `pods_per_s` (bound / seconds), `start_to_last_s` (the
scheduler's start to its last bind, its own start-up included), `gpu_alloc_pct` (GPUs of bound pods over all
GPUs, once no more pods fit: with more pods asked than GPUs, FGD's allocation at saturation).
"""

from __future__ import annotations

import random
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.domain.cluster import Gpu, Node
from gpufleet.domain.errors import GpufleetError

MODEL_GIB = {"A100-80GB": 80, "H100": 80, "V100-32GB": 32}
MODELS = tuple(MODEL_GIB)
NAMESPACE = "bench"
GPU_SIZES = ((1, 0.55), (2, 0.2), (4, 0.15), (8, 0.1))  # share of pods asking for so many GPUs
MODEL_PINNED = 0.2  # pods that ask for one GPU model (a nodeSelector on nvidia.com/gpu.product)
SETTLE_S = 5.0  # no bind for this long, with every pod bound or refused: the run is over
GiB = 2**30


@dataclass(frozen=True)
class BenchPod:
    name: str
    gpus: int
    cpu_milli: int
    memory: int
    model: str | None


def bench_nodes(count: int) -> list[Node]:
    nodes = []
    for i in range(count):
        model = MODELS[i % len(MODELS)]
        memory = MODEL_GIB[model] * GiB
        gpus = tuple(Gpu(j, f"GPU-{i}-{j}", model, memory) for j in range(8))
        nodes.append(Node(f"node-{i:05d}", gpus, cpu_milli=128_000, memory=2048 * GiB, rack=f"rack-{i // 16}"))
    return nodes


def synthetic_pods(count: int, seed: int) -> list[BenchPod]:
    """A seeded mix of whole-GPU pods: mostly one GPU, some 2, 4 and 8; a fifth pinned to one model."""
    draw = random.Random(seed)
    sizes = [size for size, _ in GPU_SIZES]
    weights = [weight for _, weight in GPU_SIZES]
    pods = []
    for i in range(count):
        gpus = draw.choices(sizes, weights)[0]
        model = draw.choice(MODELS) if draw.random() < MODEL_PINNED else None
        pods.append(BenchPod(f"pod-{i:06d}", gpus, 4000 * gpus, 32 * GiB * gpus, model))
    return pods


def pod_body(pod: BenchPod, scheduler: str) -> dict[str, Any]:
    from gpufleet.adapters.kubernetes.testenv import gpu_product

    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "work",
                "image": "bench:1",
                "resources": {
                    "limits": {"nvidia.com/gpu": str(pod.gpus)},
                    "requests": {"cpu": f"{pod.cpu_milli}m", "memory": str(pod.memory)},
                },
            }
        ],
    }
    if pod.model is not None:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": gpu_product(pod.model, MODEL_GIB[pod.model] * GiB)}
    # gpufleet's queue by label: the control plane's own `default` queue, there before it starts.
    meta = {"name": pod.name, "namespace": NAMESPACE, "labels": {"gpufleet.io/queue": "default"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class BindWatch(threading.Thread):
    """Records, from a watch of the bench namespace's pods, when each was first seen bound."""

    def __init__(self, api: Any) -> None:
        super().__init__(name="bench-bind-watch", daemon=True)
        self.api = api
        self.bound: dict[str, float] = {}
        self.refused: set[str] = set()
        self.halt = threading.Event()
        self.version = ""

    def prime(self) -> None:
        listing = self.api.list(f"/api/v1/namespaces/{NAMESPACE}/pods", limit=100_000)
        self.version = listing["metadata"]["resourceVersion"]
        for pod in listing.get("items") or ():
            self._see(pod)

    def run(self) -> None:
        from gpufleet.adapters.kubernetes.kube_api import KubeApiError

        while not self.halt.is_set():
            try:
                for event in self.api.watch(f"/api/v1/namespaces/{NAMESPACE}/pods", self.version, 60):
                    obj = event.get("object") or {}
                    self.version = (obj.get("metadata") or {}).get("resourceVersion", self.version)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._see(obj)
                    if self.halt.is_set():
                        return
            except KubeApiError:
                self.prime()

    def _see(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if pod["spec"].get("nodeName"):
            self.bound.setdefault(name, time.monotonic())
            self.refused.discard(name)
            return
        for condition in (pod.get("status") or {}).get("conditions") or ():
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                self.refused.add(name)


def make_pods(api: Any, pods: Sequence[BenchPod], scheduler: str) -> float:
    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda pod: api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body(pod, scheduler)), pods))
    return time.monotonic() - started


def wait_settled(watch: BindWatch, total: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = -1
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        count = len(watch.bound)
        if count != last:
            last, quiet_since = count, time.monotonic()
        done = count + len(watch.refused) >= total
        if count == total or (done and time.monotonic() - quiet_since >= SETTLE_S):
            return
        if time.monotonic() - quiet_since >= 6 * SETTLE_S:
            return  # nothing bound for long: what fits is bound
        time.sleep(0.1)


def summarise(
    watch: BindWatch, started: float, pods: Sequence[BenchPod], gpus_total: int, made_s: float
) -> dict[str, Any]:
    times = sorted(watch.bound.values())
    by_name = {pod.name: pod for pod in pods}
    gpus = sum(by_name[name].gpus for name in watch.bound if name in by_name)
    seconds = times[-1] - times[0] if len(times) > 1 else 0.0
    return {
        "bound": len(times),
        "seconds": round(seconds, 3),
        "pods_per_s": round(len(times) / seconds, 1) if seconds > 0 else None,
        "start_to_last_s": round(times[-1] - started, 3) if times else None,
        "gpu_alloc_pct": round(100.0 * gpus / gpus_total, 2),
        "pods_made_s": round(made_s, 2),
    }


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def run(
    node_count: int, pod_count: int, seed: int = 0, timeout_s: float = 900.0, scheduler_qps: float | None = None
) -> dict[str, Any]:
    from gpufleet.adapters.kubernetes.kube_api import KubeApi
    from gpufleet.adapters.kubernetes.testenv import TestCluster, build
    from gpufleet.bench.api import LocalServer

    built = build(echo=lambda _line: None)
    nodes = bench_nodes(node_count)
    pods = synthetic_pods(pod_count, seed)
    gpus_total = sum(len(node.gpus) for node in nodes)
    result: dict[str, Any] = {
        "nodes": node_count,
        "gpus": gpus_total,
        "pods": pod_count,
        "gpus_asked": sum(pod.gpus for pod in pods),
        "workload": f"synthetic whole-GPU pods, seed {seed}",
        "build_cached": built.cached,
        "kube_scheduler_qps": scheduler_qps if scheduler_qps is not None else "default (50, bursts of 100)",
    }
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-k8s-") as scratch:
        cluster = TestCluster(Path(scratch) / "cluster", built.bin_dir, echo=_to_stderr)
        cluster.start()
        try:
            api = KubeApi(cluster.admin_kubeconfig, pool_size=32)
            cluster.add_nodes(nodes, timeout_s=max(60.0, node_count * 0.6))
            cluster.ensure_namespace(NAMESPACE)
            for scheduler in ("kube_scheduler", "gpufleet"):
                watch = BindWatch(api)
                made_s = make_pods(api, pods, "default-scheduler" if scheduler == "kube_scheduler" else "gpufleet")
                watch.prime()
                watch.start()
                started = time.monotonic()
                if scheduler == "kube_scheduler":
                    cluster.start_scheduler(scheduler_qps)
                    server = None
                else:
                    server = LocalServer(
                        Path(scratch) / "gpufleet",
                        emulate=None,
                        extra=("--kubernetes", str(cluster.admin_kubeconfig)),
                        ready_timeout_s=120,
                    )
                try:
                    wait_settled(watch, len(pods), timeout_s)
                finally:
                    watch.halt.set()
                    if server is not None:
                        server.stop()
                    else:
                        cluster.stop_scheduler()
                result[scheduler] = summarise(watch, started, pods, gpus_total, made_s)
                cluster.delete_all_pods(timeout_s=max(60.0, pod_count / 50))
            api.close()
        except GpufleetError:
            raise
        finally:
            cluster.stop()
    gf, ks = result["gpufleet"], result["kube_scheduler"]
    result["gpufleet_faster"] = bool(gf["pods_per_s"] and ks["pods_per_s"] and gf["pods_per_s"] >= ks["pods_per_s"])
    result["gpufleet_allocates_more"] = gf["gpu_alloc_pct"] >= ks["gpu_alloc_pct"]
    return result
