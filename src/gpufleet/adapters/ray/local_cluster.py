"""A Ray cluster of emulated GPU nodes on this machine: a head without GPUs and one Ray node per node of an
emulated inventory, each carrying the resource `gpufleet-node:NAME` (its name in gpufleet) and as many Ray
GPUs as its spec has. `gpufleet up --ray local --inventory fleet.yaml` runs one to try multi-node scheduling on
one machine; the tests and `gpufleet bench ray` use the same class. Every node is a real raylet process: a
node can be killed (`kill`, SIGKILL to its raylet) and brought back (`add`).

Everything binds to 127.0.0.1 (by default Ray binds to the machine's external address, which a sandbox or a
laptop on the move may not route).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.adapters.ray import require_ray
from gpufleet.adapters.ray.ray_inventory import NODE_RESOURCE
from gpufleet.domain.cluster import Node

LOOPBACK = "127.0.0.1"


class LocalRayCluster:
    def __init__(
        self,
        nodes: Sequence[Node],
        *,
        system_config: Mapping[str, Any] | None = None,
        labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.ray = require_ray()
        from ray.cluster_utils import Cluster

        head: dict[str, Any] = {"num_cpus": 1, "num_gpus": 0, "node_ip_address": LOOPBACK, "include_dashboard": False}
        if system_config:
            head["_system_config"] = dict(system_config)
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        self.specs = {node.name: node for node in nodes}
        # Ray node labels per node name, as `ray start --labels` sets them (e.g. `gpufleet.io/pool`).
        self.labels = {name: dict(given) for name, given in (labels or {}).items()}
        self._handles: dict[str, Any] = {}
        for node in nodes:
            self.add(node.name)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add(self, name: str) -> None:
        """Start the Ray node of `name` (again, after `kill`)."""
        spec = self.specs[name]
        self._handles[name] = self.cluster.add_node(
            num_cpus=1,
            num_gpus=len(spec.gpus),
            resources={f"{NODE_RESOURCE}{name}": 1},
            node_ip_address=LOOPBACK,
            labels=self.labels.get(name, {}),
        )

    def add_gpu_node(self, name: str, gpus: int, env: Mapping[str, str]) -> None:
        """Start a Ray node `name` that is not in the emulated inventory: its agent reads its GPUs through
        NVML, in an environment with `env` added (e.g. a library path)."""
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)  # the raylet, and so the agent it starts, inherit this process's environment
        try:
            self._handles[name] = self.cluster.add_node(
                num_cpus=1, num_gpus=gpus, resources={f"{NODE_RESOURCE}{name}": 1}, node_ip_address=LOOPBACK
            )
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def kill(self, name: str) -> None:
        """SIGKILL the raylet of `name` (its Ray processes die with it; processes of its own sessions, such as
        gpufleet's workers, keep running until the node's agent is back and kills them)."""
        self.cluster.remove_node(self._handles.pop(name), allow_graceful=False)

    def raylet_pid(self, name: str) -> int:
        return int(self._handles[name].all_processes["raylet"][0].process.pid)

    def shutdown(self) -> None:
        """Stop every node, the head last. Disconnects this process from Ray first if it is connected."""
        if self.ray.is_initialized():
            self.ray.shutdown()
        for name in list(self._handles):
            self.kill(name)
        self.cluster.shutdown()  # type: ignore[no-untyped-call]
