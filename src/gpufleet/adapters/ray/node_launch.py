"""Start one Ray node (head or not) whose processes outlive whoever asked for it, then exit.

`LocalRayCluster` runs `python -m gpufleet.adapters.ray.node_launch` in a session of its own with a JSON
description on stdin (ports, resources, labels, the head's address); this process starts the node's daemons
through Ray's own `Node` (what `ray start` and `ray.cluster_utils` use) without a reaper and without fate
sharing, prints the node's address and its daemons' PIDs as one JSON line, and exits. The daemons keep
running: a `kill -9` of the control plane leaves the cluster and the jobs on it alone.

Not `ray start`: on one machine it either refuses a second node (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) or
swaps 127.0.0.1 for the machine's external address (=1), which may not route.

The environment (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH, the metrics ports) comes from the caller.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def launch(given: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray._private.node
    import ray._private.parameter

    head = bool(given.pop("head", False))
    params = ray._private.parameter.RayParams(**given)
    node = ray._private.node.Node(params, head=head, shutdown_at_exit=False, spawn_reaper=False)
    pids = {kind: [info.process.pid for info in infos] for kind, infos in node.all_processes.items()}
    return {"address": node.gcs_address, "pids": pids, "session_dir": node.get_session_dir_path()}  # type: ignore[no-untyped-call]


def main() -> None:
    given = json.loads(sys.stdin.read())
    result = launch(given)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    # Ray's atexit hooks would tidy what this process started; its daemons must stay.
    os._exit(0)


if __name__ == "__main__":
    main()
