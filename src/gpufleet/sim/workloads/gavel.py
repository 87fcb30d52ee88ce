"""Gavel (OSDI'20): the measured throughput table and Gavel's synthetic continuous-arrival workload.

`gavel_isolated_throughputs.csv`: `gpu_type` (k80, p100, v100), `placement` (consolidated, unconsolidated),
`job_type` (26 types), `scale_factor` (GPUs), `throughput_steps_per_s` (whole job, running alone).

Job generation follows the Gavel README (facts from Gavel's `scheduler/utils.py`): arrivals Poisson at the
given rate; scale factor 1/2/4/8 with probability 0.70/0.10/0.15/0.05 when multi-GPU jobs are on; job type
uniform over the templates that support that scale factor (all 26 at 1; ResNet-18/50, Transformer, LM above);
duration 60 * 10^U(1.5, 3) s with probability 0.8, else 60 * 10^U(3, 4) s, defined on V100 (Gavel computes
the job's steps as duration x V100 throughput at its scale factor).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpufleet.domain import GiB, Job, Node, QueueSpec, WorkerRequest, make_node
from gpufleet.sim.workload import ThroughputEntry, ThroughputTable, TraceJob, Workload, WorkloadError
from gpufleet.sim.workloads._common import DEFAULT_QUEUE, resolve, split_gang
from gpufleet.sim.workloads._csv import CsvTable

FOLDER = "gavel-osdi20"
THROUGHPUT_FILE = "gavel_isolated_throughputs.csv"
THROUGHPUT_COLUMNS = ("gpu_type", "placement", "job_type", "scale_factor", "throughput_steps_per_s")
PLACEMENTS = {"consolidated": True, "unconsolidated": False}
REFERENCE_MODEL = "V100"
# Gavel's cluster (36 of each); memory per GPU: V100 16 GB (AWS p3), P100 16 GB, K80 12 GB per GK210 die.
GAVEL_MODELS = {"V100": 16 * GiB, "P100": 16 * GiB, "K80": 12 * GiB}
SCALE_FACTORS = (1, 2, 4, 8)
SCALE_PROBABILITIES = (0.70, 0.10, 0.15, 0.05)
SHORT_JOB_PROBABILITY = 0.8
DEFAULT_JOBS = 6000  # Gavel measures jobs 4000-5000; 1000 more keep the cluster loaded while they finish

CITATION = (
    "Narayanan, Santhanam, Kazhamiaka, Phanishayee, Zaharia. Heterogeneity-Aware Cluster Scheduling Policies "
    "for Deep Learning Workloads. OSDI 2020 (stanford-futuredata/gavel)."
)
LICENSE = "MIT (stanford-futuredata/gavel, (c) 2020 Stanford Future Data Systems)."


def load_throughput_table(path: str | Path) -> ThroughputTable:
    """A ThroughputTable from a Gavel-style CSV (the file, or the folder with `gavel_isolated_throughputs.csv`).

    Model names are upper-cased (`v100` -> `V100`) to match node models; lookups ignore case anyway. The
    reference model is V100 (Gavel defines job durations there).
    """
    _, file = resolve(path, THROUGHPUT_FILE, "throughput table CSV")
    table = CsvTable(file, "throughput table CSV", THROUGHPUT_COLUMNS)
    entries = []
    seen: set[tuple[str, str, int, bool]] = set()
    for row in table:
        placement = row.text("placement")
        if placement not in PLACEMENTS:
            raise row.error("placement", f"{placement!r} is not a placement", "write consolidated or unconsolidated")
        entry = ThroughputEntry(
            job_type=row.text("job_type"),
            model=row.text("gpu_type").upper(),
            gpus=row.integer("scale_factor", minimum=1),
            throughput=row.number("throughput_steps_per_s", minimum=0),
            consolidated=PLACEMENTS[placement],
        )
        key = (entry.job_type, entry.model, entry.gpus, entry.consolidated)
        if key in seen:
            raise row.error("job_type", "repeats an earlier row (same type, GPU, scale factor, placement)", "keep one")
        seen.add(key)
        entries.append(entry)
    if not entries:
        raise WorkloadError("has no rows", "give one row per job type, GPU type, scale factor, placement", path=file)
    return ThroughputTable(tuple(entries), source=str(file), reference=REFERENCE_MODEL)


def _check_cluster(gpus_per_model: int, gpus_per_node: int) -> None:
    if gpus_per_model < 1 or gpus_per_node < 1 or gpus_per_model % gpus_per_node:
        raise WorkloadError(
            f"{gpus_per_model} GPUs per model in nodes of {gpus_per_node}",
            "give gpus_per_model as a positive multiple of gpus_per_node, e.g. 36 and 4",
        )


def gavel_cluster(gpus_per_model: int, gpus_per_node: int) -> tuple[Node, ...]:
    """Gavel's cluster: `gpus_per_model` each of V100, P100 and K80, in nodes of `gpus_per_node`."""
    _check_cluster(gpus_per_model, gpus_per_node)
    return tuple(
        make_node(f"gavel-{model.lower()}-{n:02d}", model, gpus_per_node, memory)
        for model, memory in GAVEL_MODELS.items()
        for n in range(gpus_per_model // gpus_per_node)
    )


def _cluster_assumption(gpus_per_model: int, gpus_per_node: int) -> str:
    return (
        f"Cluster: {gpus_per_model} each of V100, P100, K80 in nodes of {gpus_per_node} GPUs (Gavel fixes the "
        "GPU counts, not the server shape); GPU memory V100 16 GiB, P100 16 GiB, K80 12 GiB."
    )


def load_gavel(
    path: str | Path,
    *,
    rate_per_hour: float,
    seed: int = 0,
    num_jobs: int = DEFAULT_JOBS,
    multi_gpu: bool = False,
    gpus_per_model: int = 36,
    gpus_per_node: int = 4,
) -> Workload:
    """Gavel's continuous workload: `num_jobs` jobs arriving as a Poisson process of `rate_per_hour`, on
    `gpus_per_model` V100 + P100 + K80 GPUs in nodes of `gpus_per_node`, with the throughput table.

    Same seed, same workload (numpy `default_rng(seed)`; not Gavel's own random stream). `duration` is the
    run time on V100 at the job's GPU count; `job.job_type` is the table's job type. Jobs larger than a node
    become gangs of node-sized workers. `multi_gpu=False` is Gavel's continuous-single trace (Fig. 8),
    True its continuous-multiple trace (Figs. 9-10).
    """
    if not rate_per_hour > 0:
        raise WorkloadError(f"rate_per_hour is {rate_per_hour}", "give an arrival rate > 0 jobs per hour, e.g. 4.0")
    if num_jobs < 1:
        raise WorkloadError(f"num_jobs is {num_jobs}", "generate 1 or more jobs")
    _check_cluster(gpus_per_model, gpus_per_node)
    table = load_throughput_table(path)
    types_by_scale = {
        sf: tuple(t for t in table.job_types if (table.get(t, REFERENCE_MODEL, sf) or 0.0) > 0)
        for sf in (SCALE_FACTORS if multi_gpu else (1,))
    }
    for sf, types in types_by_scale.items():
        if not types:
            raise WorkloadError(
                f"no job type has a V100 throughput at scale factor {sf}", "use a complete Gavel throughput table"
            )

    rng = np.random.default_rng(seed)
    gaps = rng.exponential(3600.0 / rate_per_hour, size=num_jobs)
    arrivals = np.cumsum(gaps)
    if multi_gpu:
        scales = rng.choice(np.array(SCALE_FACTORS), size=num_jobs, p=np.array(SCALE_PROBABILITIES))
    else:
        scales = np.ones(num_jobs, dtype=np.int64)
    picks = rng.random(num_jobs)
    long_job = rng.random(num_jobs) >= SHORT_JOB_PROBABILITY
    exponents = np.where(long_job, rng.uniform(3.0, 4.0, num_jobs), rng.uniform(1.5, 3.0, num_jobs))
    durations = 60.0 * np.power(10.0, exponents)

    requests: dict[int, tuple[int, WorkerRequest]] = {}
    jobs = []
    for i in range(num_jobs):
        sf = int(scales[i])
        types = types_by_scale[sf]
        job_type = types[min(int(picks[i] * len(types)), len(types) - 1)]
        if sf not in requests:
            workers, per_worker = split_gang(sf, gpus_per_node)
            requests[sf] = (workers, WorkerRequest(gpus=per_worker))
        workers, request = requests[sf]
        job = Job(
            id=f"gavel-{i:05d}",
            queue=DEFAULT_QUEUE,
            request=request,
            workers=workers,
            submit_seq=i,
            submitted_at=float(arrivals[i]),
            job_type=job_type,
        )
        jobs.append(TraceJob(job, float(durations[i])))

    return Workload(
        name=f"gavel-{'multi' if multi_gpu else 'single'}-{rate_per_hour:g}jph-seed{seed}",
        citation=CITATION,
        license=LICENSE,
        nodes=gavel_cluster(gpus_per_model, gpus_per_node),
        queues=(QueueSpec(DEFAULT_QUEUE),),
        jobs=tuple(jobs),
        throughput=table,
        assumptions=(
            _cluster_assumption(gpus_per_model, gpus_per_node),
            f"Arrivals: Poisson, {rate_per_hour:g} jobs/hour, first job after one exponential gap; numpy "
            f"default_rng({seed}) (Gavel's own random stream is not reproduced).",
            "Job type uniform over the templates measured at the job's scale factor; scale factor "
            + ("1/2/4/8 w.p. 0.70/0.10/0.15/0.05." if multi_gpu else "1 (single-GPU trace)."),
            "Duration on V100 at the job's scale factor: 60*10^U(1.5,3) s w.p. 0.8, else 60*10^U(3,4) s; "
            "run time elsewhere = duration / relative speed from the throughput table. Jobs larger than a node "
            "span nodes: their speed is the table's unconsolidated entry.",
        ),
    )


# A job list that Gavel's own simulator generated (`generated/` beside the throughput table): the same jobs as
# Gavel's run, so a reproduction is judged job for job, not seed number for seed number.
JOB_LIST_COLUMNS = ("job_id", "arrival_time_s", "job_type", "scale_factor", "total_steps", "duration_s")
JOB_LIST_OPTIONAL = ("priority_weight", "SLO", "v100_steps_per_s")
JOB_LIST_PREFIX = "gavel-jobs:"


def gavel_job_id(number: int) -> str:
    """Our id of Gavel's job `number`: the same for a generated and a listed job, so one window measures both."""
    return f"gavel-{number:05d}"


def load_gavel_jobs(
    path: str | Path,
    *,
    throughputs: str | Path | None = None,
    gpus_per_model: int = 36,
    gpus_per_node: int = 4,
) -> Workload:
    """The jobs of one list Gavel's simulator generated (columns `JOB_LIST_COLUMNS`), on Gavel's cluster.

    `duration` is Gavel's own draw (`duration_s`, on V100 at the job's scale factor; it is `total_steps` over
    the V100 throughput, which the file also gives); time on other models follows from the throughput table,
    `throughputs` or, by default, the `gavel_isolated_throughputs.csv` of the list's folder or its parent.
    Job ids keep Gavel's numbers (`gavel-04000`), so Gavel's window (jobs 4000-4999) measures the same jobs.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise WorkloadError(
            "job list does not exist",
            "give a CSV of Gavel's generated jobs (e.g. gavel_single_5.6_seed0.csv)",
            path=file,
        )
    _check_cluster(gpus_per_model, gpus_per_node)
    table = load_throughput_table(throughputs if throughputs is not None else _throughputs_beside(file))
    rows = CsvTable(file, "Gavel job list", JOB_LIST_COLUMNS, optional=JOB_LIST_OPTIONAL)
    requests: dict[int, tuple[int, WorkerRequest]] = {}
    jobs = []
    seen: set[int] = set()
    for index, row in enumerate(rows):
        number = row.integer("job_id", minimum=0)
        if number in seen:
            raise row.error("job_id", f"job {number} is listed twice", "keep one row per job")
        seen.add(number)
        scale = row.integer("scale_factor", minimum=1)
        job_type = row.text("job_type")
        if (table.get(job_type, REFERENCE_MODEL, scale) or 0.0) <= 0:
            raise row.error(
                "job_type",
                f"{job_type!r} has no V100 throughput at scale factor {scale} in {table.source}",
                "give the throughput table the list was generated with (--set throughputs=FILE)",
            )
        if scale not in requests:
            workers, per_worker = split_gang(scale, gpus_per_node)
            requests[scale] = (workers, WorkerRequest(gpus=per_worker))
        workers, request = requests[scale]
        job = Job(
            id=gavel_job_id(number),
            queue=DEFAULT_QUEUE,
            request=request,
            workers=workers,
            submit_seq=index,
            submitted_at=row.number("arrival_time_s", minimum=0.0),
            job_type=job_type,
        )
        jobs.append(TraceJob(job, row.number("duration_s", positive=True)))
    if not jobs:
        raise WorkloadError("has no jobs", "give one row per job", path=file)
    return Workload(
        name=f"gavel-jobs-{file.stem}",
        citation=CITATION,
        license=LICENSE,
        nodes=gavel_cluster(gpus_per_model, gpus_per_node),
        queues=(QueueSpec(DEFAULT_QUEUE),),
        jobs=tuple(jobs),
        throughput=table,
        assumptions=(
            _cluster_assumption(gpus_per_model, gpus_per_node),
            f"Jobs: the {len(jobs)} jobs Gavel's own simulator generated in {file.name} (arrival, type, scale "
            "factor, duration on V100), replayed as listed.",
            "Run time elsewhere = duration / relative speed from the throughput table. Jobs larger than a node span "
            "nodes: their speed is the table's unconsolidated entry.",
        ),
    )


def _throughputs_beside(file: Path) -> Path:
    for folder in (file.parent, file.parent.parent):
        if (folder / THROUGHPUT_FILE).is_file():
            return folder / THROUGHPUT_FILE
    raise WorkloadError(
        f"no {THROUGHPUT_FILE} beside the job list or in its parent folder",
        "give the throughput table: --set throughputs=FILE",
        path=file,
    )
