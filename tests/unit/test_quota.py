"""Quota admission: nominal, borrowing in a cohort, borrowing and lending limits, per-model quotas."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpufleet.domain import ClusterSnapshot, Job, QueueSpec
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.cycle import CycleResult
from gpufleet.scheduling.status import Code
from tests.kit import QueueBuilder, cluster, make_job, nodes_of, queue, run, running_from

NO_PREEMPTION = profile("fifo-backfill")


def with_usage(
    queues: Sequence[QueueBuilder | QueueSpec], usage: dict[str, int], *, nodes: int = 4, model: str = "A100-80GB"
) -> ClusterSnapshot:
    """`nodes` x 8 GPUs; each queue in `usage` already runs that many whole GPUs (one job per GPU)."""
    base = cluster().nodes(nodes, model).snapshot(queues=queues)
    jobs = [make_job(f"run-{q}-{i}").queue(q).build() for q, n in sorted(usage.items()) for i in range(n)]
    warm = run(base, jobs, NO_PREEMPTION)
    assert not warm.waiting, warm.waiting
    return cluster().nodes(nodes, model).snapshot(running=running_from(warm, jobs), queues=queues)


def decide(snapshot: ClusterSnapshot, *jobs: Job) -> CycleResult:
    return run(snapshot, list(jobs), NO_PREEMPTION)


@pytest.mark.parametrize(
    ("queues", "usage", "job", "code", "reason"),
    [
        pytest.param(
            [queue("team-a").gpus(16)],
            {"team-a": 16},
            make_job("j").queue("team-a").gpus(1).build(),
            Code.UNSCHEDULABLE,
            "queue team-a at its GPU quota (16/16: asks 1 more, may use nominal 16)",
            id="nominal-full",
        ),
        pytest.param(
            [queue("team-a").gpus(16)],
            {"team-a": 8},
            make_job("j").queue("team-a").gpus(8).build(),
            None,
            None,
            id="nominal-exact",
        ),
        pytest.param(
            [queue("team-a").gpus(16)],
            {},
            make_job("j").queue("team-a").gpus(2).workers(9).build(),
            Code.UNRESOLVABLE,
            "queue team-a asks for 18 GPU but its GPU quota allows at most 16",
            id="gang-above-nominal-ever",
        ),
        pytest.param(
            [queue("team-a").gpus(8, borrowing_limit=8)],
            {"team-a": 8},
            make_job("j").queue("team-a").gpus(1).build(),
            Code.UNSCHEDULABLE,
            "queue team-a at its GPU quota (8/8: asks 1 more, may use nominal 8)",
            id="no-cohort-no-borrowing",
        ),
        pytest.param(
            [queue("team-a").gpus(8).cohort("c"), queue("team-b").gpus(8).cohort("c")],
            {"team-a": 8},
            make_job("j").queue("team-a").gpus(8).build(),
            None,
            None,
            id="borrows-idle-cohort-quota",
        ),
        pytest.param(
            [queue("team-a").gpus(8).cohort("c"), queue("team-b").gpus(8).cohort("c")],
            {"team-a": 16},
            make_job("j").queue("team-a").gpus(1).build(),
            Code.UNSCHEDULABLE,
            "queue team-a at its GPU quota (16/16: asks 1 more, may use nominal 8 + borrowing = 16)",
            id="borrowed-the-whole-cohort",
        ),
        pytest.param(
            [queue("team-a").gpus(8, borrowing_limit=2).cohort("c"), queue("team-b").gpus(8).cohort("c")],
            {"team-a": 8},
            make_job("j").queue("team-a").gpus(4).build(),
            Code.UNSCHEDULABLE,
            "queue team-a at its GPU quota (8/10: asks 4 more, may use nominal 8 + borrowing = 10)",
            id="borrowing-limit",
        ),
        pytest.param(
            [queue("team-a").gpus(8, borrowing_limit=2).cohort("c"), queue("team-b").gpus(8).cohort("c")],
            {"team-a": 8},
            make_job("j").queue("team-a").gpus(2).build(),
            None,
            None,
            id="within-borrowing-limit",
        ),
        pytest.param(
            [queue("team-a").gpus(8, lending_limit=2).cohort("c"), queue("team-b").gpus(8).cohort("c")],
            {"team-b": 8},
            make_job("j").queue("team-b").gpus(4).build(),
            Code.UNSCHEDULABLE,
            "queue team-b at its GPU quota (8/10: asks 4 more, may use nominal 8 + borrowing = 10)",
            id="lending-limit-caps-what-others-borrow",
        ),
        pytest.param(
            [queue("team-a").gpus(8, lending_limit=2).cohort("c"), queue("team-b").gpus(8).cohort("c")],
            {"team-b": 8},
            make_job("j").queue("team-b").gpus(2).build(),
            None,
            None,
            id="borrows-what-is-lent",
        ),
        pytest.param(
            [queue("team-a").gpus(8, lending_limit=2).cohort("c"), queue("team-b").gpus(8).cohort("c")],
            {"team-b": 10},
            make_job("j").queue("team-a").gpus(6).build(),
            None,
            None,
            id="unlent-part-stays-for-the-owner",
        ),
        pytest.param(
            [queue("team-a").gpus(8, lending_limit=2).cohort("c"), queue("team-b").gpus(8).cohort("c")],
            {"team-b": 10},
            make_job("j").queue("team-a").gpus(7).build(),
            Code.UNSCHEDULABLE,
            "cohort c has no idle GPU quota (10/10 in use; queue team-a uses 0 of its nominal 8)",
            id="lent-part-is-borrowed",
        ),
        pytest.param(
            [
                queue("team-a").gpus(8).cohort("c"),
                queue("team-b").gpus(8).cohort("c"),
                queue("team-c").gpus(0).cohort("c"),
            ],
            {"team-a": 8, "team-b": 4},
            make_job("j").queue("team-c").gpus(8).build(),
            Code.UNSCHEDULABLE,
            "cohort c has no idle GPU quota (12/16 in use; queue team-c uses 0 of its nominal 0)",
            id="cohort-pool-overdrawn",
        ),
        pytest.param(
            [
                queue("team-a").gpus(8).cohort("c"),
                queue("team-b").gpus(8).cohort("c"),
                queue("team-c").gpus(0).cohort("c"),
            ],
            {"team-a": 8, "team-b": 4},
            make_job("j").queue("team-c").gpus(4).build(),
            None,
            None,
            id="cohort-pool-rest",
        ),
        pytest.param(
            [queue("team-a").gpus(8).cohort("c"), queue("team-b").gpus(8).cohort("other")],
            {"team-a": 8},
            make_job("j").queue("team-a").gpus(1).build(),
            Code.UNSCHEDULABLE,
            "queue team-a at its GPU quota (8/8: asks 1 more, may use nominal 8)",
            id="alone-in-its-cohort",
        ),
        pytest.param(
            [queue("team-a").cpu(16)],
            {},
            make_job("j").queue("team-a").gpus(1).cpu(20).build(),
            Code.UNRESOLVABLE,
            "queue team-a asks for 20 CPU but its CPU quota allows at most 16",
            id="cpu-quota-ever",
        ),
        pytest.param(
            [queue("team-a").gpus(None)],
            {"team-a": 24},
            make_job("j").queue("team-a").gpus(8).build(),
            None,
            None,
            id="unlimited-nominal",
        ),
        pytest.param(
            [queue("team-a")],
            {"team-a": 24},
            make_job("j").queue("team-a").gpus(8).build(),
            None,
            None,
            id="no-quotas",
        ),
    ],
)
def test_quota_admission(
    queues: list[QueueBuilder], usage: dict[str, int], job: Job, code: Code | None, reason: str | None
) -> None:
    result = decide(with_usage(queues, usage), job)
    if code is None:
        assert [p.job for p in result.placements] == [job.id], result.waiting
    else:
        assert result.waiting[job.id].code is code
        assert result.waiting[job.id].reasons == (reason,)
        assert result.waiting[job.id].plugin == "quota"


# ---- per GPU model ---------------------------------------------------------------------------------


def test_per_model_quota_message() -> None:
    snapshot = with_usage([queue("team-a").model_gpus("A100-80GB", 16)], {"team-a": 16})
    result = decide(snapshot, make_job("j").queue("team-a").gpus(1).build())
    assert result.waiting["j"].code is Code.UNSCHEDULABLE
    assert result.waiting["j"].reasons == (
        "queue team-a at its A100-80GB quota (16/16: asks 1 more, may use nominal 16)",
    )


def mixed(queues: Sequence[QueueBuilder], a100_used: int) -> ClusterSnapshot:
    """Two A100 nodes (node-00, node-01) and two H100 nodes (node-02, node-03); team-a runs A100s."""
    builder = cluster().nodes(2, "A100-80GB").nodes(2, "H100")
    jobs = [make_job(f"run-{i}").queue("team-a").models("A100-80GB").build() for i in range(a100_used)]
    warm = run(builder.snapshot(queues=queues), jobs, NO_PREEMPTION)
    assert not warm.waiting
    return builder.snapshot(running=running_from(warm, jobs), queues=queues)


def test_per_model_quota_narrows_the_models_a_job_may_use() -> None:
    snapshot = mixed([queue("team-a").model_gpus("A100-80GB", 8).model_gpus("H100", 8)], a100_used=8)
    result = decide(snapshot, make_job("j").queue("team-a").gpus(4).build())
    assert nodes_of(result, "j")[0] in ("node-02", "node-03")


def test_a_queue_with_per_model_quotas_may_use_only_those_models() -> None:
    snapshot = mixed([queue("team-a").model_gpus("A100-80GB", 16)], a100_used=16)
    result = decide(snapshot, make_job("j").queue("team-a").gpus(1).build())
    status = result.waiting["j"]
    assert status.code is Code.UNSCHEDULABLE
    assert status.reasons == (
        "queue team-a at its A100-80GB quota (16/16: asks 1 more, may use nominal 16)",
        "queue team-a asks for 1 H100 but its H100 quota allows at most 0",
    )


def test_a_model_the_queue_has_no_quota_for_is_unresolvable() -> None:
    snapshot = mixed([queue("team-a").model_gpus("A100-80GB", 16)], a100_used=0)
    result = decide(snapshot, make_job("j").queue("team-a").gpus(1).models("H100").build())
    assert result.waiting["j"].code is Code.UNRESOLVABLE
    assert result.waiting["j"].reasons == ("queue team-a asks for 1 H100 but its H100 quota allows at most 0",)


def test_model_quota_explained_per_node_when_the_filter_excludes_it() -> None:
    # A100 quota is full, H100 nodes are full: both reasons show, per node.
    builder = cluster().nodes(1, "A100-80GB").nodes(1, "H100")
    queues = [queue("team-a").model_gpus("A100-80GB", 1).model_gpus("H100", 16)]
    jobs = [make_job("a100").queue("team-a").models("A100-80GB").build()]
    jobs += [make_job(f"h{i}").queue("team-b").models("H100").build() for i in range(8)]
    warm = run(builder.snapshot(queues=[*queues, queue("team-b")]), jobs, NO_PREEMPTION)
    snapshot = builder.snapshot(running=running_from(warm, jobs), queues=[*queues, queue("team-b")])
    result = decide(snapshot, make_job("j").queue("team-a").gpus(1).build())
    assert result.waiting["j"].reasons == ("0/2 nodes fit: 1 GPU model over the queue's quota, 1 too few free GPUs",)


# ---- within one cycle ------------------------------------------------------------------------------


def test_quota_counts_placements_made_earlier_in_the_same_cycle() -> None:
    snapshot = with_usage([queue("team-a").gpus(4)], {})
    jobs = [make_job(f"j{i}").queue("team-a").seq(i).build() for i in range(6)]
    result = decide(snapshot, *jobs)
    assert [p.job for p in result.placements] == ["j0", "j1", "j2", "j3"]
    assert result.waiting["j4"].reasons == ("queue team-a at its GPU quota (4/4: asks 1 more, may use nominal 4)",)


def test_fractional_gpus_count_in_milli() -> None:
    snapshot = with_usage([queue("team-a").gpus(1)], {})
    jobs = [make_job(f"j{i}").queue("team-a").fraction(0.5).seq(i).build() for i in range(3)]
    result = decide(snapshot, *jobs)
    assert [p.job for p in result.placements] == ["j0", "j1"]
    assert result.waiting["j2"].reasons == ("queue team-a at its GPU quota (1/1: asks 0.5 more, may use nominal 1)",)


def test_an_elastic_job_grows_only_within_quota() -> None:
    snapshot = with_usage([queue("team-a").gpus(8)], {})
    result = decide(snapshot, make_job("e").queue("team-a").gpus(4).elastic(1, 4).build())
    assert len(result.placements[0].workers) == 2


def test_a_job_of_an_unknown_queue_is_unresolvable() -> None:
    snapshot = with_usage([queue("team-a"), queue("team-b")], {})
    result = decide(snapshot, make_job("j").queue("team-z").build())
    assert result.waiting["j"].code is Code.UNRESOLVABLE
    assert result.waiting["j"].reasons == ("queue team-z does not exist (queues: team-a, team-b)",)


def test_without_queue_specs_any_queue_name_goes() -> None:
    snapshot = cluster().nodes(1, "A100-80GB").snapshot()
    assert [p.job for p in decide(snapshot, make_job("j").queue("anything").build()).placements] == ["j"]
