"""Why a job waits: per-node reason counts, in people's words, shown to users as is."""

from __future__ import annotations

import numpy as np
import pytest

from gpufleet.domain import ClusterSnapshot, Job
from gpufleet.policies.catalog import profile
from gpufleet.scheduling.placer import explain_nodes
from gpufleet.scheduling.plugin_api import FilterResult
from gpufleet.scheduling.status import Code
from tests.kit import cluster, make_job, run, running_on
from tests.kit.reasons import NO_VICTIM

NO_PREEMPTION = profile("best-fit")


def busy_fleet() -> ClusterSnapshot:
    """node-00/01: A100 with 6 of 8 GPUs taken; node-02/03: empty H100s; node-04: cordoned;
    node-05: a small A100-40GB node (4 cores, 16 GiB)."""
    builder = (
        cluster()
        .nodes(2, "A100-80GB")
        .nodes(2, "H100")
        .nodes(1, "A100-80GB", cordoned=True)
        .nodes(1, "A100-40GB", cpu=4, memory=16)
    )
    nodes = builder.build()
    running = [running_on(make_job(f"x{i}").gpus(6).build(), [(nodes[i], range(6))]) for i in range(2)]
    return builder.snapshot(running=running)


@pytest.mark.parametrize(
    ("job", "code", "reason"),
    [
        pytest.param(
            make_job("j").gpus(4).models("A100-80GB", "A100-40GB").cpu(8).build(),
            Code.UNSCHEDULABLE,
            "0/6 nodes fit: 2 too few free GPUs, 2 wrong GPU model, 1 cordoned or unhealthy, 1 not enough free CPU",
            id="sorted-by-count-then-reason",
        ),
        pytest.param(
            make_job("j").gpus(4).models("A100-80GB", "A100-40GB").memory(32).build(),
            Code.UNSCHEDULABLE,
            "0/6 nodes fit: 2 too few free GPUs, 2 wrong GPU model, 1 cordoned or unhealthy, 1 not enough free memory",
            id="memory",
        ),
        pytest.param(
            make_job("j").gpus(3).models("A100-80GB", "A100-40GB").gpu_memory(60).cpu(8).build(),
            Code.UNSCHEDULABLE,
            "0/6 nodes fit: 2 too few free GPUs, 2 wrong GPU model, 1 cordoned or unhealthy, "
            "1 too little memory per GPU",
            id="first-failing-check-per-node",
        ),
        pytest.param(
            make_job("j").gpus(1).cpu(200).build(),
            Code.UNRESOLVABLE,
            "needs 200 CPUs per worker; the largest node has 96",
            id="unresolvable-is-not-a-node-count",
        ),
    ],
)
def test_why_no_node_fits(job: Job, code: Code, reason: str) -> None:
    result = run(busy_fleet(), [job], NO_PREEMPTION)
    assert result.waiting["j"].code is code
    assert result.waiting["j"].reasons == (reason,)


def test_the_example_from_the_design_guide() -> None:
    builder = cluster().nodes(2, "A100-80GB").nodes(2, "H100")
    nodes = builder.build()
    running = [running_on(make_job(f"x{i}").gpus(6).build(), [(nodes[i], range(6))]) for i in range(2)]
    result = run(builder.snapshot(running=running), [make_job("j").gpus(4).models("A100-80GB").build()], NO_PREEMPTION)
    assert result.waiting["j"].reasons == ("0/4 nodes fit: 2 too few free GPUs, 2 wrong GPU model",)


def test_preempting_profiles_add_why_preemption_does_not_help() -> None:
    builder = cluster().nodes(1, "A100-80GB")
    (node,) = builder.build()
    snapshot = builder.snapshot(running=[running_on(make_job("x").gpus(8).priority(9).build(), [(node, range(8))])])
    result = run(snapshot, [make_job("j").gpus(1).build()], profile("default"))
    assert result.waiting["j"].reasons == ("0/1 nodes fit: 1 too few free GPUs", NO_VICTIM)


def test_explain_nodes_counts_the_first_failing_check_of_each_node() -> None:
    results = [
        FilterResult((("cordoned", np.array([True, False, True, True])),)),
        FilterResult((("few", np.array([False, False, True, True])), ("cpu", np.array([False, True, False, True])))),
    ]
    assert explain_nodes(4, results) == "1/4 nodes fit: 1 cordoned, 1 cpu, 1 few"
    assert explain_nodes(0, []) == "0/0 nodes fit"
