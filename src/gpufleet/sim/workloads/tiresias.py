"""Tiresias (NSDI'19) simulator inputs: the 60-job example trace and the cluster spec files.

`60_job.csv`: `job_id`, `num_gpu` (1-8), `submit_time` (s), `iterations`, `model_name` (10 CNNs),
`duration` (s), `interval` (s to the next submission; redundant, not used).
Cluster specs (`cluster_spec.csv`, `n32g4.csv`, `n160g8.csv`): `num_switch`, `num_node_p_switch`,
`num_gpu_p_node`, `num_cpu_p_node`, `mem_p_node` (GB).
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.domain import GiB, Job, Node, QueueSpec, make_node
from gpufleet.sim.workload import TraceJob, Workload, WorkloadError
from gpufleet.sim.workloads._common import DEFAULT_QUEUE, RequestCache, located, split_gang
from gpufleet.sim.workloads._csv import CsvTable

FOLDER = "tiresias-nsdi19"
JOBS_FILE = "60_job.csv"
CLUSTERS = ("cluster_spec", "n32g4", "n160g8")
JOB_COLUMNS = ("job_id", "num_gpu", "submit_time", "duration")
SPEC_COLUMNS = ("num_switch", "num_node_p_switch", "num_gpu_p_node", "num_cpu_p_node", "mem_p_node")
# The spec files give no GPU model: one generic model; 16 GiB assumed (it only matters for memory requests,
# which these jobs do not make).
MODEL = "tiresias-gpu"
GPU_MEMORY = 16 * GiB

CITATION = (
    "Gu, Chowdhury, Shin, Zhu, Jeon, Qian, Liu, Guo. Tiresias: A GPU Cluster Manager for Distributed Deep "
    "Learning. NSDI 2019 (SymbioticLab/Tiresias simulator)."
)
LICENSE = "Apache-2.0 (SymbioticLab/Tiresias)."

FIELD_COLUMNS = {"gpus": "num_gpu", "workers": "num_gpu", "id": "job_id"}


def load_cluster_spec(path: str | Path) -> tuple[Node, ...]:
    """Nodes from a Tiresias cluster spec: switches x nodes x GPUs; each node's rack is its switch.

    CPU per node = `num_cpu_p_node` cores; memory = `mem_p_node` GiB (the spec says GB).
    """
    table = CsvTable(Path(path), "Tiresias cluster spec", SPEC_COLUMNS)
    if len(table) != 1:
        raise WorkloadError(
            f"has {len(table)} data rows",
            "give exactly one row: switches, nodes per switch, GPUs, CPUs, memory",
            path=table.path,
        )
    row = table.rows[0]
    switches = row.integer("num_switch", minimum=1)
    per_switch = row.integer("num_node_p_switch", minimum=1)
    gpus = row.integer("num_gpu_p_node", minimum=1)
    cpus = row.integer("num_cpu_p_node", minimum=0)
    memory = row.integer("mem_p_node", minimum=0)
    return tuple(
        make_node(
            f"tiresias-s{s}-n{n:02d}",
            MODEL,
            gpus,
            GPU_MEMORY,
            cpu_milli=cpus * 1000,
            memory=memory * GiB,
            rack=f"switch-{s}",
        )
        for s in range(switches)
        for n in range(per_switch)
    )


def load_tiresias(path: str | Path, *, cluster: str = "cluster_spec", jobs: str = JOBS_FILE) -> Workload:
    """The Tiresias example trace on a Tiresias cluster spec, one queue.

    `path`: the trace folder, or a jobs CSV (the spec is then looked for beside it). `cluster`: a spec name
    (cluster_spec, n32g4, n160g8) in the folder, or a path. Jobs larger than a node become gangs of equal
    node-sized workers (8 GPUs on 4-GPU nodes -> 2 x 4). `job.job_type` is `model_name` when present.
    """
    p = Path(path).expanduser()
    if p.is_file():
        folder, jobs_path = p.parent, p
    elif p.is_dir():
        folder, jobs_path = p, p / jobs
    else:
        raise WorkloadError("does not exist", f"give the {FOLDER} folder or a Tiresias jobs CSV", path=p)
    spec = Path(cluster).expanduser()
    if not spec.is_file():
        spec = folder / (cluster if cluster.endswith(".csv") else f"{cluster}.csv")
    if not spec.is_file():
        raise WorkloadError(
            f"no cluster spec {cluster!r} in {folder}", f"give one of {', '.join(CLUSTERS)}, or a path to a spec CSV"
        )
    nodes = load_cluster_spec(spec)
    gpus_per_node = len(nodes[0].gpus)

    table = CsvTable(jobs_path, "Tiresias jobs CSV", JOB_COLUMNS, optional=("iterations", "model_name", "interval"))
    with_model = table.has("model_name")
    cache = RequestCache()
    trace = []
    ids: set[str] = set()
    for row in table:
        job_id = f"tiresias-{row.text('job_id')}"
        if job_id in ids:
            raise row.error("job_id", f"{row.text('job_id')!r} is listed twice", "give every job a unique id")
        ids.add(job_id)
        gpus = row.integer("num_gpu", minimum=1)
        if gpus > gpus_per_node * len(nodes):
            raise row.error("num_gpu", f"{gpus} GPUs is more than the cluster has", "use a larger cluster spec")
        workers, per_worker = split_gang(gpus, gpus_per_node)
        with located(row, FIELD_COLUMNS):
            job = Job(
                id=job_id,
                queue=DEFAULT_QUEUE,
                request=cache.get(gpus=per_worker),
                workers=workers,
                submit_seq=row.index,
                submitted_at=row.number("submit_time", minimum=0),
                job_type=row.text("model_name", required=False) if with_model else "",
            )
        trace.append(TraceJob(job, row.number("duration", positive=True)))
    if not trace:
        raise WorkloadError("has no jobs", "give one row per job", path=jobs_path)
    trace.sort(key=lambda tj: (tj.job.submitted_at, tj.job.submit_seq))
    return Workload(
        name=f"tiresias-{jobs_path.stem}-{spec.stem}",
        citation=CITATION,
        license=LICENSE,
        nodes=nodes,
        queues=(QueueSpec(DEFAULT_QUEUE),),
        jobs=tuple(trace),
        assumptions=(
            f"Cluster from {spec.name}: {len(nodes)} nodes x {gpus_per_node} GPUs of a generic model {MODEL!r} "
            f"({GPU_MEMORY // GiB} GiB assumed; the spec names none); rack = switch; memory GB read as GiB.",
            "Jobs larger than a node: gangs of equal node-sized workers; no CPU or memory requests.",
            "Durations as in the trace (the Tiresias testbed's run time).",
        ),
    )
