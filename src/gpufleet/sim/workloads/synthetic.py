"""A seeded synthetic workload: a cluster of chosen GPU models, team queues with quotas in one cohort, and
jobs of mixed sizes (fractional, 1/2/4/8 GPUs, multi-node gangs) arriving as a Poisson process with
log-normal durations. The same spec and seed give the same workload, value for value (numpy default_rng).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from gpufleet.domain import GPU, GiB, Job, Node, QueueSpec, Quota, WorkerRequest, make_node
from gpufleet.sim.workload import TraceJob, Workload, WorkloadError
from gpufleet.sim.workloads._common import largest_remainder, split_gang

SIZE_CLASSES = ("fractional", "1", "2", "4", "8", "gang")
# Memory of common data-centre GPUs (bytes), from the vendors' data sheets.
GPU_MEMORY: Mapping[str, int] = {
    "H100-80GB": 80 * GiB,
    "A100-80GB": 80 * GiB,
    "A100-40GB": 40 * GiB,
    "L40S": 48 * GiB,
    "A10": 24 * GiB,
    "L4": 24 * GiB,
    "V100-32GB": 32 * GiB,
    "V100-16GB": 16 * GiB,
    "T4": 16 * GiB,
}

CITATION = "gpufleet synthetic workload generator (no external data; parameters listed in the assumptions)."
LICENSE = "Generated data; no third-party terms."


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of a synthetic workload. Mixes are relative weights (they need not sum to 1).

    `queues` maps queue name -> weight: each queue gets that share of the cluster's GPUs as nominal quota
    (whole GPUs, largest-remainder rounding) and of the jobs. `constrained_fraction` of GPU jobs may run on
    one model only. Fractional jobs ask for `fraction x` the smallest model's memory as GPU memory.
    """

    nodes: int = 32
    gpus_per_node: int = 8
    model_mix: Mapping[str, float] = field(default_factory=lambda: {"A100-80GB": 0.5, "H100-80GB": 0.5})
    gpu_memory: Mapping[str, int] = field(default_factory=dict)
    nodes_per_rack: int = 8
    jobs: int = 500
    arrival_rate_per_hour: float = 60.0
    size_mix: Mapping[str, float] = field(
        default_factory=lambda: {"fractional": 0.15, "1": 0.40, "2": 0.15, "4": 0.12, "8": 0.12, "gang": 0.06}
    )
    fractions_milli: tuple[int, ...] = (250, 500, 750)
    gang_workers: tuple[int, ...] = (2, 4)
    duration_median_s: float = 3600.0
    duration_sigma: float = 1.0
    queues: Mapping[str, float] = field(default_factory=lambda: {"team-a": 0.5, "team-b": 0.3, "team-c": 0.2})
    cohort: str | None = "all-teams"
    borrowing: bool = True
    constrained_fraction: float = 0.1
    cpu_milli_per_gpu: int = 8000
    memory_per_gpu: int = 64 * GiB


def _bad(parameter: str, problem: str, fix: str) -> WorkloadError:
    return WorkloadError(f"synthetic parameter {parameter}: {problem}", fix)


def _weights(parameter: str, mix: Mapping[str, float], allowed: tuple[str, ...] | None = None) -> dict[str, float]:
    if not mix:
        raise _bad(parameter, "is empty", "give at least one entry with a weight > 0")
    for key, weight in mix.items():
        if allowed is not None and key not in allowed:
            raise _bad(parameter, f"{key!r} is not known", f"use {', '.join(allowed)}")
        if not (math.isfinite(weight) and weight >= 0):
            raise _bad(parameter, f"weight of {key!r} is {weight}", "give weights >= 0")
    if sum(mix.values()) <= 0:
        raise _bad(parameter, "all weights are 0", "give at least one weight > 0")
    return {k: float(v) for k, v in mix.items() if v > 0}


def _type_ok(value: object, default: object) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(default, Mapping):
        return isinstance(value, Mapping)
    if isinstance(default, tuple):
        return isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return value is None or isinstance(value, str)


def _validate(spec: SyntheticSpec) -> tuple[dict[str, float], dict[str, float], dict[str, float], dict[str, int]]:
    defaults = SyntheticSpec()
    for f in fields(SyntheticSpec):
        value, default = getattr(spec, f.name), getattr(defaults, f.name)
        if not _type_ok(value, default):
            raise _bad(f.name, f"{value!r} is a {type(value).__name__}", f"give a value like the default, {default!r}")
    for name in ("nodes", "gpus_per_node", "nodes_per_rack", "jobs"):
        if getattr(spec, name) < 1:
            raise _bad(name, f"is {getattr(spec, name)}", "give 1 or more")
    for name in ("arrival_rate_per_hour", "duration_median_s"):
        value = getattr(spec, name)
        if not (math.isfinite(value) and value > 0):
            raise _bad(name, f"is {value}", "give a value > 0")
    if not (math.isfinite(spec.duration_sigma) and spec.duration_sigma >= 0):
        raise _bad("duration_sigma", f"is {spec.duration_sigma}", "give a log-normal sigma >= 0, e.g. 1.0")
    if not 0 <= spec.constrained_fraction <= 1:
        raise _bad("constrained_fraction", f"is {spec.constrained_fraction}", "give a fraction in [0, 1]")
    if spec.cpu_milli_per_gpu < 0 or spec.memory_per_gpu < 0:
        raise _bad("cpu_milli_per_gpu/memory_per_gpu", "is negative", "give 0 or more")
    if not spec.fractions_milli or any(not 1 <= f < 1000 for f in spec.fractions_milli):
        raise _bad("fractions_milli", f"is {spec.fractions_milli}", "give shares in 1..999 milli-GPU, e.g. (250, 500)")
    if not spec.gang_workers or any(not 2 <= w <= spec.nodes for w in spec.gang_workers):
        raise _bad("gang_workers", f"is {spec.gang_workers}", f"give worker counts in 2..{spec.nodes} (the node count)")
    models = _weights("model_mix", spec.model_mix)
    memory = {**GPU_MEMORY, **spec.gpu_memory}
    unknown = sorted(m for m in models if m not in memory)
    if unknown:
        raise _bad(
            "model_mix", f"no memory size known for {', '.join(unknown)}", "add it to gpu_memory (bytes per GPU)"
        )
    sizes = _weights("size_mix", spec.size_mix, SIZE_CLASSES)
    queues = _weights("queues", spec.queues)
    return models, sizes, queues, memory


def generate_synthetic(spec: SyntheticSpec | None = None, /, *, seed: int = 0, **overrides: Any) -> Workload:
    """A synthetic workload from `spec` (defaults: SyntheticSpec()) with any field overridden by keyword."""
    spec = spec or SyntheticSpec()
    if overrides:
        known = {f.name for f in fields(SyntheticSpec)}
        for name in overrides:
            if name not in known:
                raise _bad(name, "is not a parameter", f"use {', '.join(sorted(known))}")
        spec = replace(spec, **overrides)
    models, sizes, queue_weights, memory = _validate(spec)
    rng = np.random.default_rng(seed)

    node_counts = largest_remainder(spec.nodes, models)
    nodes: list[Node] = []
    for model in sorted(node_counts):
        for _ in range(node_counts[model]):
            i = len(nodes)
            nodes.append(
                make_node(
                    f"syn-{i:04d}",
                    model,
                    spec.gpus_per_node,
                    memory[model],
                    cpu_milli=spec.gpus_per_node * spec.cpu_milli_per_gpu + 8000,
                    memory=spec.gpus_per_node * spec.memory_per_gpu + 64 * GiB,
                    rack=f"rack-{i // spec.nodes_per_rack}",
                )
            )
    present = tuple(sorted(m for m, c in node_counts.items() if c > 0))
    smallest = min(memory[m] for m in present)

    gpu_shares = largest_remainder(spec.nodes * spec.gpus_per_node, queue_weights)
    queue_names = tuple(queue_weights)
    queues = tuple(
        QueueSpec(
            name,
            {GPU: Quota(nominal=gpu_shares[name] * 1000, borrowing_limit=None if spec.borrowing else 0)},
            cohort=spec.cohort,
        )
        for name in queue_names
    )

    n = spec.jobs
    arrivals = np.cumsum(rng.exponential(3600.0 / spec.arrival_rate_per_hour, size=n))
    classes = tuple(sizes)
    class_p = np.array([sizes[c] for c in classes]) / sum(sizes.values())
    class_idx = rng.choice(len(classes), size=n, p=class_p)
    queue_p = np.array([queue_weights[q] for q in queue_names]) / sum(queue_weights.values())
    queue_idx = rng.choice(len(queue_names), size=n, p=queue_p)
    durations = rng.lognormal(math.log(spec.duration_median_s), spec.duration_sigma, size=n)
    fraction_idx = rng.integers(0, len(spec.fractions_milli), size=n)
    gang_idx = rng.integers(0, len(spec.gang_workers), size=n)
    constrained = rng.random(n) < spec.constrained_fraction
    model_idx = rng.integers(0, len(present), size=n)

    jobs = []
    for i in range(n):
        size = classes[class_idx[i]]
        models_allowed = frozenset({present[model_idx[i]]}) if constrained[i] else frozenset()
        if size == "fractional":
            milli = spec.fractions_milli[fraction_idx[i]]
            workers = 1
            request = WorkerRequest(
                gpus=1,
                gpu_milli=milli,
                gpu_memory=smallest * milli // 1000 // GiB * GiB,
                cpu_milli=max(1000, spec.cpu_milli_per_gpu * milli // 1000),
                memory=spec.memory_per_gpu * milli // 1000,
                models=models_allowed,
            )
        else:
            if size == "gang":
                workers, per_worker = spec.gang_workers[gang_idx[i]], spec.gpus_per_node
            else:
                workers, per_worker = split_gang(int(size), spec.gpus_per_node)
            request = WorkerRequest(
                gpus=per_worker,
                cpu_milli=per_worker * spec.cpu_milli_per_gpu,
                memory=per_worker * spec.memory_per_gpu,
                models=models_allowed,
            )
        job = Job(
            id=f"syn-{i:05d}",
            queue=queue_names[queue_idx[i]],
            request=request,
            workers=workers,
            submit_seq=i,
            submitted_at=float(arrivals[i]),
        )
        jobs.append(TraceJob(job, float(durations[i])))

    mix = ", ".join(f"{k} {v:g}" for k, v in sizes.items())
    return Workload(
        name=f"synthetic-seed{seed}",
        citation=CITATION,
        license=LICENSE,
        nodes=tuple(nodes),
        queues=queues,
        jobs=tuple(jobs),
        assumptions=(
            f"Cluster: {spec.nodes} nodes x {spec.gpus_per_node} GPUs, models "
            + ", ".join(f"{m} x{node_counts[m]} nodes ({memory[m] // GiB} GiB)" for m in present)
            + f"; {spec.nodes_per_rack} nodes per rack.",
            f"Queues {', '.join(f'{q} {gpu_shares[q]} GPUs' for q in queue_names)} in cohort {spec.cohort}, "
            + ("borrowing allowed." if spec.borrowing else "no borrowing."),
            f"{n} jobs, Poisson arrivals at {spec.arrival_rate_per_hour:g}/h; sizes {mix}; "
            f"durations log-normal, median {spec.duration_median_s:g} s, sigma {spec.duration_sigma:g}; "
            f"{spec.constrained_fraction:.0%} pinned to one model; numpy default_rng({seed}).",
        ),
    )
