"""Invariants every cycle result must satisfy, computed independently of the core's own bookkeeping.

Each `check_*` raises AssertionError with a message naming the job, node or queue at fault. They are
used by the property suite on random inputs and by unit tests (`tests.kit.cycles.run`) on every case.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from gpufleet.domain import (
    MILLI_PER_GPU,
    ClusterSnapshot,
    Job,
    JobId,
    QueueSpec,
    Quota,
    RunningJob,
    WorkerPlacement,
    gpu_model_key,
)
from gpufleet.policies.preempt.las import LasPreemption
from gpufleet.scheduling.cycle import CycleResult
from gpufleet.scheduling.plugin_api import Profile
from gpufleet.scheduling.status import Code

Usage = dict[str, dict[str, int]]  # queue -> resource key -> amount (base units)


def _pending_by_id(pending: Iterable[Job]) -> dict[JobId, Job]:
    by_id: dict[JobId, Job] = {}
    for job in pending:
        by_id.setdefault(job.id, job)
    return by_id


def check_partition(pending: Sequence[Job], result: CycleResult) -> None:
    """Every pending job is either placed or waiting (with a reason), never both, never neither."""
    ids = {j.id for j in pending}
    placed = [p.job for p in result.placements]
    assert len(placed) == len(set(placed)), f"a job is placed twice: {sorted(placed)}"
    both = set(placed) & set(result.waiting)
    assert not both, f"placed and waiting at once: {sorted(both)}"
    assert set(placed) | set(result.waiting) == ids, (
        f"missing: {sorted(ids - set(placed) - set(result.waiting))}, "
        f"unknown: {sorted((set(placed) | set(result.waiting)) - ids)}"
    )
    for job_id, status in result.waiting.items():
        assert status.code is not Code.SUCCESS, f"{job_id} waits with SUCCESS"
        assert status.reasons, f"{job_id} waits without a reason ({status.code.value})"
        assert all(r for r in status.reasons), f"{job_id} has an empty reason"


def check_worker_shapes(pending: Sequence[Job], result: CycleResult) -> None:
    """Each placed worker holds exactly what its job asked for; a gang gets min..max workers."""
    jobs = _pending_by_id(pending)
    for placement in result.placements:
        job = jobs[placement.job]
        request = job.request
        n = len(placement.workers)
        assert job.gang_size <= n <= job.workers, f"{job.id}: {n} workers, asks {job.gang_size}..{job.workers}"
        for worker in placement.workers:
            assert worker.cpu_milli == request.cpu_milli, f"{job.id}: CPU {worker.cpu_milli}"
            assert worker.memory == request.memory, f"{job.id}: memory {worker.memory}"
            assert len(worker.gpus) == request.gpus, f"{job.id}: {len(worker.gpus)} GPUs, asks {request.gpus}"
            for share in worker.gpus:
                expected = request.gpu_milli if request.fractional else MILLI_PER_GPU
                assert share.milli == expected, f"{job.id}: share {share.milli} milli, asks {expected}"
                assert share.memory >= request.gpu_memory, f"{job.id}: GPU memory {share.memory}"


def _all_workers(snapshot: ClusterSnapshot, result: CycleResult) -> list[tuple[JobId, WorkerPlacement]]:
    held = [(r.id, w) for r in snapshot.running for w in r.workers]
    return held + [(p.job, w) for p in result.placements for w in p.workers]


def check_capacity(snapshot: ClusterSnapshot, result: CycleResult) -> None:
    """Running jobs plus placements: no GPU share given twice, no node over any capacity."""
    nodes = {n.name: n for n in snapshot.nodes}
    milli: dict[tuple[str, int], int] = defaultdict(int)
    gpu_mem: dict[tuple[str, int], int] = defaultdict(int)
    holders: dict[tuple[str, int], list[JobId]] = defaultdict(list)
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    for job_id, worker in _all_workers(snapshot, result):
        node = nodes.get(worker.node)
        assert node is not None, f"{job_id} runs on unknown node {worker.node}"
        indices = worker.gpu_indices
        assert len(set(indices)) == len(indices), f"{job_id} holds a GPU of {worker.node} twice: {indices}"
        for share in worker.gpus:
            assert 0 <= share.index < len(node.gpus), f"{job_id}: {worker.node} has no GPU {share.index}"
            assert 0 < share.milli <= MILLI_PER_GPU, f"{job_id}: share of {share.milli} milli"
            slot = (worker.node, share.index)
            milli[slot] += share.milli
            gpu_mem[slot] += share.memory
            holders[slot].append(job_id)
        cpu[worker.node] += worker.cpu_milli
        mem[worker.node] += worker.memory
    for (name, index), used in milli.items():
        assert used <= MILLI_PER_GPU, f"GPU {name}[{index}] given {used} milli to {holders[(name, index)]}"
        capacity = nodes[name].gpus[index].memory
        assert gpu_mem[(name, index)] <= capacity, f"GPU {name}[{index}] memory over: {holders[(name, index)]}"
    for name, used in cpu.items():
        assert used <= nodes[name].cpu_milli, f"node {name} CPU over: {used} > {nodes[name].cpu_milli}"
    for name, used in mem.items():
        assert used <= nodes[name].memory, f"node {name} memory over: {used} > {nodes[name].memory}"


def check_targets(snapshot: ClusterSnapshot, pending: Sequence[Job], result: CycleResult) -> None:
    """Placements go to schedulable nodes, on GPUs of a model the job allows."""
    nodes = {n.name: n for n in snapshot.nodes}
    jobs = _pending_by_id(pending)
    for placement in result.placements:
        job = jobs[placement.job]
        for worker in placement.workers:
            node = nodes[worker.node]
            assert node.schedulable, f"{job.id} placed on {node.name}, which is cordoned or unhealthy"
            for share in worker.gpus:
                model = node.gpus[share.index].model
                assert not job.request.models or model in job.request.models, (
                    f"{job.id} placed on a {model}, allows {sorted(job.request.models)}"
                )
                assert node.gpus[share.index].memory >= job.request.gpu_memory, (
                    f"{job.id} placed on a GPU with too little memory"
                )


# ---- quotas ---------------------------------------------------------------------------------------


def usage_by_queue(snapshot: ClusterSnapshot, workers: Iterable[tuple[str, WorkerPlacement]]) -> Usage:
    """Quota usage (keys gpu, gpu:<MODEL>, cpu, memory) per queue of `(queue, worker)` pairs."""
    models = {n.name: tuple(g.model for g in n.gpus) for n in snapshot.nodes}
    usage: Usage = defaultdict(lambda: defaultdict(int))
    for queue_name, worker in workers:
        row = usage[queue_name]
        for share in worker.gpus:
            row["gpu"] += share.milli
            row[gpu_model_key(models[worker.node][share.index])] += share.milli
        row["cpu"] += worker.cpu_milli
        row["memory"] += worker.memory
    return usage


def running_usage(snapshot: ClusterSnapshot) -> Usage:
    return usage_by_queue(snapshot, ((r.job.queue, w) for r in snapshot.running for w in r.workers))


def usage_after(snapshot: ClusterSnapshot, pending: Sequence[Job], result: CycleResult) -> Usage:
    jobs = _pending_by_id(pending)
    pairs = [(r.job.queue, w) for r in snapshot.running for w in r.workers]
    pairs += [(jobs[p.job].queue, w) for p in result.placements for w in p.workers]
    return usage_by_queue(snapshot, pairs)


def quota_of(spec: QueueSpec, key: str) -> Quota | None:
    """The quota that binds `key` (a queue naming per-model GPU quotas may use only those models)."""
    quota = spec.quotas.get(key)
    if quota is None and key.startswith("gpu:") and any(k.startswith("gpu:") for k in spec.quotas):
        return Quota(nominal=0, borrowing_limit=0)
    return quota


def _guaranteed(quota: Quota) -> int:
    if quota.nominal is None or quota.lending_limit is None:
        return 0
    return max(0, quota.nominal - quota.lending_limit)


def _lendable(quota: Quota) -> int:
    return 0 if quota.nominal is None else quota.nominal - _guaranteed(quota)


def pool_capacity(queues: Mapping[str, QueueSpec], cohort: str, key: str) -> int:
    total = 0
    for spec in queues.values():
        if spec.cohort == cohort and (quota := quota_of(spec, key)) is not None:
            total += _lendable(quota)
    return total


def queue_limit(queues: Mapping[str, QueueSpec], spec: QueueSpec, key: str) -> int | None:
    """The most `spec` may use of `key`: nominal alone, + borrowing limit, or + its cohort's pool."""
    quota = quota_of(spec, key)
    if quota is None or quota.nominal is None:
        return None
    if spec.cohort is None:
        return quota.nominal
    if quota.borrowing_limit is not None:
        return quota.nominal + quota.borrowing_limit
    return _guaranteed(quota) + pool_capacity(queues, spec.cohort, key)


def pool_drawn(queues: Mapping[str, QueueSpec], usage: Usage, cohort: str, key: str) -> int:
    """What the cohort's members use above their guaranteed (never lent) part."""
    drawn = 0
    for spec in queues.values():
        if spec.cohort != cohort:
            continue
        quota = quota_of(spec, key)
        if quota is None or quota.nominal is None:
            continue
        drawn += max(0, usage.get(spec.name, {}).get(key, 0) - _guaranteed(quota))
    return drawn


def quota_violations(snapshot: ClusterSnapshot, usage: Usage) -> dict[str, int]:
    """Every limit exceeded in `usage`, keyed `queue <q> <key>` / `cohort <c> <key>`, with the excess."""
    queues = {q.name: q for q in snapshot.queues}
    keys = {k for row in usage.values() for k in row} | {k for q in queues.values() for k in q.quotas}
    over: dict[str, int] = {}
    for spec in queues.values():
        for key in sorted(keys):
            limit = queue_limit(queues, spec, key)
            used = usage.get(spec.name, {}).get(key, 0)
            if limit is not None and used > limit:
                over[f"queue {spec.name} {key}"] = used - limit
    for cohort in sorted({q.cohort for q in queues.values() if q.cohort is not None}):
        for key in sorted(keys):
            drawn = pool_drawn(queues, usage, cohort, key)
            capacity = pool_capacity(queues, cohort, key)
            if drawn > capacity:
                over[f"cohort {cohort} {key}"] = drawn - capacity
    return over


def check_quotas(snapshot: ClusterSnapshot, pending: Sequence[Job], result: CycleResult) -> None:
    """Placements never take a queue above nominal + borrowing, nor overdraw its cohort's pool.

    A limit the running jobs already exceed (e.g. quota lowered since) must at least not get worse.
    """
    before = quota_violations(snapshot, running_usage(snapshot))
    after = quota_violations(snapshot, usage_after(snapshot, pending, result))
    for where, excess in after.items():
        assert excess <= before.get(where, 0), f"{where} over its limit by {excess} after placements"


def over_nominal(spec: QueueSpec, usage: Usage) -> bool:
    row = usage.get(spec.name, {})
    for key, used in row.items():
        quota = quota_of(spec, key)
        if quota is not None and quota.nominal is not None and used > quota.nominal:
            return True
    return False


# ---- preemption -----------------------------------------------------------------------------------


def _las_victim(victim: RunningJob, job: Job, now: float, las: LasPreemption) -> bool:
    """Whether LAS preemption may stop `victim` for `job`: same queue, priority at most the job's, a higher
    band of GPU time attained (its current run included), and running at least the plugin's minimum."""
    ran = now - victim.started_at
    attained = victim.job.attained_gpu_seconds + victim.job.gpu_milli_total / MILLI_PER_GPU * max(0.0, ran)
    return (
        victim.job.queue == job.queue
        and victim.job.priority <= job.priority
        and ran >= las.min_run_s
        and las.bands.band_of(attained) > las.bands.band_of(job.attained_gpu_seconds)
    )


def check_victims(
    snapshot: ClusterSnapshot, pending: Sequence[Job], result: CycleResult, profile: Profile | None = None
) -> None:
    """Victims: running, preemptible, not already stopping, preempted once, and either of lower
    priority than the preemptor or in another queue of its cohort that borrows (reclaim); with LAS
    preemption in `profile`, also a job of its queue with more GPU time by the plugin's bands."""
    running = {r.id: r for r in snapshot.running}
    jobs = _pending_by_id(pending)
    queues = {q.name: q for q in snapshot.queues}
    usage = usage_after(snapshot, pending, result)
    placed = {p.job for p in result.placements}
    seen: set[JobId] = set()
    outstanding = {r.evicting_for for r in snapshot.running if r.evicting_for is not None}
    for p in result.preemptions:
        assert p.victim not in seen, f"{p.victim} preempted twice"
        seen.add(p.victim)
        assert p.victim in running, f"victim {p.victim} is not running"
        assert p.reason, f"preemption of {p.victim} has no reason"
        victim = running[p.victim]
        assert victim.job.preemptible, f"{p.victim} is not preemptible"
        assert not victim.evicting, f"{p.victim} is already evicting"
        assert p.for_job in jobs, f"preempted for {p.for_job}, which is not pending"
        assert p.for_job not in placed, f"{p.for_job} placed and preempting at once"
        assert result.waiting[p.for_job].code is Code.WAIT, f"{p.for_job} preempts but is not WAIT"
        assert p.for_job not in outstanding, f"{p.for_job} preempts more while its victims still stop"
        job = jobs[p.for_job]
        lower = victim.job.priority < job.priority
        job_spec = queues.get(job.queue)
        victim_spec = queues.get(victim.job.queue)
        reclaim = (
            victim.job.queue != job.queue
            and job_spec is not None
            and victim_spec is not None
            and job_spec.cohort is not None
            and job_spec.cohort == victim_spec.cohort
            and over_nominal(victim_spec, usage)
        )
        las = profile.preempt if profile is not None and isinstance(profile.preempt, LasPreemption) else None
        served = las is not None and _las_victim(victim, job, snapshot.now, las)
        # A queue that spent its budget (action deprioritise) yields to every other queue, and takes from none.
        spent = victim_spec is not None and victim_spec.deprioritised and victim.job.queue != job.queue
        assert job_spec is None or not job_spec.deprioritised, f"{job.id} preempts though its budget is spent"
        assert lower or reclaim or served or spent, (
            f"{p.victim} (priority {victim.job.priority}, queue {victim.job.queue}) preempted for "
            f"{job.id} (priority {job.priority}, queue {job.queue}): neither lower priority nor reclaim"
            + (" nor more attained service" if las is not None else "")
        )


def check_spot(snapshot: ClusterSnapshot, pending: Sequence[Job], result: CycleResult) -> None:
    """Spot nodes take only jobs that allow spot; a node an open breaker gates takes only what it admits; the
    probe-gated nodes of a half-open pool (zone) take one job in all per cycle."""
    nodes = {n.name: n for n in snapshot.nodes}
    jobs = _pending_by_id(pending)
    probes: dict[str, set[str]] = {}
    for p in result.placements:
        for worker in p.workers:
            if nodes[worker.node].admits == "probe":
                probes.setdefault(nodes[worker.node].zone, set()).add(p.job)
    assert all(len(placed) == 1 for placed in probes.values()), f"half-open pools took more than one job: {probes}"
    for p in result.placements:
        request = jobs[p.job].request
        for worker in p.workers:
            node = nodes[worker.node]
            assert node.pool != "spot" or request.spot != "never", f"{p.job} (spot: never) placed on spot {node.name}"
            assert node.admits != "none", f"{p.job} placed on {node.name}, whose spot breaker admits none"
            assert node.admits != "checkpointing" or request.checkpoints, (
                f"{p.job} does not checkpoint but was placed on {node.name}, whose breaker admits only those"
            )


def check_migrations(snapshot: ClusterSnapshot, result: CycleResult) -> None:
    """Moved jobs: running, preemptible, not stopping already, moved once, neither a victim nor placed."""
    running = {r.id: r for r in snapshot.running}
    victims = {p.victim for p in result.preemptions}
    placed = {p.job for p in result.placements}
    seen: set[JobId] = set()
    for m in result.migrations:
        assert m.job not in seen, f"{m.job} moved twice"
        seen.add(m.job)
        assert m.job in running, f"moved job {m.job} is not running"
        assert m.reason, f"move of {m.job} has no reason"
        assert not running[m.job].evicting, f"{m.job} is already evicting"
        assert m.job not in victims, f"{m.job} moved and preempted at once"
        assert m.job not in placed, f"{m.job} moved and placed at once"


def check_all(
    snapshot: ClusterSnapshot, pending: Sequence[Job], result: CycleResult, profile: Profile | None = None
) -> None:
    """Every invariant; `profile` (the one that decided) widens who may be a victim where it preempts by LAS."""
    check_partition(pending, result)
    check_worker_shapes(pending, result)
    check_capacity(snapshot, result)
    check_targets(snapshot, pending, result)
    check_quotas(snapshot, pending, result)
    check_victims(snapshot, pending, result, profile)
    check_migrations(snapshot, result)
    check_spot(snapshot, pending, result)
