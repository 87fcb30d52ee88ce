"""Dependencies and array throttles through the one control loop (in-memory store, scripted backend), over
random DAGs of jobs with random outcomes: no job starts before its parents are where its dependency needs
them (afterok: succeeded; afternotok: failed or cancelled; afterany: ended; after: started), an array never
runs more tasks than its throttle, a dependency that can never be met ends its job cancelled with
`DependencyNeverSatisfied`, and every other job runs to its own end."""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.adapters.storage.memory import InMemoryStore
from gpufleet.control.gate import NEVER_CODE
from gpufleet.control.reconciler import Reconciler
from gpufleet.domain import GiB, JobState, make_node
from gpufleet.domain.dependencies import ArrayTask, Dependency, DepKind, Verdict, judge
from gpufleet.domain.jobs import Job
from gpufleet.policies.catalog import profile
from tests.kit import make_job
from tests.kit.fake_backend import ManualClock, ScriptedBackend

S = JobState
KINDS = (DepKind.AFTER, DepKind.AFTEROK, DepKind.AFTERNOTOK, DepKind.AFTERANY)


@dataclasses.dataclass(frozen=True)
class Plan:
    jobs: tuple[Job, ...]
    exit_codes: dict[str, int]
    durations: dict[str, int]
    gpus: int


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    jobs: list[Job] = []
    codes: dict[str, int] = {}
    durations: dict[str, int] = {}
    for i in range(draw(st.integers(1, 8))):
        earlier = [j.id for j in jobs]
        deps: list[Dependency] = []
        if earlier:
            for parent in draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True)):
                deps.append(Dependency(draw(st.sampled_from(KINDS)), parent))
        tasks = draw(st.sampled_from((1, 1, 1, 3, 5)))
        throttle = draw(st.one_of(st.none(), st.integers(1, 3))) if tasks > 1 else None
        for t in range(tasks):
            job_id = f"a{i}_{t}" if tasks > 1 else f"j{i}"
            array = ArrayTask(f"a{i}", t, throttle) if tasks > 1 else None
            job = dataclasses.replace(make_job(job_id).build(), depends_on=tuple(deps), array=array)
            jobs.append(job)
            codes[job_id] = draw(st.sampled_from((0, 0, 1)))
            durations[job_id] = draw(st.integers(1, 4))
    return Plan(tuple(jobs), codes, durations, draw(st.integers(1, 8)))


def expected(plan: Plan) -> dict[str, JobState]:
    """Each job's end, worked out from the DAG alone."""
    ends: dict[str, JobState] = {}
    for job in plan.jobs:
        never = any(
            judge(d.kind, ends[d.job_id], ends[d.job_id] is not S.CANCELLED) is Verdict.NEVER for d in job.depends_on
        )
        if never:
            ends[job.id] = S.CANCELLED
        else:
            ends[job.id] = S.SUCCEEDED if plan.exit_codes[job.id] == 0 else S.FAILED
    return ends


def _parent_allows(kind: DepKind, parent: JobState, parent_started: bool) -> bool:
    return judge(kind, parent, parent_started) is Verdict.MET


@settings(max_examples=150, deadline=None)
@given(plans())
def test_dependencies_and_throttles_hold_through_the_loop(plan: Plan) -> None:
    store = InMemoryStore([make_node("n0", "A100-80GB", plan.gpus, 80 * GiB)])
    backend = ScriptedBackend()
    clock = ManualClock()
    loop = Reconciler(store, backend, clock, profile("default"))
    for job in plan.jobs:
        store.submit(job, at=0.0)
    ends_at: dict[str, float] = {}
    started: set[str] = set()
    seen_launches = 0
    throttle_of = {j.array.array_id: j.array.throttle for j in plan.jobs if j.array is not None}
    for tick in range(400):
        clock.t = float(tick)
        loop.step()
        # Every launch the loop asked for in this step: its parents were where its dependencies needed them.
        for launch in backend.launches[seen_launches:]:
            for dep in launch.job.depends_on:
                parent = store.get(dep.job_id)
                assert parent is not None
                ran = parent.first_started_at is not None
                assert _parent_allows(dep.kind, parent.state, ran), (
                    f"{launch.job.id} launched with {dep} while {dep.job_id} is {parent.state.value}"
                )
            if launch.attempt == 1:
                backend.started(launch.job.id, clock.t)
                ends_at[launch.job.id] = clock.t + plan.durations[launch.job.id]
        seen_launches = len(backend.launches)
        running = Counter(r.job.array.array_id for r in store.active() if r.holds_resources and r.job.array is not None)
        for array_id, count in running.items():
            limit = throttle_of[array_id]
            assert limit is None or count <= limit, f"array {array_id} runs {count} tasks, throttle {limit}"
        for job_id, at in sorted(ends_at.items()):
            if at <= clock.t and job_id not in started:
                started.add(job_id)
                backend.exited(job_id, clock.t, code=plan.exit_codes[job_id])
        if not store.active():
            break
    want = expected(plan)
    got = {job.id: store.get(job.id).state for job in plan.jobs}  # type: ignore[union-attr]
    assert got == want
    for job in plan.jobs:
        record = store.get(job.id)
        assert record is not None
        if record.state is S.CANCELLED:
            assert record.reason.startswith(NEVER_CODE), record.reason
            assert record.first_started_at is None


def test_a_job_waiting_on_its_parent_is_never_shown_to_the_scheduler() -> None:
    """The parent holds every GPU; the child waits in the gate, not in the scheduler's pending set."""
    store = InMemoryStore([make_node("n0", "A100-80GB", 2, 80 * GiB)])
    backend = ScriptedBackend()
    clock = ManualClock()
    loop = Reconciler(store, backend, clock, profile("default"))
    store.submit(make_job("p").gpus(2).build(), at=0.0)
    child = dataclasses.replace(make_job("c").gpus(2).build(), depends_on=(Dependency(DepKind.AFTEROK, "p"),))
    store.submit(child, at=0.0)
    loop.step()
    assert "c" not in loop.pending
    assert "c" in loop.gate
    backend.started("p", 1.0)
    clock.t = 2.0
    loop.step()
    backend.exited("p", 3.0, code=0)
    clock.t = 3.0
    loop.step()
    assert [launch.job.id for launch in backend.launches] == ["p", "c"]


def test_singletons_of_one_name_and_submitter_run_one_at_a_time() -> None:
    store = InMemoryStore([make_node("n0", "A100-80GB", 8, 80 * GiB)])
    backend = ScriptedBackend()
    clock = ManualClock()
    loop = Reconciler(store, backend, clock, profile("default"))
    single = (Dependency(DepKind.SINGLETON),)
    for job_id, user in (("s1", "ann"), ("s2", "ann"), ("s3", "ann"), ("other", "bob")):
        job = dataclasses.replace(make_job(job_id).build(), name="nightly", user=user, depends_on=single)
        store.submit(job, at=0.0)
    loop.step()
    assert sorted(launch.job.id for launch in backend.launches) == ["other", "s1"]  # bob's is his own
    for step, (done, then) in enumerate((("s1", "s2"), ("s2", "s3"))):
        clock.t = 10.0 * (step + 1)
        backend.started(done, clock.t - 5)
        loop.step()
        assert backend.launches[-1].job.id != then  # still running: the next one waits
        backend.exited(done, clock.t, code=1)  # any end lets the next one go
        loop.step()
        assert backend.launches[-1].job.id == then


def test_a_restarted_loop_keeps_the_throttle_and_the_waiting_dependencies() -> None:
    store = InMemoryStore([make_node("n0", "A100-80GB", 8, 80 * GiB)])
    backend = ScriptedBackend()
    clock = ManualClock()
    loop = Reconciler(store, backend, clock, profile("default"))
    for task in range(5):
        job = dataclasses.replace(make_job(f"a_{task}").build(), array=ArrayTask("a", task, 2))
        store.submit(job, at=0.0)
    child = dataclasses.replace(make_job("c").build(), depends_on=(Dependency(DepKind.AFTEROK, "a_0"),))
    store.submit(child, at=0.0)
    loop.step()
    assert sorted(launch.job.id for launch in backend.launches) == ["a_0", "a_1"]
    for launch in backend.launches:
        backend.started(launch.job.id, 1.0)
    clock.t = 2.0
    loop.step()
    restarted = Reconciler(store, backend, clock, profile("default"))
    clock.t = 3.0
    restarted.step()
    assert len(backend.launches) == 2  # two tasks still run: the throttle holds; c still waits for a_0
    backend.exited("a_0", 4.0, code=0)
    clock.t = 4.0
    restarted.step()
    assert sorted(launch.job.id for launch in backend.launches[2:]) == ["a_2", "c"]
