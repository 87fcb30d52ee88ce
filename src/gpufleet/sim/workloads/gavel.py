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

from gpufleet.domain import GiB, Job, QueueSpec, WorkerRequest, make_node
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
    if gpus_per_model < 1 or gpus_per_node < 1 or gpus_per_model % gpus_per_node:
        raise WorkloadError(
            f"{gpus_per_model} GPUs per model in nodes of {gpus_per_node}",
            "give gpus_per_model as a positive multiple of gpus_per_node, e.g. 36 and 4",
        )
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

    nodes = tuple(
        make_node(f"gavel-{model.lower()}-{n:02d}", model, gpus_per_node, memory)
        for model, memory in GAVEL_MODELS.items()
        for n in range(gpus_per_model // gpus_per_node)
    )
    return Workload(
        name=f"gavel-{'multi' if multi_gpu else 'single'}-{rate_per_hour:g}jph-seed{seed}",
        citation=CITATION,
        license=LICENSE,
        nodes=nodes,
        queues=(QueueSpec(DEFAULT_QUEUE),),
        jobs=tuple(jobs),
        throughput=table,
        assumptions=(
            f"Cluster: {gpus_per_model} each of V100, P100, K80 in nodes of {gpus_per_node} GPUs (Gavel fixes the "
            "GPU counts, not the server shape); GPU memory V100 16 GiB, P100 16 GiB, K80 12 GiB.",
            f"Arrivals: Poisson, {rate_per_hour:g} jobs/hour, first job after one exponential gap; numpy "
            f"default_rng({seed}) (Gavel's own random stream is not reproduced).",
            "Job type uniform over the templates measured at the job's scale factor; scale factor "
            + ("1/2/4/8 w.p. 0.70/0.10/0.15/0.05." if multi_gpu else "1 (single-GPU trace)."),
            "Duration on V100 at the job's scale factor: 60*10^U(1.5,3) s w.p. 0.8, else 60*10^U(3,4) s; "
            "run time elsewhere = duration / relative speed from the throughput table. Jobs larger than a node "
            "span nodes: their speed is the table's unconsolidated entry.",
        ),
    )
