"""The cluster as arrays (struct of arrays), so filters and scores work on every node at once.

Shape conventions: `[N]` per node, `[N, G]` per GPU slot, where G is the most GPUs any node has;
slots beyond a node's GPUs have `gpu_exists == False`. Nodes are sorted by name, so an index is a
stable, deterministic tie-breaker.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from gpufleet.domain.cluster import NODE_ADMITS, Node, WorkerPlacement
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.resources import MILLI_PER_GPU

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Rows = slice | IntArray  # the nodes a filter looks at: all (`slice(None)`) or some, by index
ALL_ROWS = slice(None)

NO_MODEL = -1

T = TypeVar("T", bound=np.generic)


def rows_any(mask: BoolArray) -> BoolArray:
    """Per node: whether any GPU slot of the row is set."""
    # The ufunc directly: `mask.any(axis=1)` costs a few Python calls more, and this runs per placement.
    result: BoolArray = np.logical_or.reduce(mask, axis=1)
    return result


def rows_count(mask: BoolArray) -> IntArray:
    """Per node: how many GPU slots of the row are set."""
    result: IntArray = np.add.reduce(mask, axis=1, dtype=np.int64)
    return result


def _read_only(array: npt.NDArray[T]) -> npt.NDArray[T]:
    """A view of `array` that refuses writes (the array itself stays writable for its owner)."""
    view = array.view()
    view.flags.writeable = False
    return view


def _frozen(array: npt.NDArray[T]) -> npt.NDArray[T]:
    """`array` itself made read-only: capacity, which nothing changes after it is built."""
    array.flags.writeable = False
    return array


class NodeInfo:
    """Capacity and free resources of every node and GPU, read-only: what plugins see of the nodes.

    Every array refuses writes (`ValueError: assignment destination is read-only`); the free-resource arrays
    are read-only views of arrays only the core's `NodeTable` changes, so they always show the current state.
    """

    def __init__(self, nodes: Iterable[Node]) -> None:
        ordered = sorted(nodes, key=lambda n: n.name)
        self.names: tuple[str, ...] = tuple(n.name for n in ordered)
        self.index: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        self.models: tuple[str, ...] = tuple(sorted({g.model for n in ordered for g in n.gpus}))
        self.model_index: dict[str, int] = {m: i for i, m in enumerate(self.models)}
        self._gpu_columns(ordered)
        self._node_columns(ordered)
        self._nvlink_layout()
        # Per node, total milli-GPU capacity: the denominator of packing scores.
        self.gpu_milli_total = _frozen(self.gpu_count * MILLI_PER_GPU)
        # Capacities as divisors of packing scores (at least 1, so empty nodes divide safely).
        self.gpu_milli_divisor = _frozen(np.maximum(self.gpu_milli_total, 1))
        self.cpu_divisor = _frozen(np.maximum(self.cpu_total, 1))
        # Free resources: written by `NodeTable` only, read by everyone through the read-only views.
        self._gpu_milli_free = np.where(self.gpu_exists, MILLI_PER_GPU, 0).astype(np.int64)
        self._gpu_mem_free = self.gpu_mem_total.copy()
        self._cpu_free = self.cpu_total.copy()
        self._mem_free = self.mem_total.copy()
        self._node_milli_free = self.gpu_milli_total.copy()
        # A logical clock of changes: `version[i]` is the clock of node i's last change, so cached
        # per-class filter results are recomputed for changed nodes only.
        self.clock = 0
        self._version = np.zeros(len(ordered), dtype=np.int64)
        self._views()
        self._luts: dict[frozenset[str], BoolArray] = {}
        self._lut_stacks: dict[tuple[frozenset[str], ...], BoolArray] = {}

    def _gpu_columns(self, ordered: list[Node]) -> None:
        """`[N, G]` capacity per GPU slot, and the same rows as Python lists for per-worker code."""
        n_nodes = len(ordered)
        width = max((len(n.gpus) for n in ordered), default=0)
        self.width = width
        gpu_exists = np.zeros((n_nodes, width), dtype=np.bool_)
        gpu_model = np.full((n_nodes, width), NO_MODEL, dtype=np.int64)
        gpu_mem_total = np.zeros((n_nodes, width), dtype=np.int64)
        gpu_nvlink = np.zeros((n_nodes, width), dtype=np.int64)
        self.gpu_uuid: list[tuple[str, ...]] = []
        self.gpu_model_names: list[tuple[str, ...]] = []
        for i, node in enumerate(ordered):
            k = len(node.gpus)
            if k:
                gpu_exists[i, :k] = True
                gpu_model[i, :k] = [self.model_index[g.model] for g in node.gpus]
                gpu_mem_total[i, :k] = [g.memory for g in node.gpus]
                gpu_nvlink[i, :k] = [g.nvlink_group for g in node.gpus]
            self.gpu_uuid.append(tuple(g.uuid for g in node.gpus))
            self.gpu_model_names.append(tuple(g.model for g in node.gpus))
        self.gpu_exists = _frozen(gpu_exists)
        self.gpu_model = _frozen(gpu_model)
        self.gpu_mem_total = _frozen(gpu_mem_total)
        self.gpu_nvlink = _frozen(gpu_nvlink)
        self.gpu_count = _frozen(gpu_exists.sum(axis=1).astype(np.int64))
        self.gpu_count_list: list[int] = self.gpu_count.tolist()
        # Capacity as Python lists, for per-worker code that reads a few values (numpy scalars are slow).
        self.gpu_mem_total_rows: list[list[int]] = gpu_mem_total.tolist()
        self.gpu_nvlink_rows: list[list[int]] = gpu_nvlink.tolist()
        # Per node: its GPU model when all its GPUs are of one model (the usual case), else None.
        self.node_model: list[str | None] = [
            names[0] if names and all(m == names[0] for m in names) else None for names in self.gpu_model_names
        ]

    def _node_columns(self, ordered: list[Node]) -> None:
        """`[N]` capacity per node: CPU, memory, health, rack and zone ids."""
        racks = sorted({n.rack for n in ordered})
        zones = sorted({n.zone for n in ordered})
        rack_ids = {r: i for i, r in enumerate(racks)}
        self.racks = len(racks)
        zone_ids = {z: i for i, z in enumerate(zones)}
        self.cpu_total = _frozen(np.array([n.cpu_milli for n in ordered], dtype=np.int64))
        self.mem_total = _frozen(np.array([n.memory for n in ordered], dtype=np.int64))
        self.schedulable = _frozen(np.array([n.schedulable for n in ordered], dtype=np.bool_))
        self.rack = _frozen(np.array([rack_ids[n.rack] for n in ordered], dtype=np.int64))
        self.zone = _frozen(np.array([zone_ids[n.zone] for n in ordered], dtype=np.int64))
        # Spot capacity, and what each node admits while its spot pool's circuit breaker is open (data from the
        # control plane: `Node.admits`, 0 all, 1 workers that checkpoint, 2 none, 3 one probe job).
        self.spot = _frozen(np.array([n.pool == "spot" for n in ordered], dtype=np.bool_))
        self.admits = _frozen(np.array([NODE_ADMITS.index(n.admits) for n in ordered], dtype=np.int64))
        # Nodes gated for one probe job, each with the probe-gated nodes of its pool (zone): what one of them
        # takes changes what the others admit, so a change to one dates them all (cached filter results).
        gated = [i for i, node in enumerate(ordered) if node.admits == "probe"]
        self.probe_peers: dict[int, IntArray] = {
            i: np.array([j for j in gated if ordered[j].zone == ordered[i].zone], dtype=np.int64) for i in gated
        }

    def _nvlink_layout(self) -> None:
        width = self.width
        self.nvlink_groups = int(self.gpu_nvlink.max()) + 1 if width else 1
        # Per NVLink group: the GPU slots in it (for "most usable GPUs inside one group").
        self.nvlink_masks = [_frozen(self.gpu_exists & (self.gpu_nvlink == g)) for g in range(self.nvlink_groups)]
        # The usual layout: group g is the g-th block of equal size in every node's slots; then the
        # per-group counts are one reshape away. 0 when nodes differ.
        block = width // self.nvlink_groups if width and width % self.nvlink_groups == 0 else 0
        if block and not np.array_equal(
            self.gpu_nvlink[self.gpu_exists],
            (np.arange(width)[None, :] // block).repeat(len(self.names), axis=0)[self.gpu_exists],
        ):
            block = 0
        self.nvlink_block = block

    def _views(self) -> None:
        """The public, read-only views of the free-resource arrays (after they were built or copied)."""
        self.gpu_milli_free = _read_only(self._gpu_milli_free)
        self.gpu_mem_free = _read_only(self._gpu_mem_free)
        self.cpu_free = _read_only(self._cpu_free)
        self.mem_free = _read_only(self._mem_free)
        self.node_milli_free = _read_only(self._node_milli_free)
        self.version = _read_only(self._version)

    def __len__(self) -> int:
        return len(self.names)

    def model_lut(self, models: frozenset[str]) -> BoolArray:
        """A lookup table over model ids (plus a last slot for "no GPU") of the allowed models (a writable copy)."""
        return self.spec_lut(models).copy()

    def spec_lut_stack(self, model_sets: tuple[frozenset[str], ...]) -> BoolArray:
        """`[M + 1, E]`: the `spec_lut` of each model set as a column (shared and read-only)."""
        cached = self._lut_stacks.get(model_sets)
        if cached is None:
            stack = np.stack([self.spec_lut(models) for models in model_sets], axis=1)
            cached = self._lut_stacks[model_sets] = _frozen(stack)
        return cached

    def spec_lut(self, models: frozenset[str]) -> BoolArray:
        """`model_lut` shared and read-only, not copied."""
        cached = self._luts.get(models)
        if cached is not None:
            return cached
        lut = np.zeros(len(self.models) + 1, dtype=np.bool_)
        if not models:
            lut[: len(self.models)] = True
        else:
            for model in models:
                idx = self.model_index.get(model)
                if idx is not None:
                    lut[idx] = True
        self._luts[models] = _frozen(lut)
        return lut


class NodeTable(NodeInfo):
    """The core's node table: `NodeInfo` plus the only ways to change free resources. Mutable: a cycle
    allocates as it decides; plugins see it as `NodeInfo`."""

    def copy(self) -> NodeTable:
        """An independent copy of the free resources; capacity arrays are shared (never written)."""
        other = copy.copy(self)
        for name in ("_gpu_milli_free", "_gpu_mem_free", "_cpu_free", "_mem_free", "_node_milli_free", "_version"):
            setattr(other, name, getattr(self, name).copy())
        other._views()
        return other

    def mark_changed(self, rows: IntArray) -> None:
        """Date these nodes as changed now (a new clock tick), as if something had been applied to them."""
        if len(rows):
            self.clock += 1
            self._version[rows] = self.clock

    def apply(self, worker: WorkerPlacement, sign: int) -> None:
        """Take (sign=-1) or give back (sign=+1) what a worker holds on its node."""
        i = self.index.get(worker.node)
        if i is None:
            raise GpufleetError(
                f"a placement names node {worker.node!r}, which is not in the snapshot",
                "rebuild the snapshot from the store; a node was removed while jobs still ran on it",
            )
        self.clock += 1
        self._version[i] = self.clock
        if self.probe_peers and i in self.probe_peers:
            self._version[self.probe_peers[i]] = self.clock
        self._cpu_free[i] += sign * worker.cpu_milli
        self._mem_free[i] += sign * worker.memory
        if worker.gpus:
            # Row views and one node total: scalar updates on 1-D views are the cheapest numpy offers.
            milli_row = self._gpu_milli_free[i]
            memory_row = self._gpu_mem_free[i]
            total = 0
            for share in worker.gpus:
                milli = sign * share.milli
                total += milli
                milli_row[share.index] += milli
                memory_row[share.index] += sign * share.memory
            self._node_milli_free[i] += total

    def apply_many(self, workers: Sequence[WorkerPlacement], sign: int) -> None:
        """`apply` for many workers at once, with a few vectorised updates instead of one per share."""
        if len(workers) < 4:
            for worker in workers:
                self.apply(worker, sign)
            return
        self.apply_flat(WorkerArrays.of(self, workers), sign)

    def apply_flat(self, flat: WorkerArrays, sign: int) -> None:
        """`apply_many` for workers already laid out as arrays."""
        if not len(flat.node):
            return
        np.add.at(self._cpu_free, flat.node, sign * flat.cpu)
        np.add.at(self._mem_free, flat.node, sign * flat.memory)
        if len(flat.share_node):
            at = (flat.share_node, flat.share_gpu)
            milli = sign * flat.share_milli
            np.add.at(self._gpu_milli_free, at, milli)
            np.add.at(self._gpu_mem_free, at, sign * flat.share_memory)
            np.add.at(self._node_milli_free, flat.share_node, milli)
        self.clock += 1
        self._version[flat.node] = self.clock
        if self.probe_peers:
            for i in set(flat.node.tolist()) & self.probe_peers.keys():
                self._version[self.probe_peers[i]] = self.clock

    def worker_fits_capacity(self, worker: WorkerPlacement) -> bool:
        """Whether the node still has room for this worker's exact shares (used to check a snapshot)."""
        i = self.index[worker.node]
        if self.cpu_free[i] < worker.cpu_milli or self.mem_free[i] < worker.memory:
            return False
        return all(
            share.index < self.gpu_count[i]
            and self.gpu_milli_free[i, share.index] >= share.milli
            and self.gpu_mem_free[i, share.index] >= share.memory
            for share in worker.gpus
        )


class WorkerArrays:
    """Workers and their GPU shares as flat arrays (struct of arrays), each row tagged with its owner
    (an integer the caller chooses, e.g. a job's position), so what many jobs hold is added or taken
    with a few vectorised updates, and a subset of owners is picked with a mask."""

    def __init__(
        self,
        owner: IntArray,
        node: IntArray,
        cpu: IntArray,
        memory: IntArray,
        share_owner: IntArray,
        share_node: IntArray,
        share_gpu: IntArray,
        share_milli: IntArray,
        share_memory: IntArray,
    ) -> None:
        self.owner = owner
        self.node = node
        self.cpu = cpu
        self.memory = memory
        self.share_owner = share_owner
        self.share_node = share_node
        self.share_gpu = share_gpu
        self.share_milli = share_milli
        self.share_memory = share_memory

    @classmethod
    def of(
        cls, table: NodeInfo, workers: Sequence[WorkerPlacement], owners: Sequence[int] | None = None
    ) -> WorkerArrays:
        """Lay out `workers` (owner k for `owners[k]`, or 0 for all)."""
        index = table.index
        owner: list[int] = []
        nodes: list[int] = []
        cpus: list[int] = []
        mems: list[int] = []
        share_owner: list[int] = []
        share_nodes: list[int] = []
        share_gpus: list[int] = []
        share_milli: list[int] = []
        share_mem: list[int] = []
        for k, worker in enumerate(workers):
            who = owners[k] if owners is not None else 0
            node = index[worker.node]
            owner.append(who)
            nodes.append(node)
            cpus.append(worker.cpu_milli)
            mems.append(worker.memory)
            for share in worker.gpus:
                share_owner.append(who)
                share_nodes.append(node)
                share_gpus.append(share.index)
                share_milli.append(share.milli)
                share_mem.append(share.memory)

        return cls.from_lists(owner, nodes, cpus, mems, share_owner, share_nodes, share_gpus, share_milli, share_mem)

    @classmethod
    def from_lists(
        cls,
        owner: list[int],
        node: list[int],
        cpu: list[int],
        memory: list[int],
        share_owner: list[int],
        share_node: list[int],
        share_gpu: list[int],
        share_milli: list[int],
        share_memory: list[int],
    ) -> WorkerArrays:
        """The constructor's columns, given as lists."""

        def array(values: list[int]) -> IntArray:
            return np.asarray(values, dtype=np.int64)

        return cls(
            array(owner),
            array(node),
            array(cpu),
            array(memory),
            array(share_owner),
            array(share_node),
            array(share_gpu),
            array(share_milli),
            array(share_memory),
        )

    def subset(self, owners: BoolArray) -> WorkerArrays:
        """The rows of the owners set in `owners` (a mask over owner numbers)."""
        rows = owners[self.owner]
        shares = owners[self.share_owner]
        return WorkerArrays(
            self.owner[rows],
            self.node[rows],
            self.cpu[rows],
            self.memory[rows],
            self.share_owner[shares],
            self.share_node[shares],
            self.share_gpu[shares],
            self.share_milli[shares],
            self.share_memory[shares],
        )
