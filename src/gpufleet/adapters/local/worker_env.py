"""The environment of one worker: a clean base, what the job adds, and what the allocator owns (GPUs, ranks,
rendezvous).

Precedence, lowest first: the base (`PATH`, `HOME`, `USER`, `LOGNAME`, `LANG`: what a login would give the
worker's user), the job's `run.env`, then the allocator's variables (a job cannot choose its own GPUs by
setting CUDA_VISIBLE_DEVICES). Nothing comes from the control plane's own environment: it may hold the
operator's secrets and tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.domain.checkpoints import INTERVAL_ENV as CHECKPOINT_INTERVAL_ENV
from gpufleet.domain.cluster import Gpu, Node
from gpufleet.domain.errors import GpufleetError
from gpufleet.domain.resources import MILLI_PER_GPU
from gpufleet.ports import Launch

# Docker's default: what a job finds without a login shell to set PATH up.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_LANG = "C.UTF-8"


def base_env(user: str, home: str) -> dict[str, str]:
    """What every worker starts from: a sane PATH, its user's name and home, a UTF-8 locale."""
    return {"PATH": DEFAULT_PATH, "HOME": home, "USER": user, "LOGNAME": user, "LANG": DEFAULT_LANG}


def worker_env(base: Mapping[str, str], job_env: Mapping[str, str], allocator: Mapping[str, str]) -> dict[str, str]:
    """The worker's whole environment: base < the job's own < the allocator's."""
    return {**base, **job_env, **allocator}


def allocator_env(
    launch: Launch,
    rank: int,
    nodes: Mapping[str, Node],
    *,
    master_addr: str,
    master_port: int,
    emulated: bool,
    node_addresses: Mapping[str, str] | None = None,
    resize_count: int = 0,
) -> dict[str, str]:
    """The variables the allocator sets for worker `rank` of `launch`. `node_addresses`: each node's address
    (default: `master_addr` for every node, all on this machine). `resize_count`: how many times the attempt
    was resized (GPUFLEET_RESIZE_COUNT: a job resumes from its checkpoint when it is above 0). Raises
    GpufleetError when the placement names a node or GPU this backend does not have."""
    job = launch.job
    placement = launch.workers[rank]
    node = nodes.get(placement.node)
    if node is None:
        raise GpufleetError(
            f"worker {rank} is placed on node {placement.node!r}, which this executor does not run",
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
    addresses = node_addresses or {}
    # One address per node of the job, rank 0's first: what `torchrun --rdzv` or a hostfile wants.
    node_ips = "\n".join(addresses.get(name, master_addr) for name in node_order)
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
        "GPUFLEET_NODE_IPS": node_ips,
        "GPUFLEET_JOB_ID": job.id,
        "GPUFLEET_JOB_NAME": job.name or job.id,
        "GPUFLEET_QUEUE": job.queue,
        "GPUFLEET_ATTEMPT": str(launch.attempt),
        "GPUFLEET_RESIZE_COUNT": str(resize_count),
    }
    if launch.checkpoint_interval_s is not None:
        env[CHECKPOINT_INTERVAL_ENV] = f"{launch.checkpoint_interval_s:.0f}"
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
