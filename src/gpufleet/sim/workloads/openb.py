"""Alibaba "openb" GPU-sharing trace (cluster-trace-gpu-v2023), as released with the FGD paper (ATC'23).

Files (in the folder the user gives): `openb_node_list_all_node.csv` (1523 nodes, 310 CPU-only) and a pod
list, `openb_pod_list_default.csv` or `openb_pod_list_gpuspec33.csv` (8152 pods each). Field meanings follow
the trace README: `cpu_milli` milli-cores, `memory_mib` MiB, `num_gpu` GPUs (0/1/2/4/8), `gpu_milli` the
per-GPU share in thousandths (below 1000 only when `num_gpu == 1`), `gpu_spec` allowed models joined by `|`,
`creation_time`/`deletion_time` seconds from trace start.

Other pod lists of the same dataset give only `name, cpu_milli, memory_mib, num_gpu, gpu_milli` (no models, no
times). They load wherever nothing more is needed: without `gpu_spec` every pod may run on any model, and
without `creation_time` the pods keep the file's order (enough for the FGD protocol, which samples and
shuffles them); a time replay (`load_openb`) needs `creation_time` and says so.

The FGD experiment protocol (sampling pods up to 130 % of GPU capacity) is in `openb_fgd`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from gpufleet.domain import GiB, Job, MiB, Node, QueueSpec, make_node, parse_models
from gpufleet.sim.workload import TraceJob, Workload, WorkloadError
from gpufleet.sim.workloads._common import DEFAULT_QUEUE, RequestCache, located
from gpufleet.sim.workloads._csv import CsvTable

FOLDER = "alibaba-openb-2023"
NODE_FILE = "openb_node_list_all_node.csv"
POD_FILES = {"default": "openb_pod_list_default.csv", "gpuspec33": "openb_pod_list_gpuspec33.csv"}
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")  # every openb pod list has these
POD_OPTIONAL = ("gpu_spec", "creation_time", "qos", "pod_phase", "deletion_time", "scheduled_time")

CITATION = (
    "Weng, Yang, Yu, Wang, Tang, Yang, Zhang. Beware of Fragmentation: Scheduling GPU-Sharing Workloads with "
    "Fragmentation Gradient Descent. USENIX ATC 2023. Data: Alibaba cluster-trace-gpu-v2023 (openb), "
    "(c) Alibaba Group."
)
LICENSE = (
    "Copy from hkust-adsl/kubernetes-scheduler-simulator (Apache-2.0); Alibaba permits research/study use "
    "with attribution. Do not present the data as ours."
)

# GPU memory per model (bytes). Real sizes where the model is public; the pods of this trace ask for no GPU
# memory, so these only matter when openb nodes are mixed with jobs that do.
OPENB_GPU_MEMORY: Mapping[str, int] = {
    "T4": 16 * GiB,  # NVIDIA T4: 16 GB GDDR6
    "P100": 16 * GiB,  # Tesla P100 ships with 12 or 16 GB; 16 GB assumed (the SXM2 and common PCIe part)
    "V100M16": 16 * GiB,  # V100 16 GB
    "V100M32": 32 * GiB,  # V100 32 GB
    "A10": 24 * GiB,  # NVIDIA A10: 24 GB GDDR6
}
# G1/G2/G3 are undisclosed internal codes (README). Assume the smallest size seen in this fleet, so a job that
# needs GPU memory is never placed on memory the real GPU might not have.
UNKNOWN_GPU_MEMORY = 16 * GiB

POD_FIELD_COLUMNS = {
    "gpus": "num_gpu",
    "gpu_fraction": "gpu_milli",
    "gpu_models": "gpu_spec",
    "cpu": "cpu_milli",
    "memory": "memory_mib",
    "id": "name",
}


def _memory_table(overrides: Mapping[str, int] | None) -> dict[str, int]:
    table = dict(OPENB_GPU_MEMORY)
    table.update(overrides or {})
    return table


def memory_assumption(overrides: Mapping[str, int] | None = None) -> str:
    sizes = ", ".join(f"{m} {v // GiB} GiB" for m, v in sorted(_memory_table(overrides).items()))
    return (
        f"GPU memory per model: {sizes}; other models (G1/G2/G3, undisclosed) {UNKNOWN_GPU_MEMORY // GiB} GiB "
        "(assumed: the smallest size in the fleet). openb pods request no GPU memory."
    )


def load_openb_nodes(
    path: str | Path, *, gpu_nodes_only: bool = False, gpu_memory: Mapping[str, int] | None = None
) -> tuple[Node, ...]:
    """Nodes from an openb node list CSV; CPU-only nodes (`gpu == 0`) included unless `gpu_nodes_only`.

    Each node gets `gpu` GPUs of `model` (one NVLink group; the trace has no topology), `cpu_milli` and
    `memory_mib` as capacity. `gpu_memory` overrides the per-model memory table (bytes).
    """
    table = CsvTable(Path(path), "openb node list", NODE_COLUMNS)
    memory = _memory_table(gpu_memory)
    nodes: list[Node] = []
    names: set[str] = set()
    for row in table:
        name = row.text("sn")
        if name in names:
            raise row.error("sn", f"node {name!r} is listed twice", "give every node a unique name")
        names.add(name)
        cpu = row.integer("cpu_milli", minimum=0)
        mem = row.integer("memory_mib", minimum=0) * MiB
        gpus = row.integer("gpu", minimum=0)
        model = row.text("model", required=False)
        if gpus > 0 and not model:
            raise row.error("model", f"is empty on a node with {gpus} GPUs", "name the GPU model, e.g. T4")
        if gpus == 0 and model:
            raise row.error("model", f"is {model!r} on a node without GPUs", "leave it empty, or give the GPU count")
        if gpus == 0:
            if not gpu_nodes_only:
                nodes.append(Node(name=name, cpu_milli=cpu, memory=mem))
            continue
        nodes.append(make_node(name, model, gpus, memory.get(model, UNKNOWN_GPU_MEMORY), cpu_milli=cpu, memory=mem))
    if not nodes:
        raise WorkloadError("lists no usable node", "give at least one node (with GPUs)", path=table.path)
    return tuple(nodes)


def load_openb_pods(
    path: str | Path,
    *,
    known_models: Iterable[str] | None = None,
    lifetimes: bool = False,
    queue: str = DEFAULT_QUEUE,
    timed: bool = False,
) -> tuple[TraceJob, ...]:
    """Pods of an openb pod list as jobs, sorted by (creation_time, row).

    Each pod is one worker: `num_gpu == 0` CPU-only; `num_gpu == 1` with `gpu_milli < 1000` a fractional GPU;
    otherwise `num_gpu` whole GPUs. `gpu_spec` becomes the allowed models (no column: any model). If
    `known_models` is given, a model in `gpu_spec` outside it is an error (a typo would make the pod
    unplaceable without a word). Without a `creation_time` column pods arrive at 0 in the file's order,
    unless `timed` (a time replay), which needs the column. Duration is None (pods never leave, as in the FGD
    protocol) unless `lifetimes`: then it is `deletion_time - scheduled_time` (run time), or
    `deletion_time - creation_time` for pods that were never scheduled (how long they stayed), and None where
    that is not positive.
    """
    table = CsvTable(Path(path), "openb pod list", POD_COLUMNS, optional=POD_OPTIONAL)
    for needed, wanted, fix in (
        ("deletion_time", lifetimes, "add it, or load without lifetimes"),
        (
            "creation_time",
            timed or lifetimes,
            "a time replay needs each pod's creation_time: add the column, or run this pod list under the FGD "
            "protocol (--workload fgd, or --reproduce fgd --set pods=PATH), which needs only name, cpu_milli, "
            "memory_mib, num_gpu and gpu_milli",
        ),
    ):
        if wanted and not table.has(needed):
            raise WorkloadError(f"column {needed!r} is missing", fix, path=table.path, line=1)
    with_models, with_times = table.has("gpu_spec"), table.has("creation_time")
    known = frozenset(known_models) if known_models is not None else None
    cache = RequestCache()
    jobs: list[TraceJob] = []
    names: set[str] = set()
    for row in table:
        name = row.text("name")
        if name in names:
            raise row.error("name", f"pod {name!r} is listed twice", "give every pod a unique name")
        names.add(name)
        gpus = row.integer("num_gpu", minimum=0)
        milli = row.integer("gpu_milli", minimum=0)
        if gpus == 0 and milli != 0:
            raise row.error("gpu_milli", f"is {milli} on a pod with num_gpu 0", "set gpu_milli to 0 for CPU-only pods")
        if gpus > 0 and not 1 <= milli <= 1000:
            raise row.error("gpu_milli", f"is {milli}", "give the per-GPU share in 1..1000 (1000 = a whole GPU)")
        if gpus > 1 and milli != 1000:
            raise row.error(
                "gpu_milli",
                f"is {milli} with num_gpu {gpus}",
                "only single-GPU pods share a GPU: use 1000, or num_gpu 1",
            )
        models = parse_models(row.text("gpu_spec", required=False)) if with_models else frozenset()
        if known is not None and not models <= known:
            unknown = ", ".join(sorted(models - known))
            raise row.error(
                "gpu_spec",
                f"names GPU model(s) {unknown} that no node has",
                f"use models of this cluster ({', '.join(sorted(known))}), separated by '|'",
            )
        created = row.number("creation_time", minimum=0) if with_times else 0.0
        duration = None
        if lifetimes:
            started = created
            if table.has("scheduled_time") and row.text("scheduled_time", required=False):
                started = row.number("scheduled_time", minimum=0)
            life = row.number("deletion_time") - started
            duration = life if life > 0 else None
        with located(row, POD_FIELD_COLUMNS):
            request = cache.get(
                gpus=gpus,
                gpu_milli=milli if gpus else 1000,
                cpu_milli=row.integer("cpu_milli", minimum=0),
                memory=row.integer("memory_mib", minimum=0) * MiB,
                models=models,
            )
            job = Job(id=name, queue=queue, request=request, submit_seq=row.index, submitted_at=created)
        jobs.append(TraceJob(job, duration))
    jobs.sort(key=lambda tj: (tj.job.submitted_at, tj.job.submit_seq))
    return tuple(jobs)


def pod_file(folder: Path, pods: str) -> Path:
    """The pod list named `pods` (default, gpuspec33, a file name in `folder`, or a path)."""
    if pods in POD_FILES:
        return folder / POD_FILES[pods]
    candidate = Path(pods).expanduser()
    if candidate.is_file():
        return candidate
    named = folder / (pods if pods.endswith(".csv") else f"openb_pod_list_{pods}.csv")
    if named.is_file():
        return named
    raise WorkloadError(
        f"no pod list {pods!r} in {folder}",
        f"give one of {', '.join(POD_FILES)}, a file name in that folder, or a path to a pod list CSV",
    )


def openb_paths(path: str | Path, pods: str) -> tuple[Path, Path]:
    """(node list, pod list) for a folder, a node list file or a pod list file."""
    p = Path(path).expanduser()
    if p.is_file():
        if p.name == NODE_FILE:
            return p, pod_file(p.parent, pods)
        if not (p.parent / NODE_FILE).is_file():
            raise WorkloadError(
                f"the pod list has no {NODE_FILE} beside it",
                f"put the node list in {p.parent}, or give the folder",
                path=p,
            )
        return p.parent / NODE_FILE, p
    if not p.is_dir():
        raise WorkloadError("does not exist", f"give the {FOLDER} folder (with {NODE_FILE})", path=p)
    return p / NODE_FILE, pod_file(p, pods)


def load_openb(
    path: str | Path,
    *,
    pods: str = "default",
    gpu_nodes_only: bool = False,
    lifetimes: bool = False,
    gpu_memory: Mapping[str, int] | None = None,
    strict_models: bool = True,
) -> Workload:
    """The openb trace as a time replay: all nodes (or the 1213 GPU nodes), pods arriving at `creation_time`.

    `path`: the trace folder, or its node list or pod list CSV. `pods`: "default", "gpuspec33", another
    `openb_pod_list_<name>.csv` in the folder, or a path. One queue, "default", without quota.
    """
    node_path, pod_path = openb_paths(path, pods)
    nodes = load_openb_nodes(node_path, gpu_nodes_only=gpu_nodes_only, gpu_memory=gpu_memory)
    known = {g.model for n in nodes for g in n.gpus} if strict_models else None
    jobs = load_openb_pods(pod_path, known_models=known, lifetimes=lifetimes, timed=True)
    assumptions = [
        memory_assumption(gpu_memory),
        "Nodes have one NVLink group each and no rack/zone labels (the trace has no topology).",
        "All pods go to one queue, 'default', without quota; qos and pod_phase are not used.",
        "Durations: none (pods never leave)"
        if not lifetimes
        else "Durations: deletion_time - scheduled_time (deletion_time - creation_time for never-scheduled pods).",
    ]
    return Workload(
        name=f"openb-{pod_path.stem.removeprefix('openb_pod_list_')}",
        citation=CITATION,
        license=LICENSE,
        nodes=nodes,
        queues=(QueueSpec(DEFAULT_QUEUE),),
        jobs=jobs,
        assumptions=tuple(assumptions),
    )
