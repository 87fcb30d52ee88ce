"""The control loop's resizes, for any mix of elastic and fixed jobs, quotas and arrivals, run in the simulator
through the one loop: after every step no GPU is held twice (a shrinking job's old GPUs count until RESIZED),
no queue holds more GPUs than its quota, elastic jobs stay within [min, max] workers, fixed-size jobs keep
their size, the loop's working state equals one built from the store, and every job ends."""

from __future__ import annotations

from collections import Counter

from hypothesis import event, given, settings
from hypothesis import strategies as st

from gpufleet.control.reconciler import Reconciler
from gpufleet.domain import GiB, Job, QueueSpec, Quota, make_node
from gpufleet.domain.quotas import GPU
from gpufleet.domain.resources import WorkerRequest
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.state import CycleState
from gpufleet.sim.engine import Simulation
from gpufleet.sim.workload import TraceJob, Workload
from tests.kit import fingerprint
from tests.kit.fake_backend import ScriptedBackend

QUEUES = ("a", "b")


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    nodes = tuple(make_node(f"n{i}", "A100-80GB", 4, 80 * GiB) for i in range(draw(st.integers(1, 3))))
    quotas = {q: draw(st.one_of(st.none(), st.integers(2, 8))) for q in QUEUES}
    queues = tuple(
        QueueSpec(q, quotas={GPU: Quota(nominal=n * 1000)} if n is not None else {}) for q, n in quotas.items()
    )
    jobs = []
    for i in range(draw(st.integers(2, 9))):
        per_worker = draw(st.sampled_from((1, 1, 2)))
        workers = draw(st.integers(1, 6))
        elastic = workers > 1 and draw(st.integers(0, 3)) > 0
        job = Job(
            id=f"j{i}",
            queue=draw(st.sampled_from(QUEUES)),
            request=WorkerRequest(gpus=per_worker),
            workers=workers,
            min_workers=draw(st.integers(1, workers - 1)) if elastic else None,
            submit_seq=i,
            submitted_at=float(draw(st.integers(0, 900))),
        )
        jobs.append(TraceJob(job, float(draw(st.integers(200, 3000)))))
    jobs.sort(key=lambda tj: (tj.job.submitted_at, tj.job.submit_seq))
    return Workload("resize-property", "generated", "none", nodes, queues, tuple(jobs))


@settings(max_examples=100, deadline=None)
@given(workload=workloads())
def test_resizes_never_give_a_gpu_twice_nor_pass_a_quota(workload: Workload) -> None:
    limits = {q.name: q.quotas[GPU].nominal // 1000 for q in workload.queues if GPU in q.quotas}
    jobs = {tj.job.id: tj.job for tj in workload.jobs}
    checked = [0]
    gathered = [0]
    sizes: dict[str, int] = {}

    def check(now: float, loop: Reconciler) -> None:
        held: Counter[tuple[str, int]] = Counter()
        per_queue: Counter[str] = Counter()
        for record in loop.store.active():
            if not record.holds_resources:
                continue
            job = jobs[record.id]
            for worker in record.workers:
                for share in worker.gpus:
                    held[(worker.node, share.index)] += share.milli
            per_queue[job.queue] += sum(s.milli for w in record.workers for s in w.gpus) // 1000
            assert set(record.resize_to) <= set(record.workers)  # a shrink keeps some of the workers it holds
            size = len(record.resize_to or record.workers)  # a re-placed grow also holds its old workers
            if record.resize_to and size > sizes.get(record.id, size):
                gathered[0] += 1
            if not record.resizing:
                sizes[record.id] = size
            if job.min_workers is not None and job.min_workers < job.workers:
                assert job.min_workers <= size <= job.workers
            else:
                assert len(record.workers) == job.workers or not record.workers
        assert all(milli <= 1000 for milli in held.values())  # no GPU given twice
        for queue, most in limits.items():
            assert per_queue[queue] <= most  # quota held across resizes
        if checked[0] % 7 == 0:  # the kept working state is the store's (a rebuild costs: now and then)
            fresh = Reconciler(loop.store, ScriptedBackend(), loop.clock, loop.profile).base
            assert same_state(loop.base.state, fresh.state)
        checked[0] += 1

    run = Simulation(workload, profile("default"), observer=check).run()
    event(f"resizes: {'some' if run.stats.resizes else 'none'}")
    event(f"grows re-placed onto fewer nodes: {'some' if gathered[0] else 'none'}")
    room = {q.name: limits.get(q.name, 1 << 30) for q in workload.queues}
    cluster = sum(len(node.gpus) for node in workload.nodes)
    for record in run.store.all():  # every job that can ever fit ends
        job = record.job
        if job.gang_size * job.request.gpus <= min(room[job.queue], cluster):
            assert record.state.terminal, record


def same_state(kept: CycleState, fresh: CycleState) -> bool:
    """Equal free resources, quota usage (queues using nothing left out) and removed jobs."""
    ours, theirs = fingerprint(kept), fingerprint(fresh)
    return ours[:4] == theirs[:4] and _usage(kept) == _usage(fresh) and ours[5:] == theirs[5:]


def _usage(state: CycleState) -> list[tuple[str, list[tuple[str, int]]]]:
    rows = ((q, sorted((k, v) for k, v in u.items() if v)) for q, u in state.ledger.usage.items())
    return sorted((q, row) for q, row in rows if row)
