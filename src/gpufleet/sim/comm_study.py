"""What the communication model changes, simulated (`gpufleet sim --comm-study`).

**The workload**: the given one with every job of two or more GPUs written as a data-parallel gang of 1-GPU
workers (one process per GPU, as `torchrun` starts them), so its workers may land on one node or many. Each such
job declares what it synchronises (`Job.comm`), drawn from a seeded generator: a model of 350M, 1.3B, 7B or 13B
parameters with bf16 gradients (2 bytes a parameter), a compute step time log-uniform in [0.25 s, 2 s], and
`max_comm_overhead` (the study's setting; None: the score only).

**Two variants**, same jobs, same profile, same simulator physics (a gang's run is stretched by its placement's
predicted all-reduce, `domain.comm`, whatever the scheduler knew): `model off` (the scheduler does not see the
jobs' needs: `SimSettings.comm_hidden`) and `model on` (the topology score prefers cheaper rings; placements above
a job's limit wait). A decision "changed" when a job's first placement spans a different set of nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufleet.control.reconciler import Reconciler
from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.comm import DTYPE_BYTES, CommNeeds
from gpufleet.domain.jobs import Job
from gpufleet.domain.lifecycle import JobState
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.comm_gate import placement_estimate
from gpufleet.sim.engine import SimRun, SimSettings, Simulation
from gpufleet.sim.experiment import policy_data
from gpufleet.sim.metrics import compute_metrics
from gpufleet.sim.workload import TraceJob, Workload

VARIANTS = ("model off", "model on")
GATE_WORDS = "above its max_comm_overhead"  # in the reason of a job the gate held back (`comm_gate.gate`)
MODEL_PARAMS = (350e6, 1.3e9, 7e9, 13e9)
STEP_RANGE_S = (0.25, 2.0)


@dataclass(frozen=True, slots=True)
class CommStudy:
    max_overhead: float | None = 0.25
    seed: int = 0


def comm_workload(workload: Workload, study: CommStudy) -> Workload:
    """The workload with its multi-GPU jobs as 1-GPU-worker gangs that declare their communication needs."""
    rng = np.random.default_rng(study.seed)
    low, high = np.log(STEP_RANGE_S[0]), np.log(STEP_RANGE_S[1])
    jobs: list[TraceJob] = []
    for trace_job in workload.jobs:
        job = trace_job.job
        gpus = job.request.gpus * job.workers if not job.request.fractional else 0
        if gpus < 2:
            jobs.append(trace_job)
            continue
        params = MODEL_PARAMS[int(rng.integers(0, len(MODEL_PARAMS)))]
        step = float(np.exp(rng.uniform(low, high)))
        needs = CommNeeds(int(params * DTYPE_BYTES["bf16"]), round(step, 3), study.max_overhead)
        request = job.request
        per_gpu = dataclasses.replace(
            request, gpus=1, cpu_milli=request.cpu_milli // request.gpus, memory=request.memory // request.gpus
        )
        gang = dataclasses.replace(job, request=per_gpu, workers=gpus, min_workers=None, comm=needs)
        jobs.append(dataclasses.replace(trace_job, job=gang))
    return dataclasses.replace(workload, jobs=tuple(jobs))


def _first_launches(sim: Simulation) -> dict[str, tuple[WorkerPlacement, ...]]:
    """Records each job's first placement as the simulated backend launches it."""
    first: dict[str, tuple[WorkerPlacement, ...]] = {}
    speed = sim.backend.speed

    def recording(job: Job, workers: tuple[WorkerPlacement, ...]) -> float:
        first.setdefault(job.id, workers)
        return speed(job, workers)

    sim.backend.speed = recording
    return first


def _held_back(sim: Simulation, held: set[str]) -> Callable[[float, Reconciler], None]:
    """An observer noting the jobs that waited, at least once, because their placement passed their limit."""
    store = sim.store

    def observe(now: float, reconciler: Reconciler) -> None:
        held.update(r.id for r in store.all() if r.state is JobState.PENDING and GATE_WORDS in r.waiting_reason)

    return observe


def _nodes(workers: Sequence[WorkerPlacement]) -> tuple[str, ...]:
    return tuple(sorted({w.node for w in workers}))


def run_comm_study(workload: Workload, study: CommStudy, policy: str = "default") -> dict[str, Any]:
    """The two variants (see the module doc), as one JSON-able report."""
    study_workload = comm_workload(workload, study)
    needs = {t.id: t.job.comm for t in study_workload.jobs if t.job.comm is not None}
    rows: dict[str, Any] = {}
    placements: dict[str, dict[str, tuple[WorkerPlacement, ...]]] = {}
    runs: dict[str, SimRun] = {}
    for variant in VARIANTS:
        settings = SimSettings(comm_hidden=variant == "model off")
        sim = Simulation(study_workload, profile(policy, policy_data(study_workload)), settings)
        first = placements[variant] = _first_launches(sim)
        held: set[str] = set()
        sim.observer = _held_back(sim, held)
        run = runs[variant] = sim.run()
        table = sim.reconciler.base.table
        shares = [placement_estimate(needs[j], table, w).overhead for j, w in first.items() if j in needs]
        metrics = compute_metrics(run, policy=policy)
        rows[variant] = {
            "jobs_finished": metrics.jobs_finished,
            "jobs_unfinished": metrics.jobs_unfinished,
            "makespan_h": round((run.end_time - sim.start) / 3600.0, 3),
            "gangs_held_back_by_limit": len(held),
            "gangs_placed_across_nodes": sum(1 for j, w in first.items() if j in needs and len(_nodes(w)) > 1),
            "gang_comm_overhead_mean_pct": round(100.0 * float(np.mean(shares)), 2) if shares else None,
            "gang_comm_overhead_max_pct": round(100.0 * float(np.max(shares)), 2) if shares else None,
        }
    # JCT over the jobs both variants finished: a job the model keeps waiting for good (no placement within its
    # limit) has no JCT, and leaving it out of one side only would flatter that side.
    finished = [{r.id for r in run.store.all() if r.finished_at is not None} for run in runs.values()]
    common = frozenset.intersection(*map(frozenset, finished))
    for variant, run in runs.items():
        every = compute_metrics(run, job_ids=common, policy=policy)
        gangs = compute_metrics(run, job_ids=common & frozenset(needs), policy=policy)
        rows[variant] |= {
            "jct_mean_h": _hours(every.jct.avg),
            "jct_p95_h": _hours(every.jct.p95),
            "gang_jct_mean_h": _hours(gangs.jct.avg),
            "gang_jct_p95_h": _hours(gangs.jct.p95),
        }
    off, on = placements["model off"], placements["model on"]
    both = [j for j in needs if j in off and j in on]
    changed = sum(1 for j in both if _nodes(off[j]) != _nodes(on[j]))
    return {
        "workload": workload.name,
        "workload_citation": workload.citation,
        "policy": policy,
        "gangs_with_comm_needs": len(needs),
        "max_comm_overhead": study.max_overhead,
        "seed": study.seed,
        "placements_changed": changed,
        "placements_compared": len(both),
        "jobs_in_jct": len(common),
        "variants": rows,
        "notes": [
            "jobs of 2+ GPUs run as gangs of 1-GPU workers declaring 350M-13B bf16 models and 0.25-2 s steps (seeded)",
            "both variants stretch a gang's run by its placement's predicted all-reduce (domain.comm); only 'model "
            "on' lets the scheduler see it",
            "held back: jobs that waited at least once because the placement on offer passed their limit",
            "a placement changed: the job's first placement spans a different set of nodes (knock-on changes included:"
            " once one gang waits or lands elsewhere, later jobs find a different cluster)",
            "JCT over the jobs both variants finished; a job never placed within its limit is counted as unfinished",
        ],
    }


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 3600.0, 3)


__all__ = ["CommStudy", "comm_workload", "run_comm_study"]
