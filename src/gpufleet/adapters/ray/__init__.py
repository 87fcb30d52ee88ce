"""Running the fleet on a Ray cluster: Ray is the execution fabric (node membership and liveness, remote
processes), gpufleet stays the scheduler of record.

- `agent.py`: `NodeAgent`, one per node (a detached named actor pinned to its node), which starts and
  watches workers with the local executor's own supervisor and isolation, serves log reads, checks a
  MASTER_PORT is free there and samples the node's GPUs.
- `ray_inventory.py`: `RayFleet`, the connection to the cluster and the inventory source: every alive Ray node with
  GPUs (or named in an emulated inventory) becomes a gpufleet node; nodes that join and leave become the
  node changes the loop already understands (a node down: its jobs LOST and retried; up again: offered again).
- `backend.py`: `RayBackend`, the `ExecutionBackend` the loop drives: job-level rules (gangs across nodes,
  stop deadlines, observations), talking to the agents without ever blocking the loop.
- `agent_probe.py`: `RayProbe`, telemetry through the agents.
- `local_cluster.py`: a Ray cluster of emulated GPU nodes on this machine (`up --ray local`).

Ray never chooses a node or a GPU: the core did. Agents reserve no CPU or GPU in Ray's accounting and set
`CUDA_VISIBLE_DEVICES` to exactly the GPUs the core chose. Ray is imported only here (and by the composition
root), lazily: `import gpufleet` and the core work without it.
"""

from __future__ import annotations

import os
from types import ModuleType

from gpufleet.domain.errors import GpufleetError

INSTALL_FIX = "pip install 'gpufleet[ray]'"


def require_ray() -> ModuleType:
    """The `ray` module, or a GpufleetError saying how to install it."""
    # Ray's cluster utilities refuse a multi-node cluster on one machine unless this is set; it changes
    # nothing on a real cluster.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError as error:
        raise GpufleetError(
            f"--ray needs Ray, which is not installed here ({error.msg})",
            INSTALL_FIX,
        ) from None
    return ray


__all__ = ["INSTALL_FIX", "require_ray"]
