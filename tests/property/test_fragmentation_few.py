"""The per-node gradient (`FewNodes`) gives `placement_delta`'s floats bit for bit, on random tables,
target workloads and requests: mixed GPU models inside a node, CPU thresholds, multi-GPU classes, GPUs
not usable by the request."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain import GiB, GpuShare, Node, WorkerPlacement, WorkerRequest
from gpufleet.domain.cluster import Gpu
from gpufleet.scheduling.fragmentation import TargetWorkload, TaskClass, placement_delta
from gpufleet.scheduling.fragmentation_few import FEW_ROWS, FewNodes
from gpufleet.scheduling.table import NodeTable

MODELS = ("A100", "T4", "V100")
SHARES = (0, 0, 0, 0, 0, 0, 100, 250, 300, 500, 750, 1000)  # taken per GPU: whole GPUs free often


@st.composite
def tables(draw: st.DrawFn) -> NodeTable:
    count = draw(st.integers(1, 5))
    nodes = []
    for i in range(count):
        width = draw(st.sampled_from([0, 1, 2, 4, 4, 8]))
        models = draw(st.lists(st.sampled_from(MODELS), min_size=width, max_size=width))
        gpus = tuple(Gpu(g, f"GPU-{i}-{g}", model, 16 * GiB, nvlink_group=0) for g, model in enumerate(models))
        nodes.append(Node(f"n{i}", gpus, cpu_milli=32_000, memory=64 * GiB))
    table = NodeTable(nodes)
    for i, node in enumerate(nodes):
        # A third of the nodes idle: there a fraction has only whole GPUs to split, the multi-GPU classes' room.
        idle = draw(st.integers(0, 2)) == 0
        taken = [0 if idle else draw(st.sampled_from(SHARES)) for _ in node.gpus]
        shares = tuple(GpuShare(g, t) for g, t in enumerate(taken) if t)
        table.apply(WorkerPlacement(table.names[i], shares, draw(st.integers(0, 32_000))), -1)
    return table


@st.composite
def targets(draw: st.DrawFn) -> TargetWorkload:
    classes = []
    for _ in range(draw(st.integers(1, 6))):
        gpus = draw(st.sampled_from([0, 1, 1, 2, 2, 4]))
        milli = draw(st.sampled_from([100, 250, 500, 750, 1000])) if gpus == 1 else (1000 if gpus else 0)
        models = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2))) if gpus else frozenset()
        cpu = draw(st.sampled_from([0, 0, 4_000, 16_000, 30_000]))
        classes.append(TaskClass(milli, gpus, models, draw(st.integers(1, 50)) / 3, cpu_milli=cpu))
    return TargetWorkload(tuple(classes))


@st.composite
def requests(draw: st.DrawFn) -> WorkerRequest:
    gpus = draw(st.sampled_from([0, 1, 1, 1, 2, 3]))
    milli = draw(st.sampled_from([100, 250, 500, 1000])) if gpus == 1 else 1000
    return WorkerRequest(gpus=gpus, gpu_milli=milli, cpu_milli=draw(st.sampled_from([0, 2_000, 20_000])))


# Cheap examples, and the cases that tell the kernels apart are a few percent of them: more than the profile's.
@settings(max_examples=max(400, settings().max_examples))
@given(tables(), targets(), st.lists(requests(), min_size=1, max_size=3), st.data())
def test_per_node_gradient_is_bit_equal_to_the_vectorised_one(
    table: NodeTable, target: TargetWorkload, asked: list[WorkerRequest], data: st.DataObject
) -> None:
    # One kernel for several requests and masks: nodes in equal states share its memo.
    kernel = FewNodes(target)
    for request in asked:
        rows = np.array(
            data.draw(st.lists(st.integers(0, len(table) - 1), min_size=1, max_size=FEW_ROWS, unique=True)),
            dtype=np.int64,
        )
        need = request.gpu_milli if request.fractional else 1000
        fits = table.gpu_exists[rows] & (table.gpu_milli_free[rows] >= need)
        # Some GPUs the filters turned down (e.g. too little GPU memory) although their share would fit.
        kept = data.draw(st.lists(st.booleans(), min_size=fits.size, max_size=fits.size))
        usable = fits & np.array(kept, dtype=np.bool_).reshape(fits.shape)
        growth, gpu = kernel.placement_delta(table, request, rows, usable)
        want_growth, want_gpu = placement_delta(table, target, request, rows, usable)
        assert growth.tobytes() == want_growth.tobytes()
        assert gpu.tolist() == want_gpu.tolist()
