"""The FGD paper's (ATC'23) workload protocol on the openb trace, and its published results.

Protocol, as the trace README describes it: for each seed, sample pods *with replacement* from the pod list
until their total GPU request reaches a given share of the cluster's GPU capacity (130 %, `-tune 1.3`),
shuffle the order, and schedule them one by one on the 1213 GPU nodes; pods never leave. This module makes the
ordered pod list (and a Workload around it); simulating and measuring are elsewhere.

`with_gpu_share` builds pod lists where GPU sharing weighs more than in `default` (28.5 % of the GPU request
there), as the FGD paper's `gpushare*` lists do: the GPU pods are redrawn, seeded, so that fractional pods
make up a given share of the GPU request. These are our resamples, not the published lists (which give
only the columns this loader needs, and load as any pod list: `pods=PATH`).

The README rule is the default. `keep_originals=True` follows the upstream simulator's code instead
(`TunePodsByNodeTotalResource`): every pod of the list once, then random copies appended while the next one
still fits under the target (the total never exceeds it; upstream's check compares the per-GPU share of the
next pod, so a multi-GPU pod can take it a few GPUs over: that slip is not copied). Neither reproduces the
upstream random stream (Go's `math/rand`); runs are comparable in distribution, not pod for pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gpufleet.domain import QueueSpec
from gpufleet.sim.workload import TraceJob, Workload, WorkloadError
from gpufleet.sim.workloads._common import DEFAULT_QUEUE
from gpufleet.sim.workloads._csv import CsvTable, existing_file
from gpufleet.sim.workloads.openb import (
    CITATION,
    LICENSE,
    load_openb_nodes,
    load_openb_pods,
    memory_assumption,
    openb_paths,
)

EXPECTED_FILE = "fgd_atc23_expected_results_summary.csv"
DEFAULT_TARGET_PCT = 130.0
FGD_SEEDS = tuple(range(42, 52))  # the paper's 10 seeds
METRICS = ("gpu_alloc_pct", "frag_gpu_pct_of_capacity", "frag_ratio_pct_of_idle")
STATS = ("mean", "min", "max")


def fgd_sample_pods(
    pods: Sequence[TraceJob],
    gpu_capacity_milli: int,
    *,
    seed: int,
    target_pct: float = DEFAULT_TARGET_PCT,
    keep_originals: bool = False,
) -> tuple[TraceJob, ...]:
    """The FGD protocol's arrival list: pods drawn with replacement until their GPU request reaches
    `target_pct` % of `gpu_capacity_milli`, then shuffled with numpy `default_rng(seed)`.

    Stop rule (README): draw while the total is below the target; the draw that reaches or passes it is the
    last one kept. So the total is >= the target, and less than the target plus one pod. CPU-only pods are
    drawn too (they count 0 GPU). With `keep_originals`, see the module docstring.

    Copies get ids `<pod>#<k>` (k = draw number), and `submit_seq` = position; arrivals are 1 s apart (the
    protocol is not a time replay: only the order matters) and no pod has a duration.
    """
    if not pods:
        raise WorkloadError("no pods to sample from", "load a pod list with at least one pod")
    if gpu_capacity_milli <= 0:
        raise WorkloadError(f"cluster GPU capacity is {gpu_capacity_milli} milli-GPU", "sample for a cluster with GPUs")
    if not target_pct > 0:
        raise WorkloadError(f"target is {target_pct} % of capacity", "give a target > 0, e.g. 130")
    milli = np.array([tj.gpu_milli_total for tj in pods], dtype=np.int64)
    if milli.sum() <= 0:
        raise WorkloadError("no pod requests a GPU, so no GPU target can be reached", "sample a pod list with GPU pods")
    target = target_pct / 100.0 * gpu_capacity_milli
    rng = np.random.default_rng(seed)
    rule = _upstream_rule if keep_originals else _readme_rule
    chosen = _named(pods, rule(milli, target, rng))
    order = rng.permutation(len(chosen))
    sampled = []
    for position, k in enumerate(order):
        draw = chosen[k]
        source = pods[draw[1]]
        job = replace(source.job, id=draw[0], submit_seq=position, submitted_at=float(position))
        sampled.append(TraceJob(job, None, source.gpu_seconds_total))
    return tuple(sampled)


def with_gpu_share(pods: Sequence[TraceJob], share_pct: float, *, seed: int = 0) -> tuple[TraceJob, ...]:
    """The pod list with its GPU pods redrawn (with replacement, numpy `default_rng(seed)`) so that
    fractional pods ask for `share_pct` % of the GPU request; as many GPU pods as before, CPU-only pods kept.

    With mean requests f (fractional pods) and w (whole-GPU pods) and G GPU pods, n = P G w / ((1 - P) f + P w)
    fractional pods give the share P. Copies are named `<pod>~<k>`; arrivals keep the list's order.
    """
    if not 0 < share_pct <= 100:
        raise WorkloadError(f"GPU-sharing share is {share_pct:g} %", "give a share in (0, 100], e.g. 60")
    fractional = [tj for tj in pods if tj.job.request.fractional]
    whole = [tj for tj in pods if tj.job.request.gpus and not tj.job.request.fractional]
    if not fractional or (share_pct < 100 and not whole):
        raise WorkloadError(
            "the pod list lacks fractional or whole-GPU pods to redraw from",
            "resample a pod list that has both (e.g. default)",
        )
    share = share_pct / 100.0
    gpu_pods = len(fractional) + len(whole)
    mean_f = float(np.mean([tj.gpu_milli_total for tj in fractional]))
    mean_w = float(np.mean([tj.gpu_milli_total for tj in whole])) if whole else 0.0
    n_fractional = (
        gpu_pods if share == 1.0 else round(share * gpu_pods * mean_w / ((1 - share) * mean_f + share * mean_w))
    )
    rng = np.random.default_rng(seed)
    drawn = [fractional[i] for i in rng.integers(0, len(fractional), size=n_fractional)]
    if gpu_pods > n_fractional:
        drawn += [whole[i] for i in rng.integers(0, len(whole), size=gpu_pods - n_fractional)]
    order = rng.permutation(len(drawn))
    cpu_only = [tj for tj in pods if not tj.job.request.gpus]
    resampled = list(cpu_only)
    for k, i in enumerate(order):
        source = drawn[i]
        resampled.append(replace(source, job=replace(source.job, id=f"{source.id}~{k}")))
    return tuple(replace(tj, job=replace(tj.job, submit_seq=position)) for position, tj in enumerate(resampled))


def gpu_share_pct(pods: Sequence[TraceJob]) -> float:
    """The share (%) of the GPU request that fractional pods make."""
    total = sum(tj.gpu_milli_total for tj in pods)
    shared = sum(tj.gpu_milli_total for tj in pods if tj.job.request.fractional)
    return 100.0 * shared / total if total else 0.0


def _readme_rule(milli: np.ndarray, target: float, rng: np.random.Generator) -> list[tuple[str, int]]:
    mean = float(milli.mean())
    drawn: list[np.ndarray] = []
    total = 0
    while total < target:
        batch = rng.integers(0, len(milli), size=max(64, int(1.1 * (target - total) / mean) + 1))
        cumulative = total + np.cumsum(milli[batch])
        reached = np.flatnonzero(cumulative >= target)
        if reached.size:
            drawn.append(batch[: reached[0] + 1])
            break
        drawn.append(batch)
        total = int(cumulative[-1])
    indices = np.concatenate(drawn)
    return [(f"#{k}", int(i)) for k, i in enumerate(indices)]


def _upstream_rule(milli: np.ndarray, target: float, rng: np.random.Generator) -> list[tuple[str, int]]:
    kept = list(range(len(milli)))
    total = int(milli.sum())
    while total > target:  # the list alone is over the target: drop random pods until it is not
        removed = kept.pop(int(rng.integers(0, len(kept))))
        total -= int(milli[removed])
    chosen = [("", i) for i in kept]
    k = 0
    while True:
        i = int(rng.integers(0, len(milli)))
        if total + int(milli[i]) > target:
            break
        total += int(milli[i])
        chosen.append((f"#{k}", i))
        k += 1
    return chosen


def _named(pods: Sequence[TraceJob], chosen: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(pods[i].id + suffix, i) for suffix, i in chosen]


def fgd_workload(
    path: str | Path,
    *,
    seed: int,
    pods: str = "default",
    target_pct: float = DEFAULT_TARGET_PCT,
    keep_originals: bool = False,
    gpushare_pct: float | None = None,
    resample_seed: int = 0,
) -> Workload:
    """The FGD experiment's input for one seed: the 1213 GPU nodes of openb and the sampled, shuffled pods.

    `gpushare_pct`: first redraw the pod list so fractional pods ask for that share of the GPU request
    (`with_gpu_share`, seeded by `resample_seed`)."""
    node_path, pod_path = openb_paths(path, pods)
    nodes = load_openb_nodes(node_path, gpu_nodes_only=True)
    known = {g.model for n in nodes for g in n.gpus}
    trace = load_openb_pods(pod_path, known_models=known)
    name = pod_list_name(pod_path)
    extra: tuple[str, ...] = ()
    if gpushare_pct is not None:
        trace = with_gpu_share(trace, gpushare_pct, seed=resample_seed)
        name = f"{name}-gpushare{gpushare_pct:g}r{resample_seed}"
        extra = (
            f"Pod list resampled from {pod_list_name(pod_path)} (numpy default_rng({resample_seed})): fractional "
            f"pods ask for {gpu_share_pct(trace):.1f} % of the GPU request (target {gpushare_pct:g} %).",
        )
    capacity = sum(len(n.gpus) for n in nodes) * 1000
    jobs = fgd_sample_pods(trace, capacity, seed=seed, target_pct=target_pct, keep_originals=keep_originals)
    rule = (
        "every pod once, then copies while the total stays <= target (upstream code)"
        if keep_originals
        else "draws until the total reaches the target (README)"
    )
    return Workload(
        name=f"openb-fgd-{name}-seed{seed}",
        citation=CITATION,
        license=LICENSE,
        nodes=nodes,
        queues=(QueueSpec(DEFAULT_QUEUE),),
        jobs=jobs,
        assumptions=(
            memory_assumption(),
            *extra,
            f"FGD protocol: pods sampled with replacement to {target_pct:g} % of {capacity // 1000} GPUs, {rule}, "
            f"shuffled with numpy default_rng({seed}); arrivals 1 s apart; pods never leave.",
        ),
    )


def pod_list_name(pod_path: Path) -> str:
    """`default` for openb_pod_list_default.csv: the name the published results use for a pod list."""
    return pod_path.stem.removeprefix("openb_pod_list_")


@dataclass(frozen=True, slots=True)
class FgdSeries:
    """One published curve: `metric` (`stat` over `n_seeds` seeds) at each arrived-GPU-request step (% of
    capacity). Metrics: gpu_alloc_pct, frag_gpu_pct_of_capacity, frag_ratio_pct_of_idle."""

    workload: str
    policy: str
    metric: str
    stat: str
    n_seeds: int
    arrived_pct: tuple[int, ...]
    values: tuple[float, ...]

    def at(self, arrived_pct: int) -> float:
        try:
            return self.values[self.arrived_pct.index(arrived_pct)]
        except ValueError:
            raise WorkloadError(
                f"no published point at {arrived_pct} % arrived",
                f"use one of {', '.join(map(str, self.arrived_pct))}",
            ) from None


@dataclass(frozen=True, slots=True)
class FgdPoint:
    """The published mean of the three metrics at one arrived-load step, for one (workload, policy)."""

    workload: str
    policy: str
    arrived_pct: int
    gpu_alloc_pct: float
    frag_gpu_pct_of_capacity: float
    frag_ratio_pct_of_idle: float


def _workload_key(workload: str) -> str:
    return workload if workload.startswith("openb_pod_list_") else f"openb_pod_list_{workload}"


@dataclass(frozen=True, slots=True)
class FgdExpectedResults:
    """The FGD authors' cached results (6 policies x 17 pod lists x 3 metrics x mean/min/max over 10 seeds).
    Workloads may be named in full (`openb_pod_list_default`) or short (`default`)."""

    series: tuple[FgdSeries, ...]

    @property
    def policies(self) -> tuple[str, ...]:
        return tuple(sorted({s.policy for s in self.series}))

    @property
    def workloads(self) -> tuple[str, ...]:
        return tuple(sorted({s.workload for s in self.series}))

    def get(self, workload: str, policy: str, metric: str, stat: str = "mean") -> FgdSeries:
        key = (_workload_key(workload), policy, metric, stat)
        for s in self.series:
            if (s.workload, s.policy, s.metric, s.stat) == key:
                return s
        raise WorkloadError(
            f"no published series for workload {workload!r}, policy {policy!r}, metric {metric!r}, stat {stat!r}",
            f"policies: {', '.join(self.policies)}; metrics: {', '.join(METRICS)}; stats: {', '.join(STATS)}",
        )

    def point(self, workload: str, policy: str, arrived_pct: int) -> FgdPoint:
        return FgdPoint(
            _workload_key(workload),
            policy,
            arrived_pct,
            *(self.get(workload, policy, m).at(arrived_pct) for m in METRICS),
        )


def load_fgd_expected_results(path: str | Path) -> FgdExpectedResults:
    """Read `fgd_atc23_expected_results_summary.csv` (the file, or the openb folder that holds it)."""
    p = Path(path).expanduser()
    file = p / EXPECTED_FILE if p.is_dir() else p
    existing_file(file, "FGD expected results", f"give the path to {EXPECTED_FILE} or its folder")
    table = CsvTable(file, "FGD expected results CSV", ("workload", "policy", "metric", "stat", "n_seeds"))
    steps = sorted((int(c[3:]), c) for c in table.columns if c.startswith("arr") and c[3:].isdigit())
    if not steps:
        raise WorkloadError(
            "has no arr<N> columns", "give one column per arrived-load step: arr0, arr5, ... arr130", path=file, line=1
        )
    series = []
    for row in table:
        metric = row.text("metric")
        if metric not in METRICS:
            raise row.error("metric", f"{metric!r} is not a known metric", f"use one of {', '.join(METRICS)}")
        stat = row.text("stat")
        if stat not in STATS:
            raise row.error("stat", f"{stat!r} is not a known statistic", f"use one of {', '.join(STATS)}")
        series.append(
            FgdSeries(
                workload=row.text("workload"),
                policy=row.text("policy"),
                metric=metric,
                stat=stat,
                n_seeds=row.integer("n_seeds", minimum=1),
                arrived_pct=tuple(pct for pct, _ in steps),
                values=tuple(row.number(column) for _, column in steps),
            )
        )
    return FgdExpectedResults(tuple(series))
