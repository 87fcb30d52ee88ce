"""A gang's victim search asks admission alone when it puts back a victim that runs only where no worker of
the gang fits (`_Search.placement_unchanged_by`): it must choose exactly the victims the full fit test
chooses. The worlds are the case the shortcut is for: nodes filled by many small low-priority jobs, and
high-priority gangs of large whole-GPU workers that need several nodes emptied."""

from __future__ import annotations

import dataclasses
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import ClusterSnapshot, GiB, Job, QueueSpec, Quota, RunningJob, WorkerRequest, make_node
from gpufleet.domain.comm import CommNeeds
from gpufleet.policies.catalog import profile
from gpufleet.policies.preempt import priority as priority_preemption
from gpufleet.scheduling import cycle as cycle_module
from gpufleet.scheduling.cycle import run_cycle
from tests.kit import GPU_MEMORY_GIB

PREEMPTING = ("default", "priority", "tiresias", "las", "fair-binpack")
NOW = 1000.0


@st.composite
def packed_worlds(draw: st.DrawFn) -> tuple[ClusterSnapshot, tuple[Job, ...], str]:
    model = draw(st.sampled_from(("A100-80GB", "H100", "T4")))
    gpus = draw(st.sampled_from((4, 8)))
    nodes = tuple(
        make_node(
            f"n{i:02d}",
            draw(st.sampled_from((model, model, "L4"))),
            gpus,
            GPU_MEMORY_GIB[model] * GiB,
            cpu_milli=draw(st.sampled_from((32_000, 96_000))),
            nvlink_groups=draw(st.sampled_from((1, 2))),
            rack=draw(st.sampled_from(("r0", "r1"))),
        )
        for i in range(draw(st.integers(2, 6)))
    )
    # Spot nodes: counted by the gang check, refused by the spot filter to jobs that never use spot.
    nodes = tuple(
        dataclasses.replace(n, pool="spot", admits="all") if draw(st.integers(0, 3)) == 0 else n for n in nodes
    )
    queues: tuple[QueueSpec, ...] = ()
    if draw(st.booleans()):
        cap = draw(st.sampled_from((8_000, 16_000, 48_000)))
        queues = tuple(
            QueueSpec(name, {"gpu": Quota(nominal=cap, borrowing_limit=draw(st.sampled_from((0, cap))))}, "all")
            for name in ("team-a", "team-b")
        )
    small = [
        Job(
            f"r{i:02d}",
            draw(st.sampled_from(("team-a", "team-b"))),
            WorkerRequest(
                gpus=1,
                gpu_milli=draw(st.sampled_from((1000, 1000, 500, 250))),
                cpu_milli=draw(st.sampled_from((0, 1_000, 8_000))),
            ),
            priority=draw(st.integers(0, 1)),
            preemptible=draw(st.sampled_from((True, True, True, False))),
            submit_seq=i,
        )
        for i in range(draw(st.integers(4, 4 * len(nodes) * gpus // 2)))
    ]
    warm = run_cycle(ClusterSnapshot(nodes, (), queues), small, profile(draw(st.sampled_from(("spread", "random")))))
    by_id = {j.id: j for j in small}
    running = tuple(
        RunningJob(by_id[p.job], p.workers, started_at=float(draw(st.integers(0, 900)))) for p in warm.placements
    )
    gangs = tuple(
        Job(
            f"p{i:02d}",
            draw(st.sampled_from(("team-a", "team-b"))),
            draw(
                st.sampled_from(
                    (
                        WorkerRequest(gpus=gpus, cpu_milli=4_000),
                        WorkerRequest(gpus=gpus),
                        WorkerRequest(gpus=gpus // 2),
                        WorkerRequest(gpus=1),
                        WorkerRequest(gpus=gpus // 2, spot="allowed"),
                    )
                )
            ),
            workers=draw(st.integers(2, max(2, len(nodes) - 1))),
            priority=draw(st.integers(2, 3)),
            submit_seq=100 + i,
            comm=CommNeeds(4 * GiB, 0.5, max_overhead=0.05) if draw(st.integers(0, 4)) == 0 else None,
        )
        for i in range(draw(st.integers(1, 3)))
    )
    return ClusterSnapshot(nodes, running, queues, now=NOW), gangs, draw(st.sampled_from(PREEMPTING))


@given(packed_worlds())
def test_a_gang_reprieve_asking_admission_alone_keeps_the_same_victims(
    world: tuple[ClusterSnapshot, tuple[Job, ...], str],
) -> None:
    snapshot, pending, name = world
    shortcut = run_cycle(snapshot, pending, profile(name)).to_json()
    with patch.object(priority_preemption._Search, "placement_unchanged_by", lambda self, job_id: False):
        full = run_cycle(snapshot, pending, profile(name)).to_json()
    assert shortcut == full


@given(packed_worlds())
def test_victims_taken_and_put_back_in_runs_are_those_taken_one_by_one(
    world: tuple[ClusterSnapshot, tuple[Job, ...], str],
) -> None:
    """With monotone admission (`WhatIf.admission_monotone`), the greedy search skips the prefixes admission
    refuses (growing steps, then halving back) and the reprieve puts back runs of victims that leave the
    placement as it is at once: the same victims as taking and putting back one at a time."""
    snapshot, pending, name = world
    runs = run_cycle(snapshot, pending, profile(name)).to_json()
    with patch.object(cycle_module._WhatIf, "admission_monotone", property(lambda self: False)):
        one_by_one = run_cycle(snapshot, pending, profile(name)).to_json()
    assert runs == one_by_one


class _Prefixes:
    """A search stand-in for `_first_admitted`: victims are taken out as a prefix of `ordered`, and admission
    admits from `threshold` of them on (monotone)."""

    def __init__(self, ordered: list[str], taken: int, threshold: int) -> None:
        self.ordered = ordered
        self.taken = taken
        self.threshold = threshold
        self.asked = 0

    def take_many(self, job_ids: list[str]) -> None:
        assert job_ids == self.ordered[self.taken : self.taken + len(job_ids)]
        self.taken += len(job_ids)

    def put_back_many(self, job_ids: list[str]) -> None:
        assert job_ids == self.ordered[self.taken - len(job_ids) : self.taken]
        self.taken -= len(job_ids)

    def admits(self) -> bool:
        self.asked += 1
        return self.taken >= self.threshold


@given(st.integers(1, 300), st.data())
def test_the_first_admitted_prefix_is_the_shortest_one_admission_admits(count: int, data: st.DataObject) -> None:
    """`_first_admitted` finds the shortest prefix that admission admits after one it refused (all of them when
    none is), leaves exactly that prefix taken out, and asks admission a logarithmic number of times."""
    refused = data.draw(st.integers(0, count - 1))
    threshold = data.draw(st.integers(refused + 1, count + 1))  # count + 1: no prefix is admitted
    ordered = [f"v{i:03d}" for i in range(count)]
    search = _Prefixes(ordered, refused, threshold)
    found = priority_preemption.PriorityPreemption._first_admitted(search, ordered, refused)  # type: ignore[arg-type]
    assert found == min(threshold, count)
    assert search.taken == found
    assert search.asked <= 2 * max(1, count - refused).bit_length() + 1
