"""A Ray cluster of emulated GPU nodes on this machine: a head without GPUs and one Ray node per node of an
emulated inventory, each carrying the resource `gpufleet-node:NAME` (its name in gpufleet) and as many Ray
GPUs as its spec has. `gpufleet up --ray local --inventory fleet.yaml` runs one to try multi-node scheduling on
one machine; the tests and `gpufleet bench ray` use the same class. Every node is a real raylet process: a
node can be killed (`kill`, SIGKILL to its raylet) and brought back (`add`).

Hardened as a real cluster should be:

- Ray's token authentication is on (`ray_token.py`): the token is a 0600 file in `state_dir`, found by Ray
  through `RAY_AUTH_TOKEN_PATH`. No dashboard (`dashboard=True` asks for one) and no job-submission server.
- Every port is pinned: each node takes a block of `BLOCK` ports between `PORT_LOW` and `PORT_HIGH` (below
  the MASTER_PORT range gpufleet hands to jobs, 29500-30499, and Linux's ephemeral ports, 32768-60999), its
  Ray workers' ports included, so `engine_ports` can shut jobs out of all of them (`firewall.py`).
- Its daemons run in sessions of their own (`node_launch.py`) and outlive the process that started them: a
  `kill -9` of `gpufleet up --ray local` leaves the cluster and its jobs running, and the next start on the
  same data folder finds it through `state_dir/cluster.json` (`LocalRayCluster.reuse`) and adopts the jobs.
  `shutdown` stops it by PID (never `ray stop`, which stops every Ray cluster of the user on the machine).

Everything binds to 127.0.0.1 (by default Ray binds to the machine's external address, which a sandbox or a
laptop on the move may not route).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.adapters.ray import ray_token
from gpufleet.adapters.ray.ray_inventory import NODE_RESOURCE
from gpufleet.domain.cluster import Node
from gpufleet.domain.errors import GpufleetError

LOOPBACK = "127.0.0.1"
PORT_LOW, PORT_HIGH = 11000, 28999
BLOCK = 64  # ports per node
WORKER_OFFSET = 16  # a node's Ray workers (and drivers) take the ports from here to the block's end
# The fixed ports of a node's block, by offset (the head's GCS and metrics too).
NODE_PORTS = {
    "node_manager_port": 0,
    "object_manager_port": 1,
    "metrics_export_port": 2,
    "dashboard_agent_listen_port": 3,
    "metrics_agent_port": 4,  # the dashboard agent's gRPC port
    "runtime_env_agent_port": 5,
}
GCS_OFFSET, DASHBOARD_METRICS_OFFSET, DASHBOARD_OFFSET = 6, 7, 8
LAUNCH_TIMEOUT_S = 120.0
STATE_FILE = "cluster.json"
TOKEN_FILE = "auth_token"
HEAD = "__head__"
OBJECT_STORE_BYTES = 150 * 1024 * 1024


def _lease_dir() -> Path:
    folder = Path(tempfile.gettempdir()) / "gpufleet-ray-ports"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (its parent gone, nobody reaping yet) is not running
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _lease_block(owner: str) -> int:
    """The first port of a free block, leased to `owner` (a lease whose processes are all gone is free)."""
    folder = _lease_dir()
    for start in range(PORT_LOW, PORT_HIGH - BLOCK + 2, BLOCK):
        path = folder / str(start)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if not _stale(path):
                continue
            path.unlink(missing_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
        with os.fdopen(fd, "w") as lease:
            json.dump({"owner": owner, "pids": []}, lease)
        fixed = [start + offset for offset in range(WORKER_OFFSET)]
        if all(_bindable(port) for port in fixed):
            return start
        path.unlink(missing_ok=True)
    raise GpufleetError(
        f"no free block of {BLOCK} ports between {PORT_LOW} and {PORT_HIGH} for another local Ray node",
        "stop local Ray clusters no longer needed (their PIDs are in their data folder's ray-local/cluster.json)",
    )


def _stale(path: Path) -> bool:
    try:
        lease = json.loads(path.read_text())
        age = time.time() - path.stat().st_mtime
    except (OSError, ValueError):
        return True
    pids = [int(p) for p in lease.get("pids") or ()]
    if not pids:
        return age > LAUNCH_TIMEOUT_S  # a node still starting
    return not any(_alive(p) for p in pids)


def _write_lease(start: int, owner: str, pids: Sequence[int]) -> None:
    (_lease_dir() / str(start)).write_text(json.dumps({"owner": owner, "pids": list(pids)}))


def _release(start: int, owner: str) -> None:
    path = _lease_dir() / str(start)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("owner") == owner:
            path.unlink()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@dataclass
class _NodeRecord:
    block: int
    pids: dict[str, list[int]] = field(default_factory=dict)  # process kind -> PIDs (raylet, gcs_server, …)

    @property
    def raylet(self) -> int:
        return self.pids["raylet"][0]

    def every_pid(self) -> list[int]:
        return [pid for pids in self.pids.values() for pid in pids]


class LocalRayCluster:
    def __init__(
        self,
        nodes: Sequence[Node],
        *,
        system_config: Mapping[str, Any] | None = None,
        labels: Mapping[str, Mapping[str, str]] | None = None,
        state_dir: Path | None = None,
        dashboard: bool = False,
    ) -> None:
        """Start a new cluster. `state_dir`: where its token and its record (address, PIDs, ports) go, private
        to this user (default: a new temporary folder); `dashboard`: also run Ray's dashboard (on the head's
        block, port +8), which only the admin asks for."""
        self.specs = {node.name: node for node in nodes}
        # Ray node labels per node name, as `ray start --labels` sets them (e.g. `gpufleet.io/pool`).
        self.labels = {name: dict(given) for name, given in (labels or {}).items()}
        self.system_config = dict(system_config or {})
        self.dashboard = dashboard
        self._own_state = state_dir is None  # a temporary folder of its own: removed with the cluster
        self.state_dir = state_dir or Path(tempfile.mkdtemp(prefix="gpufleet-ray-"))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)
        self.owner = str(self.state_dir.absolute())
        self.token_path = ray_token.new_token_file(self.state_dir / TOKEN_FILE)
        # Ray's unix sockets live under its temp folder and must stay under 108 bytes: a short one of our own.
        self.temp_dir = tempfile.mkdtemp(prefix="gfray-")
        self._nodes: dict[str, _NodeRecord] = {}
        self.gcs_address = ""
        self.reused = False
        try:
            self._start_head()
            self._start_many(list(self.specs))
        except BaseException:
            self.shutdown()
            raise

    @classmethod
    def reuse(
        cls, state_dir: Path, nodes: Sequence[Node], *, labels: Mapping[str, Mapping[str, str]] | None = None
    ) -> LocalRayCluster | None:
        """The cluster an earlier `LocalRayCluster(state_dir=state_dir)` started, if its head still runs (nodes
        of `nodes` found dead are started again, nodes no longer in `nodes` stopped); None if there is none."""
        try:
            record = json.loads((state_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        self = cls.__new__(cls)
        self.specs = {node.name: node for node in nodes}
        self.labels = {name: dict(given) for name, given in (labels or {}).items()}
        self.system_config = dict(record.get("system_config") or {})
        self.dashboard = bool(record.get("dashboard"))
        self.state_dir, self.owner = state_dir, str(state_dir.absolute())
        self.token_path = Path(record["token_path"])
        self.temp_dir = record["temp_dir"]
        self.gcs_address = record["address"]
        self._nodes = {name: _NodeRecord(int(n["block"]), n["pids"]) for name, n in record["nodes"].items()}
        self.reused = True
        self._own_state = False
        head = self._nodes.get(HEAD)
        if head is None or not all(_alive(pid) for pid in head.every_pid()) or not self.token_path.exists():
            self.shutdown()
            return None
        for name in [n for n in self._nodes if n != HEAD and n not in self.specs]:
            self.kill(name)
        dead = [n for n in self.specs if n not in self._nodes or not _alive(self._nodes[n].raylet)]
        for name in dead:
            if name in self._nodes:
                self.kill(name)
        self._start_many(dead)
        return self

    # --- what others read ------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self.gcs_address

    def engine_ports(self) -> list[tuple[int, int]]:
        """Every port this cluster's processes listen on, by node block (workers' ports included)."""
        return [(n.block, n.block + BLOCK - 1) for n in self._nodes.values()]

    def node_ports(self, name: str) -> dict[str, int]:
        """The fixed ports of node `name` (`HEAD` for the head), by Ray's name for them."""
        block = self._nodes[name].block
        ports = {kind: block + offset for kind, offset in NODE_PORTS.items()}
        ports["min_worker_port"], ports["max_worker_port"] = block + WORKER_OFFSET, block + BLOCK - 1
        if name == HEAD:
            ports["gcs_server_port"] = block + GCS_OFFSET
        return ports

    def pids(self) -> dict[str, list[int]]:
        return {name: n.every_pid() for name, n in self._nodes.items()}

    # --- nodes -------------------------------------------------------------------------------------------

    def add(self, name: str) -> None:
        """Start the Ray node of `name` (again, after `kill`)."""
        self._start_many([name])

    def add_gpu_node(self, name: str, gpus: int, env: Mapping[str, str]) -> None:
        """Start a Ray node `name` that is not in the emulated inventory: its agent reads its GPUs through
        NVML, in an environment with `env` added (e.g. a library path)."""
        block = _lease_block(self.owner)
        args = self._node_args(block, num_gpus=gpus, resources={f"{NODE_RESOURCE}{name}": 1})
        self._record(name, block, self._wait(self._spawn(args, env)))

    def kill(self, name: str) -> None:
        """SIGKILL the raylet of `name` and the daemons it started (its Ray processes die with it; processes of
        their own sessions, such as gpufleet's workers, keep running until the node's agent is back and kills
        them)."""
        node = self._nodes.pop(name)
        raylet = node.pids.get("raylet", [None])[0]
        doomed = [raylet] if raylet is not None else []
        if raylet is not None and _alive(raylet):
            doomed += _children(raylet)  # its dashboard and runtime-env agents, its idle Ray workers
        doomed += [pid for pid in node.every_pid() if pid != raylet]
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._wait_gone(doomed)
        _release(node.block, self.owner)
        self._save()

    def shutdown(self) -> None:
        """Stop every node, the head last. Disconnects this process from Ray first if it is connected."""
        if "ray" in sys.modules:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        for name in [n for n in self._nodes if n != HEAD]:
            self.kill(name)
        if HEAD in self._nodes:
            self.kill(HEAD)
        with contextlib.suppress(OSError):
            (self.state_dir / STATE_FILE).unlink()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    # --- starting ----------------------------------------------------------------------------------------

    def _node_args(self, block: int, *, num_gpus: int, resources: Mapping[str, float]) -> dict[str, Any]:
        args: dict[str, Any] = {name: block + offset for name, offset in NODE_PORTS.items()}
        args.update(
            node_ip_address=LOOPBACK,
            num_cpus=1,
            num_gpus=num_gpus,
            resources=dict(resources),
            min_worker_port=block + WORKER_OFFSET,
            max_worker_port=block + BLOCK - 1,
            include_log_monitor=False,
            temp_dir=self.temp_dir,
            object_store_memory=OBJECT_STORE_BYTES,
            # Named here: Ray picks a free name per process, and nodes starting side by side would pick the same.
            raylet_socket_name=f"{self.temp_dir}/raylet.{block}",
            plasma_store_socket_name=f"{self.temp_dir}/plasma.{block}",
        )
        if self.gcs_address:
            args["gcs_address"] = self.gcs_address
        return args

    def _start_head(self) -> None:
        block = _lease_block(self.owner)
        args = self._node_args(block, num_gpus=0, resources={})
        args.update(head=True, gcs_server_port=block + GCS_OFFSET, no_monitor=True, include_dashboard=self.dashboard)
        if self.dashboard:
            args.update(dashboard_host=LOOPBACK, dashboard_port=block + DASHBOARD_OFFSET)
        if self.system_config:
            args["_system_config"] = self.system_config
        env = {"DASHBOARD_METRIC_PORT": str(block + DASHBOARD_METRICS_OFFSET)}
        try:
            answer = self._wait(self._spawn(args, env))
        except BaseException:
            _release(block, self.owner)
            raise
        self.gcs_address = answer["address"]
        self._record(HEAD, block, answer)

    def _start_many(self, names: Sequence[str]) -> None:
        """Start the nodes `names` side by side (each its own launcher)."""
        started: list[tuple[str, int, subprocess.Popen[str]]] = []
        try:
            for name in names:
                spec = self.specs[name]
                block = _lease_block(self.owner)
                args = self._node_args(block, num_gpus=len(spec.gpus), resources={f"{NODE_RESOURCE}{name}": 1})
                args["labels"] = self.labels.get(name, {})
                started.append((name, block, self._spawn(args, {})))
            for name, block, process in started:
                self._record(name, block, self._wait(process))
        finally:
            for name, block, process in started:
                if name not in self._nodes:
                    process.kill()
                    _release(block, self.owner)

    def _spawn(self, args: Mapping[str, Any], env: Mapping[str, str]) -> subprocess.Popen[str]:
        environment = {**os.environ, **env, **ray_token.env_for(self.token_path)}
        environment["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # several nodes on one machine, on 127.0.0.1
        # A busy machine starting several nodes at once may take longer than Ray's 30 s to register one.
        environment.setdefault("RAY_raylet_start_wait_time_s", str(int(LAUNCH_TIMEOUT_S)))
        for leaked in (ray_token.TOKEN_ENV, "RAY_ADDRESS"):
            environment.pop(leaked, None)
        process = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.adapters.ray.node_launch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
            start_new_session=True,  # its daemons are not in the process group of whoever started them
        )
        assert process.stdin is not None
        process.stdin.write(json.dumps(dict(args)))
        process.stdin.close()
        process.stdin = None  # written in full: `communicate` has nothing more to send
        return process

    def _wait(self, process: subprocess.Popen[str]) -> dict[str, Any]:
        try:
            out, err = process.communicate(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            raise GpufleetError(
                f"a local Ray node did not start in {LAUNCH_TIMEOUT_S:g} s", "see the Ray logs under /tmp/gfray-*"
            ) from None
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if process.returncode != 0 or not lines:
            raise GpufleetError(
                f"a local Ray node did not start: {(err or out).strip()[-1500:]}", "see the Ray logs under /tmp/gfray-*"
            )
        answer: dict[str, Any] = json.loads(lines[-1])
        return answer

    def _record(self, name: str, block: int, answer: Mapping[str, Any]) -> None:
        node = _NodeRecord(block, {kind: [int(p) for p in pids] for kind, pids in answer["pids"].items()})
        self._nodes[name] = node
        _write_lease(block, self.owner, node.every_pid())
        self._save()

    def _save(self) -> None:
        record = {
            "address": self.gcs_address,
            "token_path": str(self.token_path),
            "temp_dir": self.temp_dir,
            "system_config": self.system_config,
            "dashboard": self.dashboard,
            "nodes": {name: {"block": n.block, "pids": n.pids} for name, n in self._nodes.items()},
        }
        path = self.state_dir / STATE_FILE
        fresh = path.with_suffix(".tmp")
        fresh.write_text(json.dumps(record, indent=1))
        fresh.chmod(0o600)
        fresh.replace(path)

    @staticmethod
    def _wait_gone(pids: Sequence[int], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
