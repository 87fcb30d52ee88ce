"""Test kit: builders for domain objects, multi-cycle helpers, and independently computed invariants."""

from tests.kit.builders import (
    GPU_MEMORY_GIB,
    ClusterBuilder,
    JobBuilder,
    QueueBuilder,
    cluster,
    make_job,
    milli,
    queue,
)
from tests.kit.cycles import (
    advance,
    codes,
    gpus_of,
    nodes_of,
    placed,
    run,
    run_cycles,
    running_from,
    running_on,
    still_pending,
    victims,
    without,
    worker_on,
)
from tests.kit.invariants import check_all
from tests.kit.probes import filter_verdicts, score_nodes, select_gpus, usable_gpus, view_of

__all__ = [
    "GPU_MEMORY_GIB",
    "ClusterBuilder",
    "JobBuilder",
    "QueueBuilder",
    "advance",
    "check_all",
    "cluster",
    "codes",
    "filter_verdicts",
    "gpus_of",
    "make_job",
    "milli",
    "nodes_of",
    "placed",
    "queue",
    "run",
    "run_cycles",
    "running_from",
    "running_on",
    "score_nodes",
    "select_gpus",
    "still_pending",
    "usable_gpus",
    "victims",
    "view_of",
    "without",
    "worker_on",
]
