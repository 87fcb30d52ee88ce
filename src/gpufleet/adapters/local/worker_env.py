"""The environment of one worker: what the allocator owns (GPUs, ranks, rendezvous) and what the job adds.

Precedence, lowest first: the control plane's environment, the job's `run.env`, then the variables below,
which the allocator owns (a job cannot choose its own GPUs by setting CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.domain.cluster import Gpu, Node
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.ports import Launch


def allocator_env(
    launch: Launch,
    rank: int,
    nodes: Mapping[str, Node],
    *,
    master_addr: str,
    master_port: int,
    emulated: bool,
) -> dict[str, str]:
    """The variables the allocator sets for worker `rank` of `launch`. Raises GpufleetError when the
    placement names a node or GPU this backend does not have."""
    job = launch.job
    placement = launch.workers[rank]
    node = nodes.get(placement.node)
    if node is None:
        raise GpufleetError(
            f"worker {rank} is placed on node {placement.node!r}, which this local executor does not run",
            f"place it on one of: {', '.join(sorted(nodes)) or 'no nodes configured'}",
        )
    gpus: list[Gpu] = []
    for share in placement.gpus:
        if not 0 <= share.index < len(node.gpus):
            raise GpufleetError(
                f"worker {rank} is placed on GPU {share.index} of node {node.name!r}, which has {len(node.gpus)}",
                "the placement and the node inventory disagree; restart with the inventory the placements used",
            )
        gpus.append(node.gpus[share.index])
    # Ranks on the same node are numbered together (torchrun's LOCAL_RANK); nodes in order of first use.
    node_order = list(dict.fromkeys(w.node for w in launch.workers))
    same_node = [r for r, w in enumerate(launch.workers) if w.node == placement.node]
    visible = ",".join(g.uuid for g in gpus)
    env = {
        "CUDA_VISIBLE_DEVICES": visible,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NVIDIA_VISIBLE_DEVICES": visible,
        "GPUFLEET_GPU_INDICES": ",".join(str(g.index) for g in gpus),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(len(launch.workers)),
        "RANK": str(rank),
        "LOCAL_RANK": str(same_node.index(rank)),
        "LOCAL_WORLD_SIZE": str(len(same_node)),
        "NODE_RANK": str(node_order.index(placement.node)),
        "GPUFLEET_JOB_ID": job.id,
        "GPUFLEET_JOB_NAME": job.name or job.id,
        "GPUFLEET_QUEUE": job.queue,
        "GPUFLEET_ATTEMPT": str(launch.attempt),
    }
    if emulated:
        env["GPUFLEET_EMULATED"] = "1"
    if job.request.fractional and gpus:
        env.update(fraction_env(job.request.gpu_milli, job.request.gpu_memory, placement.gpus[0].memory, gpus[0]))
    return env


def fraction_env(milli: int, requested_memory: int, share_memory: int, gpu: Gpu) -> dict[str, str]:
    """Variables that let frameworks keep a fractional worker inside its share of GPU memory."""
    fraction = milli / MILLI_PER_GPU
    memory = requested_memory or share_memory or int(fraction * gpu.memory)
    memory = min(memory, gpu.memory)
    return {
        "GPUFLEET_GPU_FRACTION": f"{fraction:g}",
        "GPUFLEET_GPU_MEMORY_BYTES": str(memory),
        # JAX preallocates this fraction of the device instead of 75 %.
        "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{memory / gpu.memory:.3f}",
        # TensorFlow grows its allocation instead of taking the whole device at start.
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
