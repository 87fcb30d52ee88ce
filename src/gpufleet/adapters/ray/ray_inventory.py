"""`RayFleet`: the connection to a Ray cluster, its node agents, and the inventory source of the control plane.

Every alive Ray node that has GPUs, or that is named in an emulated inventory, is a gpufleet node. Its name
is the Ray resource `gpufleet-node:NAME` when the node has one (`ray start --resources
'{"gpufleet-node:gpu-a": 1}'`), else its host name. Its GPUs are what its agent reads through NVML on that node
(or its emulated spec, labelled emulated); rack, zone and pool come from the inventory file or the Ray node
labels `gpufleet.io/rack`, `gpufleet.io/zone` and `gpufleet.io/pool` (`on-demand`, `spot` or `reserved`: which
price its GPU-hours bill at, and whether its losses count as spot interruptions). A label wins over the file.

A thread scans `ray.nodes()` every `scan_s` (1 s): a node that joins gets its agent (a detached named actor
pinned to it) and is offered to the scheduler within seconds; a node Ray declares dead (or whose agent cannot
be reached or recreated) is marked unhealthy in the store first, then the backend is told, so its jobs are
LOST and retried elsewhere and its GPUs are not offered again. When the node comes back, its new agent first
kills whatever still runs there from before (a node that only lost its Ray daemon keeps its processes), and
only then is the node healthy again: no GPU is ever held by two jobs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.adapters.local.layout import safe_name
from gpufleet.adapters.ray import ray_token, require_ray
from gpufleet.adapters.ray.agent import AgentOptions, NodeAgent
from gpufleet.domain.cluster import NODE_POOLS, Node
from gpufleet.domain.errors import GpufleetError

if TYPE_CHECKING:
    from gpufleet.adapters.ray.backend import RayBackend

log = logging.getLogger(__name__)

NODE_RESOURCE = "gpufleet-node:"
RACK_LABEL = "gpufleet.io/rack"
ZONE_LABEL = "gpufleet.io/zone"
POOL_LABEL = "gpufleet.io/pool"
DEFAULT_NAMESPACE = "gpufleet"
AGENT_START_TIMEOUT_S = 120.0
# Ports a Ray cluster listens on whatever its nodes report: its defaults for the GCS, the dashboard, the Ray
# client server and its workers' range (10001-19999). (Its other defaults, 44217, 44227 and 52365, lie in the
# kernel's ephemeral range, which the firewall leaves to the jobs' own connections.)
RAY_DEFAULT_PORTS: tuple[tuple[int, int], ...] = ((6379, 6379), (8265, 8265), (10001, 19999))
NODE_PORT_FIELDS = (
    "NodeManagerPort",
    "ObjectManagerPort",
    "MetricsExportPort",
    "MetricsAgentPort",
    "DashboardAgentListenPort",
    "RuntimeEnvAgentPort",
)
INSECURE_NOTE = (
    "the Ray cluster runs WITHOUT authentication (--ray-insecure): any process that reaches one of its ports, "
    "on any node, can run code as the agents' user (root)"
)
ANSWER_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class _Agent:
    handle: Any
    ray_node_id: str
    address: str
    emulated: bool
    gpu_isolation: bool
    isolation: Any  # IsolationReport


@dataclass(frozen=True)
class _RayNode:
    name: str
    node_id: str
    address: str
    labels: Mapping[str, str]


def labelled(node: Node, labels: Mapping[str, str]) -> Node:
    """`node` with the rack, zone and pool its Ray node labels give. A pool label that is not a known pool is
    logged with its fix and ignored (the node keeps the inventory's pool): a typo must not take a node away."""
    pool = labels.get(POOL_LABEL) or node.pool
    if pool not in NODE_POOLS:
        log.error(
            "node %s: Ray label %s=%r is not a pool; it stays %s; to fix: label it one of %s",
            node.name,
            POOL_LABEL,
            pool,
            node.pool,
            ", ".join(NODE_POOLS),
        )
        pool = node.pool
    rack = labels.get(RACK_LABEL) or node.rack
    zone = labels.get(ZONE_LABEL) or node.zone
    if (rack, zone, pool) == (node.rack, node.zone, node.pool):
        return node
    return dataclasses.replace(node, rack=rack, zone=zone, pool=pool)


def check_reachable(address: str, timeout_s: float = 5.0) -> str:
    """The GCS address (HOST:PORT) of the Ray cluster at `address` (`auto`: the one this machine runs or
    `RAY_ADDRESS` names); raises a GpufleetError (with the fix) unless it answers within `timeout_s`."""
    given = address
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
        if not address:
            try:
                address = (Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster").read_text().strip()
            except OSError:
                raise GpufleetError(
                    "--ray auto: no Ray cluster runs on this machine",
                    "start one with `ray start --head` (or join one), or give its address as --ray HOST:PORT",
                ) from None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise GpufleetError(f"--ray {given}: {address!r} is not HOST:PORT", "give e.g. --ray 10.0.0.1:6379, or auto")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise GpufleetError(
            f"cannot reach the Ray cluster at {address}: {error.strerror or error}",
            "check the address (`ray status` on its head node prints it) and that this machine can reach it",
        ) from None
    return f"{host}:{port}"


def agent_namespace(root: str) -> str:
    """The Ray namespace of the agents that keep their files under `root`."""
    return f"{DEFAULT_NAMESPACE}-{hashlib.sha256(root.encode()).hexdigest()[:10]}"


class RayFleet:
    """The nodes of one Ray cluster and their agents. `scan` is called by the fleet's thread; the getters
    are called from the loop's and the API's threads (reads of dicts replaced whole, or under the lock)."""

    def __init__(
        self,
        address: str,
        options: AgentOptions,
        *,
        emulated: Sequence[Node] = (),
        namespace: str | None = None,
        scan_s: float = 1.0,
        token_file: Path | None = None,
        insecure: bool = False,
    ) -> None:
        """`namespace`: the Ray namespace of the agents; default `gpufleet-<hash of options.root>`, so a control
        plane restarted on the same data finds its agents again, and another one on the same cluster never
        takes them over. `token_file`: the cluster's Ray token (default: RAY_AUTH_TOKEN_PATH, else Ray's
        ~/.ray/auth_token); `insecure`: join a cluster without authentication (else refused)."""
        self.ray = require_ray()
        self.address_given = address
        self.options = options
        self.namespace = namespace or agent_namespace(options.root)
        self.scan_s = scan_s
        self.emulated_specs = {node.name: node for node in emulated}
        self._agents: dict[str, _Agent] = {}
        self._nodes: dict[str, Node] = {}  # every node ever seen, with its health
        self._unreachable: set[str] = set()
        self._lock = threading.RLock()
        self.backend: RayBackend | None = None
        self.on_nodes: Callable[[tuple[Node, ...]], None] = lambda _nodes: None  # the store's set_nodes
        self.wake: Callable[[], None] = lambda: None
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self.insecure = False  # joined a cluster without authentication (--ray-insecure)
        self.gcs_port = 0
        self._engine_ports: tuple[tuple[int, int], ...] = ()
        self._agent_ports: set[tuple[int, int]] = set()  # what each node's agent read of its raylet
        self._connect(address, token_file, insecure)

    # --- connection -------------------------------------------------------------------------------------

    def _connect(self, address: str, token_file: Path | None, insecure: bool) -> None:
        ray = self.ray
        resolved = check_reachable(address)  # Ray itself retries a wrong address for minutes
        self.gcs_port = int(resolved.rpartition(":")[2])
        if ray.is_initialized():
            return
        if ray_token.probe_auth(resolved):
            given = token_file or (Path(os.environ[ray_token.PATH_ENV]) if os.environ.get(ray_token.PATH_ENV) else None)
            path = given or Path.home() / ".ray" / "auth_token"
            ray_token.check_private(path)
            ray_token.use_token(path)
        elif insecure:
            self.insecure = True
            log.warning("%s", INSECURE_NOTE)
            ray_token.no_token()
        else:
            raise GpufleetError(
                f"the Ray cluster at {resolved} runs without authentication: any process that reaches one of its "
                "ports (a job included) can run code as root on its nodes",
                "restart it with token authentication (`RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=FILE ray start …` "
                "on every node, FILE a token of mode 0600) and pass --ray-token-file FILE; or pass --ray-insecure "
                "to run on it anyway",
            )
        try:
            ray.init(
                address=address,
                namespace=self.namespace,
                log_to_driver=False,
                logging_level=logging.WARNING,
                configure_logging=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise GpufleetError(
                f"cannot connect to the Ray cluster at {address!r}: {error}",
                "start it first (`ray start --head` on the head node), or give its address as --ray HOST:PORT",
            ) from None

    def close(self) -> None:
        """Stop scanning and disconnect; agents and their workers keep running (detached)."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.ray.is_initialized():
            self.ray.shutdown()

    # --- the inventory --------------------------------------------------------------------------------

    def first_scan(self, known: Sequence[Node], *, wait_for: int = 0, timeout_s: float = 60.0) -> tuple[Node, ...]:
        """The inventory at start: the nodes alive now (with their agents started or found again, not yet
        told what to keep: the loop's `adopt` does that), and every node of `known` (the store's) that is not,
        marked unhealthy. Waits until `wait_for` nodes are up, at most `timeout_s`."""
        with self._lock:
            for node in known:
                self._nodes[node.name] = dataclasses.replace(node, healthy=False)
        deadline = time.monotonic() + timeout_s
        while True:
            self.scan(adopt=False)
            if len(self._agents) >= wait_for or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return self.nodes()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpufleet-ray-fleet", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.wait(self.scan_s):
            try:
                self.scan(adopt=True)
            except Exception:  # the next scan tries again
                log.exception("Ray inventory scan failed")

    def scan(self, *, adopt: bool) -> bool:
        """One look at the cluster; True if any node came or went."""
        alive = self._ray_nodes()
        came: list[str] = []
        for name, info in alive.items():
            agent = self._agents.get(name)
            if agent is not None and agent.ray_node_id == info.node_id and not self._check_unreachable(name, agent):
                continue
            try:
                self._bring_up(info, adopt)
            except Exception as error:
                log.warning("node %s: its agent could not be started: %s", name, error)
                continue
            came.append(name)
        gone = [
            name
            for name, agent in self._agents.items()
            if name not in alive or alive[name].node_id != agent.ray_node_id
        ]
        with self._lock:
            unreachable = list(self._unreachable)
        gone += [name for name in unreachable if name in self._agents and name not in came and name not in gone]
        with self._lock:
            for name in gone:
                self._agents.pop(name, None)
                self._unreachable.discard(name)
                if name in self._nodes:
                    self._nodes[name] = dataclasses.replace(self._nodes[name], healthy=False)
            for name in came:
                self._unreachable.discard(name)
        if not came and not gone:
            return False
        self.on_nodes(self.nodes())  # the store first: the loop must read the node as down before its jobs
        for name in gone:
            log.warning("node %s lost: its jobs are retried elsewhere", name)
            if self.backend is not None:
                self.backend.node_lost(name)
        for name in came:
            log.info("node %s is up (%d GPUs)", name, len(self._nodes[name].gpus))
        self.wake()
        return True

    def _ray_nodes(self) -> dict[str, _RayNode]:
        found: dict[str, _RayNode] = {}
        entries = self.ray.nodes()
        self._note_ports(entries)
        for entry in entries:
            if not entry.get("Alive"):
                continue
            resources = entry.get("Resources") or {}
            name = next((k.removeprefix(NODE_RESOURCE) for k in resources if k.startswith(NODE_RESOURCE)), None)
            hostname = str(entry.get("NodeManagerHostname") or entry.get("NodeManagerAddress"))
            if name is None and (resources.get("GPU", 0) > 0 or hostname in self.emulated_specs):
                name = hostname if hostname not in found else f"{hostname}-{entry.get('NodeManagerAddress')}"
            if name is None:
                continue  # no GPUs: the head node of most clusters
            found[name] = _RayNode(
                name, str(entry["NodeID"]), str(entry.get("NodeManagerAddress")), dict(entry.get("Labels") or {})
            )
        return found

    # --- the engine firewall ------------------------------------------------------------------------------

    @property
    def engine_ports(self) -> tuple[tuple[int, int], ...]:
        """Every port of the cluster that jobs must not reach (`adapters/local/firewall.py`)."""
        return self._engine_ports

    def _note_ports(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """The cluster's ports from what Ray says of its nodes (dead ones too: they come back on the same
        ports), its GCS port, its default ports and those the agents were given; sent to every agent when
        they change."""
        ports = {(self.gcs_port, self.gcs_port), *RAY_DEFAULT_PORTS, *self.options.engine_ports, *self._agent_ports}
        for entry in entries:
            for key in NODE_PORT_FIELDS:
                port = entry.get(key)
                if isinstance(port, int) and 0 < port < 65536:
                    ports.add((port, port))
        merged = tuple(sorted(ports))
        if merged == self._engine_ports:
            return
        self._engine_ports = merged
        for _name, agent in list(self._agents.items()):
            agent.handle.set_engine_ports.remote(merged)

    def _check_unreachable(self, name: str, agent: _Agent) -> bool:
        """True if the agent of `name` was reported unreachable and does not answer now."""
        if name not in self._unreachable:
            return False
        try:
            self.ray.get(agent.handle.describe.remote(), timeout=ANSWER_TIMEOUT_S)
        except Exception:
            return True
        self._unreachable.discard(name)
        return False

    def _bring_up(self, info: _RayNode, adopt: bool) -> None:
        """Start (or find again) the agent of a node, learn its GPUs, and, for a node that joins while the
        control plane runs, have it kill what runs there that the backend does not run."""
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor_name = f"gpufleet-agent:{info.name}"
        handle = None
        try:
            handle = ray.get_actor(actor_name, namespace=self.namespace)
        except ValueError:
            handle = None
        described = None
        if handle is not None:
            try:
                described = ray.get(handle.describe.remote(), timeout=ANSWER_TIMEOUT_S)
            except Exception:
                described = None
            if described is None or described.get("ray_node_id") != info.node_id:
                ray.kill(handle, no_restart=True)
                handle, described = None, None
                time.sleep(0.2)  # its name is freed asynchronously
        if handle is None:
            agent_class = ray.remote(NodeAgent)
            handle = agent_class.options(
                name=actor_name,
                namespace=self.namespace,
                lifetime="detached",
                num_cpus=0,
                num_gpus=0,
                max_concurrency=8,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=info.node_id, soft=False),
            ).remote(info.name, info.address, self.options, self.emulated_specs.get(info.name), info.node_id)
            described = ray.get(handle.describe.remote(), timeout=AGENT_START_TIMEOUT_S)
        assert described is not None
        new = {(int(low), int(high)) for low, high in described.get("engine_ports") or ()} - self._agent_ports
        if new:  # another node's workers' range: every agent shuts jobs out of it too
            self._agent_ports |= new
            self._note_ports(self.ray.nodes())
        # An agent found again may have been given fewer ports by an earlier control plane.
        described = ray.get(handle.set_engine_ports.remote(self._engine_ports), timeout=ANSWER_TIMEOUT_S)
        node: Node = described["node"]
        node = labelled(dataclasses.replace(node, name=info.name, healthy=True), info.labels)
        if adopt:
            keep = self.backend.live_on(info.name) if self.backend is not None else []
            ray.get(handle.adopt.remote(keep), timeout=AGENT_START_TIMEOUT_S)
        agent = _Agent(
            handle,
            info.node_id,
            info.address,
            bool(described["emulated"]),
            bool(described["gpu_isolation"]),
            described["isolation"],
        )
        with self._lock:
            self._nodes[info.name] = node
            self._agents[info.name] = agent

    # --- what the backend, the API and telemetry ask ----------------------------------------------------

    def nodes(self) -> tuple[Node, ...]:
        with self._lock:
            return tuple(sorted(self._nodes.values(), key=lambda n: n.name))

    def forget(self, name: str) -> None:
        """An admin removed the node (`gpufleet nodes remove`): it leaves this fleet's list, so that the next
        change of the cluster does not write it back. Should it join Ray again, it comes back as a new node."""
        with self._lock:
            if name not in self._agents:
                self._nodes.pop(name, None)

    def nodes_by_name(self) -> dict[str, Node]:
        with self._lock:
            return dict(self._nodes)

    def agent(self, name: str) -> Any | None:
        """The agent of a node that is up (None: down or unknown)."""
        found = self._agents.get(name)
        return found.handle if found is not None else None

    def agent_or_raise(self, name: str) -> Any:
        found = self.agent(name)
        if found is None:
            raise GpufleetError(f"node {name} has no agent", "wait until the node is back")
        return found

    def agents(self) -> list[tuple[str, Any]]:
        return [(name, agent.handle) for name, agent in list(self._agents.items())]

    def alive(self) -> list[str]:
        return list(self._agents)

    def address(self, name: str) -> str:
        found = self._agents.get(name)
        return found.address if found is not None else ""

    def is_emulated(self, name: str) -> bool:
        found = self._agents.get(name)
        return found.emulated if found is not None else name in self.emulated_specs

    def all_emulated(self) -> bool:
        agents = list(self._agents.values())
        return (bool(agents) and all(a.emulated for a in agents)) or (not agents and bool(self.emulated_specs))

    def gpu_uuid(self, name: str, index: int) -> str:
        node = self._nodes.get(name)
        if node is None or not 0 <= index < len(node.gpus):
            raise GpufleetError(
                f"GPU {index} of node {name!r} is not in the inventory",
                "the placement and the node inventory disagree; restart the control plane",
            )
        return node.gpus[index].uuid

    def gpu_isolation(self) -> bool:
        agents = list(self._agents.values())
        return bool(agents) and all(a.gpu_isolation for a in agents)

    def isolation_report(self) -> Any | None:
        agents = list(self._agents.values())
        if not agents:
            return None
        report = agents[0].isolation
        if self.insecure:
            report = dataclasses.replace(report, notes=(INSECURE_NOTE, *report.notes))
        return report

    def report_unreachable(self, name: str) -> None:
        """A call to the agent of `name` failed as if it were gone: the next scan checks, and recreates it or
        declares the node lost."""
        with self._lock:
            self._unreachable.add(name)

    def node_of_path(self, path: Path) -> str | None:
        """The node whose agent folder holds `path` (`root/<node>/…`)."""
        try:
            first = Path(path).relative_to(self.options.root).parts[0]
        except (ValueError, IndexError):
            return None
        for name in self._nodes:
            if safe_name(name) == first:
                return name
        return None


__all__ = ["DEFAULT_NAMESPACE", "NODE_RESOURCE", "RayFleet", "agent_namespace"]
