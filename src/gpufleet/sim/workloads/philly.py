"""Microsoft Philly (2017) jobs as derived by Pollux, on the VC-partitioned cluster of the Helios artifact.

Files (in the folder the user gives): `philly_jobs_pollux.csv` (82,247 jobs: `timestamp` submission time
`YYYY-MM-DD HH:MM:SS`, `duration` s, `num_gpus`, `gpu_time` = duration x GPUs, `cluster` the VC hash) and
`philly_vc_nodes_helios.csv` (`vc`, `node num`: 11 VCs, 352 nodes of 8 GPUs). Published Helios results:
`helios_qssf_philly_published_results.csv`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gpufleet.domain import GPU, GiB, Job, QueueSpec, Quota, make_node
from gpufleet.sim.workload import TraceJob, Workload, WorkloadError
from gpufleet.sim.workloads._common import RequestCache, located, resolve, split_gang
from gpufleet.sim.workloads._csv import CsvTable, Row, existing_file

FOLDER = "philly-2017"
JOBS_FILE = "philly_jobs_pollux.csv"
VC_FILE = "philly_vc_nodes_helios.csv"
RESULTS_FILE = "helios_qssf_philly_published_results.csv"
JOB_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
GPUS_PER_NODE = 8  # Helios artifact: --num_gpus_per_node 8
# The trace has no GPU model (the raw machine list only says 12 GB or 24 GB per GPU): one generic model,
# with the smaller memory, so no job is placed on memory it might not have.
PHILLY_MODEL = "philly-gpu"
PHILLY_GPU_MEMORY = 12 * GiB
COHORT = "philly"
HELIOS_WINDOW = ("2017-10-01 00:00:00", "2017-11-30 23:59:59")  # jobs Helios simulated
# The first week of Helios' window: the data `default`'s LAS minimum run was tuned on (gpufleet.sim.tuned).
LAS_TUNING_WINDOW = ("2017-10-01 00:00:00", "2017-10-07 23:59:59")
# Submission windows by name: Helios' (the published results are on it), its first week (tuning data), and
# the months outside it.
WINDOWS: dict[str, tuple[str, str]] = {
    "oct-nov": HELIOS_WINDOW,
    "oct-week1": LAS_TUNING_WINDOW,
    "september": ("2017-09-01 00:00:00", "2017-09-30 23:59:59"),
    "december": ("2017-12-01 00:00:00", "2017-12-31 23:59:59"),
}

CITATION = (
    "Jeon, Venkataraman, Phanishayee, Qian, Xiao, Yang. Analysis of Large-Scale Multi-Tenant GPU Clusters for "
    "DNN Training Workloads. USENIX ATC 2019 (Microsoft Philly trace). Job table derived by Qiao et al., "
    "Pollux, OSDI 2021 (petuum/adaptdl); VC sizes from Hu et al., Characterization and Prediction of Deep "
    "Learning Workloads in Large-Scale GPU Datacenters, SC 2021 (HeliosArtifact)."
)
LICENSE = "Philly data CC-BY-4.0 (Microsoft); job table via petuum/adaptdl (Apache-2.0); VC table MIT (HeliosArtifact)."

FIELD_COLUMNS = {"gpus": "num_gpus", "queue": "cluster", "workers": "num_gpus"}


def _parse_time(text: str, what: str) -> datetime:
    try:
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise WorkloadError(f"{what} {text!r} is not a time", "write YYYY-MM-DD HH:MM:SS") from None


def _row_time(row: Row) -> datetime:
    text = row.text("timestamp")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise row.error(
            "timestamp", f"{text!r} is not a time", "write YYYY-MM-DD HH:MM:SS, e.g. 2017-10-09 07:01:55"
        ) from None


def load_vc_nodes(path: str | Path) -> dict[str, int]:
    """VC -> node count, from a Helios `philly_vc.csv`-style file (`vc`, `node num`)."""
    table = CsvTable(Path(path), "Philly VC table", ("vc", "node num"))
    sizes: dict[str, int] = {}
    for row in table:
        vc = row.text("vc")
        if vc in sizes:
            raise row.error("vc", f"VC {vc!r} is listed twice", "give each VC once")
        sizes[vc] = row.integer("node num", minimum=1)
    if not sizes:
        raise WorkloadError("lists no VC", "give one row per VC: vc,node num", path=table.path)
    return sizes


def load_philly(
    path: str | Path,
    *,
    vc_nodes: str | Path | None = None,
    start: str | None = None,
    end: str | None = None,
    vc_borrowing: bool = False,
    drop_unknown_vcs: bool = False,
) -> Workload:
    """Philly jobs on 352 nodes x 8 GPUs, one queue per VC with the VC's GPUs as nominal quota.

    `path`: the trace folder, or the jobs CSV (the VC table is then looked for beside it, or give `vc_nodes`).
    `start`/`end` (`YYYY-MM-DD HH:MM:SS`, inclusive) keep only jobs submitted in that window; Helios used
    `HELIOS_WINDOW`. Arrival = seconds since `start`, or since the first job. Jobs of more than 8 GPUs become
    gangs of equal workers of at most 8 (16 -> 2 x 8, 12 -> 2 x 6).

    Queues: cohort "philly"; a VC's queue may not borrow (borrowing_limit 0: jobs run inside their VC, as in
    Helios) unless `vc_borrowing`. Jobs of VCs missing from the VC table (4 VCs, 18 jobs) get a queue with
    nominal 0 that may only borrow idle quota, unless `drop_unknown_vcs`.
    """
    folder, jobs_path = resolve(path, JOBS_FILE, "Philly jobs CSV")
    vc_path = Path(vc_nodes).expanduser() if vc_nodes is not None else folder / VC_FILE
    existing_file(vc_path, "Philly VC table", f"put {VC_FILE} beside the jobs CSV, or pass vc_nodes=PATH")
    sizes = load_vc_nodes(vc_path)
    lo = _parse_time(start, "start") if start else None
    hi = _parse_time(end, "end") if end else None
    if lo and hi and hi < lo:
        raise WorkloadError(f"end {end} is before start {start}", "give start <= end")
    table = CsvTable(jobs_path, "Philly jobs CSV", JOB_COLUMNS, optional=("gpu_time",))
    kept = _rows_in_window(table, lo, hi, sizes if drop_unknown_vcs else None)
    t0 = lo or min(when for when, _ in kept)
    jobs, unknown = _trace_jobs(kept, t0, sizes, vc_borrowing, with_gpu_time=table.has("gpu_time"))
    nodes = tuple(
        make_node(f"philly-{vc}-{i:02d}", PHILLY_MODEL, GPUS_PER_NODE, PHILLY_GPU_MEMORY)
        for vc, count in sizes.items()
        for i in range(count)
    )
    return Workload(
        name="philly",
        citation=CITATION,
        license=LICENSE,
        nodes=nodes,
        queues=_vc_queues(sizes, unknown, vc_borrowing),
        jobs=jobs,
        assumptions=(
            f"Cluster: Helios' VC sizes, {len(nodes)} nodes x {GPUS_PER_NODE} GPUs of one generic model "
            f"{PHILLY_MODEL!r} with {PHILLY_GPU_MEMORY // GiB} GiB (the trace has no GPU model; 12 or 24 GB).",
            "Queues: one per VC, nominal quota = its nodes x 8 GPUs, cohort 'philly', "
            + ("borrowing allowed." if vc_borrowing else "no borrowing (jobs stay in their VC, as in Helios)."),
            f"Jobs of VCs not in the VC table ({', '.join(sorted(unknown)) or 'none'}) get nominal 0 "
            "and run only on borrowed idle quota.",
            "Jobs of more than 8 GPUs: gangs of equal workers of at most 8 GPUs; no CPU or memory requests.",
            f"Submission window: {start or 'first job'} .. {end or 'last job'}; arrival = seconds since its "
            "start; durations as in the trace.",
        ),
    )


def _rows_in_window(
    table: CsvTable, lo: datetime | None, hi: datetime | None, known_vcs: dict[str, int] | None
) -> list[tuple[datetime, Row]]:
    """The rows submitted in [lo, hi], with their time; only VCs in `known_vcs` when it is given."""
    kept: list[tuple[datetime, Row]] = []
    for row in table:
        when = _row_time(row)
        if (lo and when < lo) or (hi and when > hi):
            continue
        if known_vcs is not None and row.text("cluster") not in known_vcs:
            continue
        kept.append((when, row))
    if not kept:
        raise WorkloadError(
            "no job is left after the time window and VC filters",
            "widen start/end, or check the VC names",
            path=table.path,
        )
    return kept


def _trace_jobs(
    kept: list[tuple[datetime, Row]], t0: datetime, sizes: dict[str, int], vc_borrowing: bool, *, with_gpu_time: bool
) -> tuple[tuple[TraceJob, ...], set[str]]:
    """The rows as jobs, sorted by arrival (then row), and the VCs they name that the VC table lacks."""
    cache = RequestCache()
    jobs: list[TraceJob] = []
    unknown: set[str] = set()
    for when, row in kept:
        gpus = row.integer("num_gpus", minimum=1)
        vc = row.text("cluster")
        if vc not in sizes:
            unknown.add(vc)
        elif gpus > sizes[vc] * GPUS_PER_NODE and not vc_borrowing:
            raise row.error(
                "num_gpus",
                f"{gpus} GPUs is more than VC {vc!r} has ({sizes[vc] * GPUS_PER_NODE})",
                "enlarge the VC in the VC table, or load with vc_borrowing=True",
            )
        workers, per_worker = split_gang(gpus, GPUS_PER_NODE)
        with located(row, FIELD_COLUMNS):
            job = Job(
                id=f"philly-{row.index:05d}",
                queue=vc,
                request=cache.get(gpus=per_worker),
                workers=workers,
                submit_seq=row.index,
                submitted_at=(when - t0).total_seconds(),
            )
        duration = row.number("duration", positive=True)
        gpu_time = row.number("gpu_time", minimum=0) if with_gpu_time else duration * gpus
        jobs.append(TraceJob(job, duration, gpu_time))
    jobs.sort(key=lambda tj: (tj.job.submitted_at, tj.job.submit_seq))
    return tuple(jobs), unknown


def _vc_queues(sizes: dict[str, int], unknown: set[str], vc_borrowing: bool) -> tuple[QueueSpec, ...]:
    """One queue per VC with its GPUs as nominal quota; VCs missing from the table get nominal 0."""
    queues = [
        QueueSpec(
            vc,
            {GPU: Quota(nominal=count * GPUS_PER_NODE * 1000, borrowing_limit=None if vc_borrowing else 0)},
            cohort=COHORT,
        )
        for vc, count in sizes.items()
    ]
    queues += [QueueSpec(vc, {GPU: Quota(nominal=0)}, cohort=COHORT) for vc in sorted(unknown)]
    return tuple(queues)


@dataclass(frozen=True, slots=True)
class HeliosResult:
    """One published number: `metric` (avg_jct_s, avg_queue_s) of `policy` with `placer` for a VC or `all`."""

    vc: str
    policy: str
    placer: str
    metric: str
    value: float


@dataclass(frozen=True, slots=True)
class HeliosResults:
    """Helios' published FIFO/SJF/SRTF/QSSF results on Philly (per VC and `all`)."""

    rows: tuple[HeliosResult, ...]

    def value(self, policy: str, metric: str, vc: str = "all", placer: str = "consolidate") -> float:
        for r in self.rows:
            if (r.vc, r.policy, r.placer, r.metric) == (vc, policy, placer, metric):
                return r.value
        raise WorkloadError(
            f"no published {metric!r} for policy {policy!r}, VC {vc!r}, placer {placer!r}",
            f"policies: {', '.join(sorted({r.policy for r in self.rows}))}; "
            f"metrics: {', '.join(sorted({r.metric for r in self.rows}))}",
        )


def load_helios_results(path: str | Path) -> HeliosResults:
    """Read `helios_qssf_philly_published_results.csv` (the file, or the Philly folder)."""
    p = Path(path).expanduser()
    file = p / RESULTS_FILE if p.is_dir() else p
    table = CsvTable(file, "Helios results CSV", ("vc", "policy", "placer", "metric", "value"))
    return HeliosResults(
        tuple(
            HeliosResult(
                row.text("vc"),
                row.text("policy"),
                row.text("placer"),
                row.text("metric"),
                row.number("value", minimum=0),
            )
            for row in table
        )
    )
