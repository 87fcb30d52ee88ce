"""A reserved start for a job that waited too long (EASY backfill): the core holds its room from jobs that would
delay it, lets shorter jobs use the room until then, and says so in the job's status."""

from __future__ import annotations

import dataclasses

from gpufleet.domain import Job, Node, RunningJob
from gpufleet.domain.jobs import RunSpec
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.cycle import CycleResult, run_cycle
from gpufleet.scheduling.plugin_api import Profile
from gpufleet.scheduling.status import Code
from tests.kit import cluster, make_job, running_on

NOW = 1_000.0
FLEET = cluster().nodes(1, "A100-80GB", gpus=8).nodes(1, "A100-80GB", gpus=4, prefix="small")
BIG, SMALL = FLEET.build()


def reserving(name: str = "fifo-backfill", after: float | None = 600.0) -> Profile:
    return dataclasses.replace(profile(name), reserve_after_s=after)


def busy(ends: list[float | None], node: Node = BIG) -> list[RunningJob]:
    """One 1-GPU job per GPU index, running on `node` since t=0 with a limit that ends it at each of `ends`."""
    running = []
    for index, end in enumerate(ends):
        job = make_job(f"run-{node.name}-{index}").gpus(1).duration(end).build()
        running.append(running_on(job, [(node, [index])], started_at=0.0))
    return running


def gang(submitted: float = 0.0) -> Job:
    return make_job("gang").gpus(8).submitted(submitted).seq(0).build()


def small(job_id: str, seconds: float | None, seq: int) -> Job:
    return make_job(job_id).gpus(1).duration(seconds).submitted(NOW - 1).seq(seq).build()


def cycle(pending: list[Job], prof: Profile, running: list[RunningJob] | None = None) -> CycleResult:
    snapshot = FLEET.snapshot(running if running is not None else busy([1_100.0, 1_200.0, 1_300.0, 1_400.0]), now=NOW)
    return run_cycle(snapshot, pending, prof)


def placed(result: CycleResult) -> set[str]:
    return {p.job for p in result.placements}


def test_without_a_reservation_small_jobs_take_the_gpus_the_gang_waits_for() -> None:
    pending = [gang(), *(small(f"s{i}", 10_000.0, i + 1) for i in range(8))]
    result = cycle(pending, reserving(after=None))
    assert "gang" not in placed(result)
    # The 4 free GPUs of the big node and the 4 of the small one: the gang's node fills up again.
    assert len(placed(result)) == 8
    assert result.reserved_starts == ()


def test_a_job_past_the_threshold_gets_a_start_and_longer_jobs_keep_off_its_room() -> None:
    pending = [gang(), *(small(f"s{i}", 10_000.0, i + 1) for i in range(8))]
    result = cycle(pending, reserving())
    (reservation,) = result.reserved_starts
    assert reservation.job == "gang"
    assert reservation.start_by == 1_400.0  # when the last of the 4 running jobs on its node ends by its limit
    assert reservation.nodes == (BIG.name,)
    assert reservation.waits_for == tuple(sorted(f"run-{BIG.name}-{i}" for i in range(4)))
    # Long jobs go to the other node only.
    started = {p.job: {w.node for w in p.workers} for p in result.placements}
    assert len(started) == 4
    assert all(nodes == {SMALL.name} for nodes in started.values())
    status = result.waiting["gang"]
    assert status.code is Code.UNSCHEDULABLE
    assert f"reserved: starts by t=1400 on {BIG.name}" in status.message()


def test_jobs_that_end_before_the_reserved_start_use_its_room_meanwhile() -> None:
    # 300 s from now ends at 1,300, before the reserved 1,400; 500 s does not.
    pending = [gang(), *(small(f"short{i}", 300.0, i + 1) for i in range(6)), small("long", 500.0, 7)]
    result = cycle(pending, reserving(), running=busy([1_100.0, 1_200.0, 1_300.0, 1_400.0]) + busy([None] * 4, SMALL))
    assert result.reserved_starts[0].start_by == 1_400.0
    assert placed(result) == {f"short{i}" for i in range(4)}  # the 4 free GPUs, all in the reserved room
    assert "long" not in placed(result)


def test_a_job_waiting_less_than_the_threshold_gets_no_reservation() -> None:
    pending = [gang(submitted=NOW - 100), small("s", 10_000.0, 1)]
    result = cycle(pending, reserving(after=600.0))
    assert result.reserved_starts == ()
    assert "s" in placed(result)


def test_running_jobs_without_a_limit_drain_the_room_for_the_waiting_job() -> None:
    pending = [gang(), small("short", 10.0, 1), small("unlimited", None, 2)]
    running = busy([None, None, 1_200.0, None]) + busy([None] * 4, SMALL)
    result = cycle(pending, reserving(), running=running)
    (reservation,) = result.reserved_starts
    assert reservation.start_by is None
    assert placed(result) == set()  # not even a 10 s job: the room's start is unknown
    assert "drained for it" in result.waiting["gang"].message()


def test_a_run_time_limit_counts_before_a_declared_duration() -> None:
    limited = dataclasses.replace(small("limited", 100_000.0, 1), run=RunSpec(("/bin/true",), max_runtime_s=60.0))
    result = cycle(
        [gang(), limited], reserving(), running=busy([1_100.0, 1_200.0, 1_300.0, 1_400.0]) + busy([None] * 4, SMALL)
    )
    assert placed(result) == {"limited"}


def test_age_does_not_overtake_priority_in_a_queue() -> None:
    # The old gang is behind a newer job of higher priority: no reservation for it; the urgent one goes.
    urgent = make_job("urgent").gpus(1).priority(5).submitted(NOW - 1).seq(1).build()
    result = cycle([gang(), urgent], reserving("priority"))
    assert result.reserved_starts == ()
    assert "urgent" in placed(result)


def test_the_result_with_a_reservation_is_deterministic() -> None:
    pending = [gang(), *(small(f"s{i}", 300.0 * (i + 1), i + 1) for i in range(6))]
    first = cycle(pending, reserving()).to_json()
    assert first == cycle(list(reversed(pending)), reserving()).to_json()
    assert '"reserved_starts"' in first


def test_a_job_waiting_for_its_own_queues_quota_holds_no_room() -> None:
    # Team a may use 4 GPUs and uses them; its old gang waits for its quota, not for room: team b's jobs go on.
    from tests.kit import queue

    team_a = [make_job(f"a{i}").gpus(1).queue("a").duration(5_000.0).build() for i in range(4)]
    running = [running_on(job, [(BIG, [i])]) for i, job in enumerate(team_a)]
    old = make_job("a-gang").gpus(4).queue("a").submitted(0.0).build()
    b_jobs = [
        make_job(f"b{i}").gpus(1).queue("b").duration(10_000.0).submitted(NOW - 1).seq(i + 1).build() for i in range(8)
    ]
    snapshot = FLEET.snapshot(running, [queue("a").gpus(4), queue("b").gpus(12)], now=NOW)
    result = run_cycle(snapshot, [old, *b_jobs], reserving())
    assert result.reserved_starts == ()
    assert placed(result) == {f"b{i}" for i in range(8)}  # every free GPU, the gang's node's too
