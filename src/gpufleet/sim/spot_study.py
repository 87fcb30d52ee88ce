"""What spot capacity saves and what its circuit breaker buys back, simulated (`gpufleet sim --spot-pool`).

**Spot behaviour** comes from the statistics of the "Can't Be Late" spot traces (Wu et al., NSDI 2024;
traces from `skypilot-org/spot-traces`, of which `spot-traces-nsdi24/spot_traces_summary.csv` holds our
per-file statistics, not the raw data): for the chosen zone, the 1-node preemption trace's preemptions per
hour (else the availability trace's losses per hour) and mean time to get an instance back. Each spot node
is lost at exponential times with that rate and comes back after an exponential time with that mean, drawn
from its own seeded generator (`FailureModel(pool="spot")`), so every variant sees the same interruptions.

**The workload**: the given one with `fraction` of its nodes (spread evenly over the name order) turned
into spot nodes of the pool, every job allowed on spot (`spot: allowed`), and `checkpointing_share` of the
jobs (seeded) declaring a checkpoint interval of `checkpoint_every_s` (they lose only the work since their
last checkpoint; the others lose their whole attempt).

**Three variants**, same jobs, same scheduling profile: `spot off` (the same nodes, all on demand),
`breaker off` (spot nodes, no breaker) and `breaker on` (the breakers of `domain.spot`, stepped after every
simulation step with what the simulation sees, their gates written onto the nodes, exactly as the live
control plane does). Cost = GPU-hours allocated per GPU model and pool x the price table (`domain.costs`,
the code that bills live jobs). Lost GPU-hours = work lost to interruptions (since each attempt's last
checkpoint) plus restart penalties.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.control.reconciler import Reconciler
from gpufleet.domain.costs import Pool, PriceTable
from gpufleet.domain.spot import BreakerSettings, SpotBreakers
from gpufleet.policies.catalog import profile
from gpufleet.sim.engine import SimSettings, Simulation
from gpufleet.sim.events import FailureModel
from gpufleet.sim.experiment import policy_data
from gpufleet.sim.metrics import compute_metrics
from gpufleet.sim.simulated_backend import BackendSettings
from gpufleet.sim.workload import Workload, WorkloadError

SPOT_FOLDER = "spot-traces-nsdi24"
SPOT_FILE = "spot_traces_summary.csv"
SPOT_CITATION = (
    "spot interruptions: Wu, Chiang, Mao, Yang, Friedman, Shenker, Stoica, \"Can't Be Late: Optimizing Spot "
    'Instance Savings under Deadlines", USENIX NSDI 2024 (traces: skypilot-org/spot-traces)'
)
VARIANTS = ("spot off", "breaker off", "breaker on")


@dataclass(frozen=True, slots=True)
class SpotTrace:
    zone: str
    kind: str  # preemption or availability
    instance: str
    interruptions_per_hour: float
    mean_down_hours: float
    duration_hours: float


def load_spot_trace(path: Path, zone: str) -> SpotTrace:
    """The zone's 1-node trace statistics: a GPU instance's trace where there is one, its preemption trace
    over its availability trace."""
    file = path / SPOT_FILE if path.is_dir() else path
    try:
        rows = list(csv.DictReader(file.read_text(encoding="utf-8").splitlines()))
    except OSError as error:
        raise WorkloadError(
            f"cannot read the spot statistics: {error.strerror}",
            f"give the folder {SPOT_FOLDER} (or its {SPOT_FILE}) with --spot-traces",
            path=file,
        ) from None
    ones = [r for r in rows if r.get("nodes_target") == "1" and r.get("zone") == zone]
    # GPU instances first (the V100 and K80 traces), then a preemption trace over an availability one.
    ones.sort(
        key=lambda r: (
            not r.get("instance_tag", "").startswith(("v100", "k80")),
            r.get("trace_kind") != "preemption",
            r.get("start_date", ""),
        )
    )
    if not ones:
        zones = sorted({r.get("zone", "") for r in rows if r.get("nodes_target") == "1"})
        raise WorkloadError(f"no 1-node spot trace for zone {zone!r}", f"give one of: {', '.join(zones)}", path=file)
    row = ones[0]
    try:
        return SpotTrace(
            zone,
            row["trace_kind"],
            row["instance_tag"],
            float(row["decrease_events_per_hour"]),
            float(row["mean_short_period_hours"]),
            float(row["duration_hours"]),
        )
    except (KeyError, ValueError):
        raise WorkloadError(
            f"the row of zone {zone!r} is not complete", "use the file as published", path=file
        ) from None


@dataclass(frozen=True, slots=True)
class SpotStudy:
    zone: str
    fraction: float = 0.5  # of the nodes turned into spot nodes
    checkpointing_share: float = 0.5  # of the jobs that checkpoint
    checkpoint_every_s: float = 1800.0
    seed: int = 0
    breaker: BreakerSettings = dataclasses.field(default_factory=BreakerSettings)

    def __post_init__(self) -> None:
        for name in ("fraction", "checkpointing_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise WorkloadError(f"{name} is {value}", "give a share in [0, 1]")


def parse_spot_pool(text: str) -> tuple[str, float]:
    """`--spot-pool ZONE[:FRACTION]`, e.g. `us-east-1a:0.5`."""
    zone, _, share = text.partition(":")
    try:
        fraction = float(share) if share else 0.5
    except ValueError:
        fraction = -1.0
    if not zone.strip() or not 0.0 < fraction <= 1.0:
        raise WorkloadError(f"--spot-pool {text!r} is not ZONE[:FRACTION]", "e.g. --spot-pool us-east-1a:0.5")
    return zone.strip(), fraction


def spot_workload(workload: Workload, study: SpotStudy, spot: bool) -> Workload:
    """The workload of one variant (see the module doc); `spot=False` keeps every node on demand."""
    names = sorted(n.name for n in workload.nodes)
    count = round(study.fraction * len(names)) if spot else 0
    chosen = {names[int(i * len(names) / count)] for i in range(count)} if count else set()
    nodes = tuple(
        dataclasses.replace(n, pool="spot", zone=study.zone) if n.name in chosen else n for n in workload.nodes
    )
    rng = np.random.default_rng((study.seed, 0x5907))
    saving = rng.random(len(workload.jobs)) < study.checkpointing_share
    jobs = []
    for trace_job, checkpoints in zip(workload.jobs, saving, strict=True):
        job = trace_job.job
        request = dataclasses.replace(job.request, spot="allowed", checkpoints=bool(checkpoints))
        interval = study.checkpoint_every_s if checkpoints else None
        jobs.append(
            dataclasses.replace(trace_job, job=dataclasses.replace(job, request=request, checkpoint_interval=interval))
        )
    return dataclasses.replace(workload, nodes=nodes, jobs=tuple(jobs))


class PoolMeter:
    """A simulation observer: GPU-seconds allocated per (GPU model, pool) between steps, and (with `breakers`)
    the spot breakers stepped on what the simulation sees, their gates written onto its nodes."""

    def __init__(self, sim: Simulation, breakers: SpotBreakers | None) -> None:
        self.sim = sim
        self.breakers = breakers
        self.gpu_seconds: dict[tuple[str, str], float] = {}
        self.events: list[str] = []
        self._last: float | None = None
        self._allocated: dict[tuple[str, str], float] = {}

    def __call__(self, now: float, reconciler: Reconciler) -> None:
        if self._last is not None and now > self._last:
            for key, gpus in self._allocated.items():
                self.gpu_seconds[key] = self.gpu_seconds.get(key, 0.0) + gpus * (now - self._last)
        self._last = now
        table = reconciler.base.table
        used = (table.gpu_milli_total - table.node_milli_free) / 1000.0
        allocated: dict[tuple[str, str], float] = {}
        for i, name in enumerate(table.names):
            node = self.sim.nodes[name]
            model = table.node_model[i] or "mixed"
            key = (model, node.pool)
            allocated[key] = allocated.get(key, 0.0) + float(used[i])
        self._allocated = allocated
        if self.breakers is not None:
            self._step_breakers(now, reconciler)

    def _step_breakers(self, now: float, reconciler: Reconciler) -> None:
        assert self.breakers is not None
        holdings = {
            job_id: frozenset(w.node for w in holding.workers) for job_id, holding in reconciler.base.holdings.items()
        }
        gates, events = self.breakers.step(now, self.sim.nodes.values(), holdings)
        self.events.extend(f"{e.at:.0f}s {e.pool} {e.state.value}: {e.reason}" for e in events)
        changed = False
        for name, gate in gates.items():
            node = self.sim.nodes[name]
            if node.admits != gate:
                self.sim.nodes[name] = dataclasses.replace(node, admits=gate)
                changed = True
        if changed:
            self.sim.store.set_cluster(nodes=tuple(self.sim.nodes.values()))


def _cost(gpu_seconds: Mapping[tuple[str, str], float], prices: PriceTable) -> tuple[float, float]:
    """(USD, GPU-hours without a price)."""
    usd = unpriced = 0.0
    for (model, pool), seconds in gpu_seconds.items():
        price = prices.usd_per_gpu_hour(model, Pool(pool))
        if price is None:
            unpriced += seconds / 3600.0
        else:
            usd += seconds / 3600.0 * price
    return usd, unpriced


def run_spot_study(
    workload: Workload, study: SpotStudy, trace: SpotTrace, prices: PriceTable, policy: str = "default"
) -> dict[str, Any]:
    """The three variants (see the module doc), as one JSON-able report."""
    failures = FailureModel(
        mtbf_hours=1.0 / max(trace.interruptions_per_hour, 1e-9),
        repair_hours=max(trace.mean_down_hours, 1e-3),
        seed=study.seed,
        pool="spot",
    )
    backend = BackendSettings(per_job_checkpoints=True)
    horizon = max((t.job.submitted_at for t in workload.jobs), default=0.0) + 30 * 86400.0
    rows: dict[str, Any] = {}
    for variant in VARIANTS:
        spot = variant != "spot off"
        variant_workload = spot_workload(workload, study, spot)
        settings = SimSettings(backend=backend, failures=failures if spot else None, horizon_s=horizon)
        sim = Simulation(variant_workload, profile(policy, policy_data(variant_workload)), settings)
        meter = PoolMeter(sim, SpotBreakers(study.breaker) if variant == "breaker on" else None)
        sim.observer = meter
        run = sim.run()
        metrics = compute_metrics(run, policy=policy)
        usd, unpriced = _cost(meter.gpu_seconds, prices)
        rows[variant] = {
            "cost_usd": round(usd, 2),
            "unpriced_gpu_hours": round(unpriced, 2),
            "gpu_hours_by_pool": {
                pool: round(sum(s for (_, p), s in meter.gpu_seconds.items() if p == pool) / 3600.0, 2)
                for pool in sorted({p for _, p in meter.gpu_seconds})
            },
            "jct_mean_h": None if metrics.jct.avg is None else round(metrics.jct.avg / 3600.0, 3),
            "jct_p95_h": None if metrics.jct.p95 is None else round(metrics.jct.p95 / 3600.0, 3),
            "jobs_finished": metrics.jobs_finished,
            "jobs_unfinished": metrics.jobs_unfinished,
            "spot_interruptions": metrics.node_failures,
            "jobs_lost_to_interruptions": metrics.jobs_lost_to_failures,
            "lost_gpu_hours": round(metrics.failure_lost_gpu_hours + metrics.restart_penalty_gpu_hours, 2),
            "breaker_events": len(meter.events),
        }
    base = rows["spot off"]["cost_usd"]
    for variant in VARIANTS[1:]:
        row = rows[variant]
        row["saving_vs_spot_off_pct"] = round(100.0 * (base - row["cost_usd"]) / base, 1) if base else None
    return {
        "workload": workload.name,
        "workload_citation": workload.citation,
        "policy": policy,
        "spot_pool": {"zone": trace.zone, "fraction_of_nodes": study.fraction, "trace": dataclasses.asdict(trace)},
        "jobs_checkpointing_share": study.checkpointing_share,
        "checkpoint_every_s": study.checkpoint_every_s,
        "breaker": dataclasses.asdict(study.breaker),
        "seed": study.seed,
        "variants": rows,
        "citations": [SPOT_CITATION],
        "notes": [
            "cost = GPU-hours allocated per GPU model and pool x the price table (unpriced models listed apart)",
            "lost GPU-hours = work lost to spot interruptions since each attempt's last checkpoint + restart penalties",
            f"horizon: {horizon / 86400.0:.0f} days after the last arrival; jobs not done by then are unfinished",
        ],
    }


__all__ = ["SpotStudy", "SpotTrace", "load_spot_trace", "parse_spot_pool", "run_spot_study", "spot_workload"]
