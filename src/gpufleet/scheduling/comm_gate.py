"""Communication cost of a gang's placement: the estimate (`domain.comm`) over the table's links, and the gate that
refuses a placement whose all-reduce share of each step passes the job's `max_comm_overhead`."""

from __future__ import annotations

import numpy as np

from gpufleet.domain.cluster import WorkerPlacement
from gpufleet.domain.comm import GB, CommNeeds, RingEstimate, estimate, ring_factor
from gpufleet.scheduling.status import Code, Status
from gpufleet.scheduling.table import BoolArray, IntArray, NodeInfo, rows_count

PLUGIN = "comm"


def placement_estimate(needs: CommNeeds, table: NodeInfo, workers: tuple[WorkerPlacement, ...]) -> RingEstimate:
    """What the ring over these workers' GPUs costs the job each step."""
    per_node: dict[int, set[int]] = {}
    for worker in workers:
        per_node.setdefault(table.index[worker.node], set()).update(s.index for s in worker.gpus)
    rows = np.fromiter(per_node, dtype=np.int64, count=len(per_node))
    gpus = np.array([len(g) for g in per_node.values()], dtype=np.int64)
    groups = np.array(
        [len({table.gpu_nvlink_rows[node][i] for i in g}) for node, g in per_node.items()], dtype=np.int64
    )
    return estimate(needs, gpus, groups, table.nvlink_gbps[rows], table.pcie_gbps[rows], table.network_gbps[rows])


def _largest_group_capacity(table: NodeInfo) -> IntArray:
    """Per node: the GPUs of its largest NVLink group (capacity, not what is free)."""
    best = np.zeros(len(table), dtype=np.int64)
    for mask in table.nvlink_masks:
        np.maximum(best, rows_count(mask), out=best)
    return best


def best_case(needs: CommNeeds, table: NodeInfo, ranks: int) -> tuple[RingEstimate, str] | None:
    """The cheapest ring this inventory offers `ranks` GPUs, were they free (vectorised over nodes), and what it
    takes, e.g. "2 whole nodes"; None when the schedulable nodes hold fewer GPUs."""
    count = np.where(table.schedulable, table.gpu_count, 0)
    largest = _largest_group_capacity(table)
    options: list[tuple[RingEstimate, str]] = []
    single = (count >= ranks).nonzero()[0]
    if len(single):
        inside = largest[single] >= ranks
        bus = np.where(inside, table.nvlink_gbps[single], table.pcie_gbps[single])
        k = int(single[int(np.argmax(bus))])
        one = np.array([ranks], dtype=np.int64)
        groups = np.array([1 if largest[k] >= ranks else 2], dtype=np.int64)
        found = estimate(
            needs, one, groups, table.nvlink_gbps[k : k + 1], table.pcie_gbps[k : k + 1], table.network_gbps[k : k + 1]
        )
        options.append((found, f"{ranks} GPUs on one node"))
    # Whole nodes, the most ports per node first: the fewest nodes, and the fastest ring among them.
    order = np.lexsort((-table.network_gbps * count, -count))
    taken = np.cumsum(count[order])
    enough = int(np.searchsorted(taken, ranks))
    if enough < len(order) and enough > 0:
        rows = order[: enough + 1]
        gpus = count[rows].copy()
        gpus[-1] = ranks - (int(taken[enough - 1]) if enough else 0)
        groups = np.where(largest[rows] >= gpus, 1, 2).astype(np.int64)
        found = estimate(needs, gpus, groups, table.nvlink_gbps[rows], table.pcie_gbps[rows], table.network_gbps[rows])
        whole = len(rows) if gpus[-1] == count[rows[-1]] else len(rows) - 1
        options.append(
            (found, f"{whole} whole nodes" if whole == len(rows) else f"{len(rows)} nodes, {whole} of them whole")
        )
    if not options:
        return None
    return min(options, key=lambda option: option[0].overhead)


def within_limit(
    needs: CommNeeds, table: NodeInfo, usable: BoolArray, largest_group: IntArray, workers: int, per_worker: int
) -> BoolArray:
    """Nodes (vectorised) that could carry the gang's ring within its limit, given what is usable on them now: those
    that hold the whole gang over a fast enough link, if any; else those whose links and ports (the GPUs of the gang
    they can hold x their network port) reach the bus bandwidth the limit needs."""
    limit = needs.max_overhead
    assert limit is not None
    ranks = workers * max(1, per_worker)
    sync_budget = limit * needs.step_time_s / (1.0 - limit)
    required = float(ring_factor(ranks)) * needs.grad_bytes / (sync_budget * GB)
    hostable = np.minimum(rows_count(usable) // max(1, per_worker), workers) * max(1, per_worker)
    inside = np.where(largest_group >= hostable, table.nvlink_gbps, table.pcie_gbps)
    alone = (hostable >= ranks) & (inside >= required)
    if alone.any():
        return alone
    result: BoolArray = (hostable > 0) & (inside >= required) & (hostable * table.network_gbps >= required)
    return result


def gate(needs: CommNeeds, table: NodeInfo, workers: tuple[WorkerPlacement, ...]) -> Status | None:
    """None if the placement's predicted overhead is within the job's limit; else why it is not taken."""
    limit = needs.max_overhead
    if limit is None:
        return None
    found = placement_estimate(needs, table, workers)
    if found.overhead <= limit:
        return None
    over = f"{found.describe()}, above its max_comm_overhead of {100 * limit:g} %"
    best = best_case(needs, table, found.ranks)
    if best is not None and best[0].overhead <= limit:
        return Status(Code.UNSCHEDULABLE, (f"{over}; waits for {best[1]} (~{100 * best[0].overhead:.0f} %)",), PLUGIN)
    cheapest = "" if best is None else f" (the cheapest, {best[1]}: ~{100 * best[0].overhead:.0f} %)"
    return Status(
        Code.UNRESOLVABLE,
        (
            f"{over}; no placement on these nodes is within it{cheapest}; to fix: raise max_comm_overhead, or use "
            "fewer workers",
        ),
        PLUGIN,
    )
