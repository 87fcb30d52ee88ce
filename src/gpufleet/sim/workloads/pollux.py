"""Pollux (OSDI'21) simulator workloads: eight 160-job samples of Philly mapped to six applications.

`workloads/workload-N.csv`: `name`, `time` (submission, s), `application` (cifar10, ncf, deepspeech2, bert,
yolov3, imagenet), `num_replicas` (GPUs a non-adaptive scheduler gives the job, "TunedJobs"), `batch_size`.
Cluster (Pollux simulator defaults): 16 nodes x 4 GPUs, T4-based measurements.

The workloads carry no run time: Pollux derives it from per-application throughput and efficiency
measurements that are not part of this data. Durations are None unless the caller supplies one per
application (`application_durations`, run time in seconds at the job's `num_replicas` GPUs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from gpufleet.domain import GiB, Job, QueueSpec, make_node
from gpufleet.sim.workload import TraceJob, Workload, WorkloadError
from gpufleet.sim.workloads._common import DEFAULT_QUEUE, RequestCache, located, split_gang
from gpufleet.sim.workloads._csv import CsvTable

FOLDER = "pollux-osdi21"
COLUMNS = ("name", "time", "application", "num_replicas")
APPLICATIONS = ("cifar10", "ncf", "deepspeech2", "bert", "yolov3", "imagenet")
NODES = 16
GPUS_PER_NODE = 4
MODEL = "T4"
T4_MEMORY = 16 * GiB

CITATION = (
    "Qiao, Choe, Subramanya, Neiswanger, Ho, Zhang, Ganger, Xing. Pollux: Co-adaptive Cluster Scheduling for "
    "Goodput-Optimized Deep Learning. OSDI 2021 (petuum/adaptdl, osdi21-artifact); jobs sampled from the "
    "Microsoft Philly trace (Jeon et al., ATC 2019)."
)
LICENSE = "Apache-2.0 (petuum/adaptdl); underlying Philly data CC-BY-4.0."

FIELD_COLUMNS = {"gpus": "num_replicas", "workers": "num_replicas", "id": "name"}


def pollux_file(path: str | Path, workload: int | str = 1) -> Path:
    """The workload CSV: `path` itself, or `workload-<workload>.csv` in `path` or `path/workloads`."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if not p.is_dir():
        raise WorkloadError("does not exist", f"give the {FOLDER} folder or a workload CSV", path=p)
    name = str(workload)
    name = name if name.endswith(".csv") else (f"workload-{name}.csv" if name.isdigit() else f"{name}.csv")
    for folder in (p / "workloads", p):
        if (folder / name).is_file():
            return folder / name
    found = sorted(f.stem for f in (p / "workloads").glob("workload-*.csv")) or sorted(
        f.stem for f in p.glob("workload-*.csv")
    )
    raise WorkloadError(
        f"no {name} in {p} or {p / 'workloads'}",
        f"pick one of {', '.join(found)}" if found else "give the folder that holds workload-<N>.csv files",
    )


def load_pollux(
    path: str | Path,
    *,
    workload: int | str = 1,
    application_durations: Mapping[str, float] | None = None,
    nodes: int = NODES,
    gpus_per_node: int = GPUS_PER_NODE,
) -> Workload:
    """One Pollux workload (160 jobs) on `nodes` x `gpus_per_node` T4 GPUs, one queue.

    Each job asks for `num_replicas` GPUs; more than a node becomes a gang of equal workers of at most
    `gpus_per_node` (6 -> 2 x 3, 12 -> 3 x 4). `job.job_type` is the application. `batch_size` is not used.
    """
    file = pollux_file(path, workload)
    table = CsvTable(file, "Pollux workload CSV", COLUMNS, optional=("batch_size",))
    durations = dict(application_durations or {})
    for app, seconds in durations.items():
        if not seconds > 0:
            raise WorkloadError(f"application_durations[{app!r}] is {seconds}", "give seconds > 0")
    cache = RequestCache()
    jobs = []
    names: set[str] = set()
    for row in table:
        name = row.text("name")
        if name in names:
            raise row.error("name", f"job {name!r} is listed twice", "give every job a unique name")
        names.add(name)
        app = row.text("application")
        gpus = row.integer("num_replicas", minimum=1)
        workers, per_worker = split_gang(gpus, gpus_per_node)
        with located(row, FIELD_COLUMNS):
            job = Job(
                id=name,
                queue=DEFAULT_QUEUE,
                request=cache.get(gpus=per_worker),
                workers=workers,
                submit_seq=row.index,
                submitted_at=row.number("time", minimum=0),
                job_type=app,
            )
        jobs.append(TraceJob(job, durations.get(app)))
    if not jobs:
        raise WorkloadError("has no jobs", "give one row per job", path=file)
    jobs.sort(key=lambda tj: (tj.job.submitted_at, tj.job.submit_seq))
    missing = sorted({tj.job.job_type for tj in jobs} - set(durations))
    cluster = tuple(make_node(f"pollux-{n:02d}", MODEL, gpus_per_node, T4_MEMORY) for n in range(nodes))
    match = re.search(r"(\d+)$", file.stem)
    return Workload(
        name=f"pollux-workload-{match.group(1)}" if match else f"pollux-{file.stem}",
        citation=CITATION,
        license=LICENSE,
        nodes=cluster,
        queues=(QueueSpec(DEFAULT_QUEUE),),
        jobs=tuple(jobs),
        assumptions=(
            f"Cluster: {nodes} nodes x {gpus_per_node} T4 (16 GiB), the Pollux simulator's defaults.",
            "Jobs get num_replicas GPUs (Pollux's TunedJobs sizes); larger than a node: gangs of equal workers.",
            "Durations: none in the data (Pollux models run time from per-application measurements not included)"
            + (f"; given for {', '.join(sorted(durations))}" if durations else "")
            + (f"; missing for {', '.join(missing)}" if durations and missing else ""),
        ),
    )
