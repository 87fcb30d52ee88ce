"""A real Kubernetes cluster on this machine's loopback for tests and benchmarks, built from Go modules.

    cluster = TestCluster(state_dir, build().bin_dir)   build(): Kubernetes v1.37.2, etcd, kwok from tools/k8s
    cluster.start(scheduler=False)   etcd, kube-apiserver (TLS, Node+RBAC), kube-controller-manager, kwok
    cluster.add_nodes(nodes)         gpufleet `Node`s as kwok Nodes: nvidia.com/gpu, GPU feature discovery labels
    cluster.stop()

kwok is the kubelet of the fake nodes. Its Stages (`kwok_stages.py`) give their pods a life: bound, a pod runs
(containers started and ready) until deleted; annotated `gpufleet.io/kwok-run-s: "S"` it succeeds S seconds after
its start; annotated `gpufleet.io/kwok-exit-code: "N"` (N != 0) it fails with exit code N (after S seconds, or at
once). A deleted pod (an eviction, a graceful delete) stays Terminating until its grace period ends. The API keeps
whole seconds, and so do these times: finishedAt - startTime is S, and a grace period may end up to 1 s early.
Command line: `python -m gpufleet.adapters.kubernetes.testenv build|start|stop|status` (scripts/k8s-testenv).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpufleet.adapters.kubernetes.kwok_stages import KWOK_STAGES
from gpufleet.domain.cluster import Node
from gpufleet.domain.errors import GpufleetError

RELEASE = "v1.37.2"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"  # kwok manages the nodes that carry it with the value "fake"
KWOK_USER = "gpufleet-testenv:kwok"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
SERVICE_CIDR = "10.0.0.0/24"
ISSUER = "https://kubernetes.default.svc.cluster.local"
MODULES = ("kubernetes", "etcd", "kwok")
# Binary -> (its module under tools/k8s, its Go package).
BINARIES = {
    name: ("kubernetes", f"k8s.io/kubernetes/cmd/{name}")
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
} | {"etcd": ("etcd", "go.etcd.io/etcd/server/v3"), "kwok": ("kwok", "sigs.k8s.io/kwok/cmd/kwok")}
_MAJOR, _MINOR, _PATCH = RELEASE[1:].split(".")
# A build from modules carries no version unless stamped: the API server's /version would say v0.0.0.
_STAMP = " ".join(
    f"-X {package}.{key}={value}"
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
    for key, value in (("gitVersion", RELEASE), ("gitMajor", _MAJOR), ("gitMinor", _MINOR), ("gitTreeState", "clean"))
)
LDFLAGS = {"kubernetes": f"-s -w {_STAMP}", "etcd": "-s -w", "kwok": "-s -w"}
# The controllers a real cluster runs (1.37 has no cloud ones left in it), less node IPAM: pods get no CIDRs here.
CONTROLLERS = "*,-node-ipam-controller"
Images = Mapping[str, Sequence[tuple[str, int]]]  # node name -> its images: (name, size in bytes) each


def tools_dir() -> Path:
    """The Go modules the cluster is built from: `$GPUFLEET_K8S_TOOLS`, or tools/k8s of this checkout."""
    if override := os.environ.get("GPUFLEET_K8S_TOOLS"):
        return Path(override)
    for parent in Path(__file__).resolve().parents:
        if (parent / "tools" / "k8s" / "kubernetes" / "go.mod").is_file():
            return parent / "tools" / "k8s"
    raise GpufleetError(
        f"no tools/k8s above {Path(__file__).parent} (an installed gpufleet has no Go modules)",
        "run from a checkout of gpufleet, or set GPUFLEET_K8S_TOOLS to its tools/k8s folder",
    )


def cache_dir() -> Path:
    """Where the binaries live: `$GPUFLEET_K8S_CACHE`, or a folder outside the checkout named after the modules'
    go.sum files, so that new versions build anew and going back finds the old build."""
    if override := os.environ.get("GPUFLEET_K8S_CACHE"):
        return Path(override)
    digest = hashlib.sha256(b"".join((tools_dir() / module / "go.sum").read_bytes() for module in MODULES))
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "gpufleet" / "k8s-testenv" / digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class BuildResult:
    bin_dir: Path
    seconds: float
    cached: bool


def _missing(folder: Path) -> list[str]:
    return [name for name in BINARIES if not os.access(folder / name, os.X_OK)]


def build(echo: Callable[[str], None] = print) -> BuildResult:
    """The six binaries, built where the cache lacks them (cold: minutes on two cores), at once when it has them
    all. Built in a folder beside the cache and renamed into it; a lock lets concurrent sessions share a build."""
    target = cache_dir()
    if not _missing(target):
        return BuildResult(target, 0.0, cached=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{target}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (missing := _missing(target)):
            return BuildResult(target, 0.0, cached=True)
        if (go := shutil.which("go") or _installed_go()) is None:
            raise GpufleetError(
                f"the Go toolchain (`go`) is not on PATH, and {target} lacks {', '.join(missing)}: the Kubernetes "
                "test cluster is built from the Go modules in tools/k8s",
                "install Go >= 1.26 and put `go` on PATH (the Go module proxy must be reachable for a first build), "
                "or point GPUFLEET_K8S_CACHE at a folder that holds the six binaries",
            )
        started = time.monotonic()
        partial = Path(tempfile.mkdtemp(prefix=f"{target.name}.partial-", dir=target.parent))
        try:
            for module in MODULES:
                if names := [name for name in missing if BINARIES[name][0] == module]:
                    _go_build(go, module, names, partial, echo)
            target.mkdir(parents=True, exist_ok=True)
            for name in missing:
                os.replace(partial / name, target / name)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        seconds = time.monotonic() - started
        echo(f"k8s testenv: cold build of {', '.join(missing)} took {seconds:.0f} s -> {target}")
        return BuildResult(target, seconds, cached=False)


def _installed_go() -> str | None:
    """Go where its installer puts it, for a shell whose PATH lacks it (a CI runner's)."""
    default = Path("/usr/local/go/bin/go")
    return str(default) if os.access(default, os.X_OK) else None


def _go_build(go: str, module: str, names: list[str], out: Path, echo: Callable[[str], None]) -> None:
    # One package builds to a file of our name (etcd's package would name it "v3"), several into a folder.
    output = str(out / names[0]) if len(names) == 1 else f"{out}{os.sep}"
    command = [go, "build", "-trimpath", "-buildvcs=false", f"-ldflags={LDFLAGS[module]}", "-o", output]
    command += [BINARIES[name][1] for name in names]
    folder, log, started = tools_dir() / module, out / f"build-{module}.log", time.monotonic()
    echo(f"k8s testenv: building {', '.join(names)} in {folder}")
    with log.open("wb") as sink:
        code = subprocess.call(command, cwd=folder, stdout=sink, stderr=subprocess.STDOUT)
    if code != 0:
        raise GpufleetError(
            f"`{' '.join(command)}` in {folder} failed with exit code {code}:\n{_tail(log, 30)}",
            f"fix the module's go.mod (every k8s.io module at one release: k8s.io/kubernetes {RELEASE} with its "
            f"staging modules at v0.{_MINOR}.{_PATCH}), then build again",
        )
    echo(f"k8s testenv: {module} built in {time.monotonic() - started:.0f} s")


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or f"({path} is empty)"
    except OSError:
        return f"({path} cannot be read)"


# --- certificates and kubeconfigs -------------------------------------------------------------------


def make_pki(folder: Path, certificates: Mapping[str, tuple[str, str, Sequence[str]]]) -> None:
    """A CA of its own (ca.crt, ca.key); for each `stem: (common name, organization, serving names and IPs)` a
    certificate it signs (stem.crt, stem.key), for serving when it has names, else for a client; a service-account
    key pair (sa.key, sa.pub). EC P-256 all: cheap enough to make anew at every start."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufleet-testenv-ca")])

    def sign(stem: str, subject: x509.Name, days: int, extensions: list[tuple[Any, bool]], ca: bool = False) -> None:
        key = ca_key if ca else ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder(issuer_name=ca_name, subject_name=subject, public_key=key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))  # tolerate a little clock skew
            .not_valid_after(now + datetime.timedelta(days=days))
        )
        extensions.append((x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False))
        extensions.append((x509.BasicConstraints(ca=ca, path_length=None), True))
        extensions.append((x509.KeyUsage(True, False, not ca, False, False, ca, ca, False, False), True))
        for extension, critical in extensions:
            cert = cert.add_extension(extension, critical=critical)
        _write_secret(folder / f"{stem}.key", key.private_bytes(pem, pkcs8, serialization.NoEncryption()))
        (folder / f"{stem}.crt").write_bytes(cert.sign(ca_key, hashes.SHA256()).public_bytes(pem))

    sign("ca", ca_name, 3650, [], ca=True)
    issuer = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    for stem, (cn, org, names) in certificates.items():
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org)] if org else []
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
        usage = ExtendedKeyUsageOID.SERVER_AUTH if names else ExtendedKeyUsageOID.CLIENT_AUTH
        extensions: list[tuple[Any, bool]] = [(issuer, False), (x509.ExtendedKeyUsage([usage]), False)]
        if names:
            sans = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n) for n in names]
            extensions.append((x509.SubjectAlternativeName(sans), False))
        sign(stem, x509.Name(subject), 365, extensions)
    sa_key = ec.generate_private_key(ec.SECP256R1())
    _write_secret(folder / "sa.key", sa_key.private_bytes(pem, pkcs8, serialization.NoEncryption()))
    (folder / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _write_secret(path: Path, data: bytes) -> None:
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
        handle.write(data)


def write_kubeconfig(path: Path, server: str, ca_file: Path, user: Mapping[str, str]) -> Path:
    import yaml

    config: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", "current-context": "testenv"}
    config["clusters"] = [{"name": "testenv", "cluster": {"server": server, "certificate-authority": str(ca_file)}}]
    config["users"] = [{"name": "testenv", "user": dict(user)}]
    config["contexts"] = [{"name": "testenv", "context": {"cluster": "testenv", "user": "testenv"}}]
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_secret(path, yaml.safe_dump(config, sort_keys=False).encode())
    return path


# --- nodes --------------------------------------------------------------------------------------------

# GPU feature discovery writes NVML's product name with "-" for spaces; NVML's names of the usual SKUs.
_PRODUCTS = {"A100": "NVIDIA-A100-SXM4-{gb}GB", "A800": "NVIDIA-A800-SXM4-{gb}GB", "V100": "Tesla-V100-SXM2-{gb}GB"}
_PRODUCTS |= {"P100": "Tesla-P100-PCIE-{gb}GB", "H100": "NVIDIA-H100-80GB-HBM3", "GH200": "NVIDIA-GH200-480GB"}
_PRODUCTS |= {"T4": "Tesla-T4", "P40": "Tesla-P40", "K80": "Tesla-K80"}


def gpu_product(model: str, memory: int) -> str:
    """The `nvidia.com/gpu.product` label of a gpufleet GPU model: "A100-80GB" -> "NVIDIA-A100-SXM4-80GB",
    "H100" -> "NVIDIA-H100-80GB-HBM3", "L4" -> "NVIDIA-L4"."""
    import re

    form = _PRODUCTS.get(re.sub(r"-\d+GB$", "", model.upper()), "NVIDIA-" + re.sub(r"[^A-Za-z0-9.]+", "-", model))
    return form.format(gb=round(memory / 2**30))[:63].rstrip("-.")  # a label value: 63 characters at most


def node_object(node: Node, images: Sequence[tuple[str, int]] = ()) -> dict[str, Any]:
    """The kwok Node of a gpufleet `Node`. A node of several GPU models has its first GPU's labels (GPU feature
    discovery labels one product a node); `gpufleet.io/nvlink-domain` is the number of the NVLink island that all
    its GPUs (two or more) share, and missing when they share none."""
    labels = {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    cpu = f"{node.cpu_milli}m" if node.cpu_milli % 1000 else str(node.cpu_milli // 1000)
    resources = {"cpu": cpu, "memory": str(node.memory), "pods": "110", "nvidia.com/gpu": str(len(node.gpus))}
    if node.gpus:
        first = node.gpus[0]
        labels["nvidia.com/gpu.present"] = "true"
        labels["nvidia.com/gpu.product"] = gpu_product(first.model, first.memory)
        labels["nvidia.com/gpu.memory"] = str(first.memory // 2**20)
        labels["nvidia.com/gpu.count"] = str(len(node.gpus))
        if len(node.gpus) > 1 and len({gpu.nvlink_group for gpu in node.gpus}) == 1:
            labels["gpufleet.io/nvlink-domain"] = str(first.nvlink_group)
    if node.zone:
        labels["topology.kubernetes.io/zone"] = node.zone
    if node.rack:
        labels["gpufleet.io/rack"] = node.rack
    # All of nodeInfo: the client checks a body against its model, which requires every field.
    info = dict.fromkeys(("bootID", "machineID", "systemUUID", "kubeProxyVersion", "kernelVersion"), "")
    info |= {"architecture": "amd64", "operatingSystem": "linux", "osImage": "kwok", "kubeletVersion": RELEASE}
    status: dict[str, Any] = {"capacity": resources, "allocatable": resources}
    status["nodeInfo"] = info | {"containerRuntimeVersion": "kwok"}
    if images:
        status["images"] = [{"names": [name], "sizeBytes": int(size)} for name, size in images]
    metadata = {"name": node.name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}}
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": {}, "status": status}


# --- the cluster --------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Process:
    pid: int
    log: str
    ticks: int  # its start, in clock ticks after boot (/proc/PID/stat): tells it from a later process of its PID
    popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        fields = stat[stat.rindex(")") + 2 :].split()
        return int(fields[19]) == self.ticks and fields[0] not in "ZX"


def _free_ports(count: int) -> list[int]:
    with contextlib.ExitStack() as stack:  # all held open at once: no port comes twice
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def _exists_ok(call: Callable[..., Any], *args: Any) -> None:
    """`call(*args)`, where a 409 (it exists already) is fine."""
    from kubernetes.client.exceptions import ApiException

    try:
        call(*args)
    except ApiException as error:
        if error.status != 409:
            raise


class TestCluster:
    """A real cluster on 127.0.0.1 (see the module docstring). Its state is in `state_dir`: pki/, kubeconfigs/,
    etcd/ (dropped at each start), logs/, and cluster.json, by which another process finds it (`attach`)."""

    __test__ = False  # not a test class, whatever its name says to pytest

    def __init__(self, state_dir: Path, bin_dir: Path, *, echo: Callable[[str], None] = print) -> None:
        self.state_dir, self.bin_dir = Path(state_dir).resolve(), Path(bin_dir).resolve()
        if any(c.isspace() for c in f"{self.state_dir}{self.bin_dir}"):
            raise GpufleetError(f"{self.state_dir} or {self.bin_dir} has a space", "use folders without spaces")
        self.echo = echo
        self.ports: dict[str, int] = {}
        self.processes: dict[str, _Process] = {}
        self.start_seconds = 0.0
        self._admin: Any = None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self._kubeconfig("admin")

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "pki" / "ca.crt"

    def _kubeconfig(self, name: str) -> Path:
        return self.state_dir / "kubeconfigs" / f"{name}.kubeconfig"

    @classmethod
    def attach(cls, state_dir: Path, *, echo: Callable[[str], None] = print) -> TestCluster:
        """The cluster that a (perhaps other) process started in `state_dir`."""
        try:
            state = json.loads((Path(state_dir) / "cluster.json").read_text())
        except (OSError, ValueError) as error:
            raise GpufleetError(
                f"no test cluster in {state_dir}: {error}", "start one: scripts/k8s-testenv start"
            ) from None
        cluster = cls(Path(state_dir), Path(state["bin_dir"]), echo=echo)
        cluster.ports = {k: int(v) for k, v in state["ports"].items()}
        cluster.processes = {k: _Process(**v) for k, v in state["processes"].items()}
        cluster.start_seconds = float(state.get("start_seconds", 0))
        return cluster

    def _save(self) -> None:
        state: dict[str, Any] = {"server": self.server, "bin_dir": str(self.bin_dir), "ports": self.ports}
        state["processes"] = {n: {"pid": p.pid, "log": p.log, "ticks": p.ticks} for n, p in self.processes.items()}
        state |= {"start_seconds": self.start_seconds, "admin_kubeconfig": str(self.admin_kubeconfig)}
        (self.state_dir / "cluster.json.tmp").write_text(json.dumps(state, indent=2))
        os.replace(self.state_dir / "cluster.json.tmp", self.state_dir / "cluster.json")

    def start(self, scheduler: bool = False) -> None:
        """A fresh cluster. A component that dies or does not get ready raises GpufleetError with its log's end,
        after what had started is stopped."""
        recorded = TestCluster.attach(self.state_dir) if (self.state_dir / "cluster.json").exists() else self
        if any(p.alive() for p in [*self.processes.values(), *recorded.processes.values()]):
            raise GpufleetError(f"a test cluster runs in {self.state_dir}", "stop it first: scripts/k8s-testenv stop")
        if missing := _missing(self.bin_dir):
            raise GpufleetError(f"{self.bin_dir} lacks {', '.join(missing)}", "build them: scripts/k8s-testenv build")
        started = time.monotonic()
        for stale in ("etcd", "pki", "kubeconfigs"):
            shutil.rmtree(self.state_dir / stale, ignore_errors=True)
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        names = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
        self.ports = dict(zip(names, _free_ports(len(names)), strict=True))
        try:
            self._write_credentials()
            self._start_etcd()
            self._start_apiserver()
            self._start_controller_manager()
            self._start_kwok()
            if scheduler:
                self.start_scheduler()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        self._save()
        rss = self.memory()
        self.echo(
            f"k8s testenv: Kubernetes {RELEASE} up at {self.server} in {self.start_seconds:.1f} s; resident MiB: "
            + ", ".join(f"{name} {size / 2**20:.0f}" for name, size in rss.items())
            + f" (total {sum(rss.values()) / 2**20:.0f})"
        )

    def stop(self) -> None:
        """Stops every component by its PID (SIGTERM, SIGKILL after 10 s); leaves logs/ for a look afterwards."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        for name in reversed(list(self.processes)):  # in the reverse order of their start
            self._stop_one(name)
        (self.state_dir / "cluster.json").unlink(missing_ok=True)

    def _stop_one(self, name: str) -> None:
        if (process := self.processes.pop(name, None)) is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if process.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, sig)
                deadline = time.monotonic() + 10
                while process.alive() and time.monotonic() < deadline:
                    time.sleep(0.05)
        if process.popen is not None:
            process.popen.wait(timeout=10)

    def start_scheduler(self, qps: float | None = None) -> None:
        """kube-scheduler: the default scheduler and profile, with its own client certificate and no leader election.
        `qps`: its client's rate limit to the API server (None: its default, 50 requests/s with bursts of 100)."""
        kubeconfig, pki, port = self._kubeconfig("kube-scheduler"), self.state_dir / "pki", self.ports["kube-scheduler"]
        config = self.state_dir / "kube-scheduler.yaml"
        connection = f"  kubeconfig: {kubeconfig}\n"
        if qps is not None:
            connection += f"  qps: {qps:g}\n  burst: {max(1, int(qps * 2))}\n"
        config.write_text(
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
            f"clientConnection:\n{connection}leaderElection:\n  leaderElect: false\n"
        )
        self._spawn(
            "kube-scheduler",
            f"--config={config} --authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig} --bind-address=127.0.0.1",
            f"--secure-port={port} --tls-cert-file={pki / 'serving.crt'} --tls-private-key-file={pki / 'serving.key'}",
        )
        self._wait_healthy("kube-scheduler", f"https://127.0.0.1:{port}/healthz", 60)

    def stop_scheduler(self) -> None:
        self._stop_one("kube-scheduler")
        if self.processes:
            self._save()

    def _write_credentials(self) -> None:
        clients = {"admin": ("gpufleet-testenv-admin", "system:masters"), "kwok": (KWOK_USER, "")}
        clients |= {name: (f"system:{name}", "") for name in ("kube-controller-manager", "kube-scheduler")}
        apiserver: tuple[str, ...] = ("127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default")
        apiserver += ("kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
        certificates: dict[str, tuple[str, str, tuple[str, ...]]] = {n: (cn, o, ()) for n, (cn, o) in clients.items()}
        certificates["apiserver"] = ("kube-apiserver", "", apiserver)
        certificates["serving"] = ("testenv-component", "", ("127.0.0.1", "localhost"))  # controller-manager, scheduler
        pki = self.state_dir / "pki"
        make_pki(pki, certificates)
        for name in clients:
            user = {"client-certificate": str(pki / f"{name}.crt"), "client-key": str(pki / f"{name}.key")}
            write_kubeconfig(self._kubeconfig(name), self.server, self.ca_file, user)

    def _spawn(self, name: str, *flags: str) -> None:
        """Runs a component, its output in logs/NAME.log; each of `flags` may hold several, split at spaces."""
        log = self.state_dir / "logs" / f"{name}.log"
        argv = [str(self.bin_dir / name), *(part for flag in flags for part in flag.split())]
        with log.open("ab") as sink:  # in a session of its own: a Ctrl-C meant for the tests does not stop it
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, start_new_session=True)
        stat = Path(f"/proc/{popen.pid}/stat").read_text()
        self.processes[name] = _Process(popen.pid, str(log), int(stat[stat.rindex(")") + 2 :].split()[19]), popen)
        self._save()  # at once: should this process die before the start ends, `stop` still finds every PID

    def _wait(self, what: str, ready: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            for name, process in self.processes.items():
                if not process.alive():
                    code = process.popen.returncode if process.popen is not None else "?"
                    end = f"the end of {process.log}:\n{_tail(Path(process.log), 25)}"
                    fix = "read its log; a port another program took, or a flag this release lacks, are usual causes"
                    raise GpufleetError(f"{name} exited (code {code}) while waiting for {what}; {end}", fix)
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.log}\n{_tail(Path(p.log), 10)}" for p in self.processes.values())
                fix = "read the logs; on a loaded machine, give it longer"
                raise GpufleetError(f"{what}: not within {timeout_s:g} s; the ends of the logs:\n{logs}", fix)
            time.sleep(0.2)

    def _wait_healthy(self, name: str, url: str, timeout_s: float, client_cert: bool = False) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_file)) if url.startswith("https") else None
        if context is not None and client_cert:
            context.load_cert_chain(self.state_dir / "pki" / "admin.crt", self.state_dir / "pki" / "admin.key")

        def ok() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as answer:
                    return bool(answer.status == 200)
            except OSError:  # refused, reset, or an HTTP error status (urllib's errors are OSErrors)
                return False

        self._wait(f"{name} to answer {url}", ok, timeout_s)

    def _start_etcd(self) -> None:
        client, peer = f"http://127.0.0.1:{self.ports['etcd']}", f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            f"--name=testenv --data-dir={self.state_dir / 'etcd'} --log-level=warn",
            f"--listen-client-urls={client} --advertise-client-urls={client}",
            f"--listen-peer-urls={peer} --initial-advertise-peer-urls={peer} --initial-cluster=testenv={peer}",
            "--unsafe-no-fsync",  # a throw-away cluster: durability would only slow the tests down
        )
        self._wait_healthy("etcd", f"{client}/health", 30)

    def _start_apiserver(self) -> None:
        pki = self.state_dir / "pki"
        self._spawn(
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            f"--bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port={self.ports['kube-apiserver']}",
            # The endpoint reconciler refuses a loopback address: the `kubernetes` Service has no endpoints here.
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki / 'apiserver.crt'} --tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={self.ca_file} --authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction --allow-privileged=true --profiling=false",
            f"--service-account-issuer={ISSUER} --service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'} --service-cluster-ip-range={SERVICE_CIDR}",
        )
        self._wait_healthy("kube-apiserver", f"{self.server}/readyz", 120, client_cert=True)
        # As kubeadm would: kwok, the kubelet of every fake node, may act on all nodes and pods (the Node
        # authorizer admits one kubelet a node name, not one for many).
        rbac = "rbac.authorization.k8s.io"
        binding = {"metadata": {"name": KWOK_USER}, "subjects": [{"apiGroup": rbac, "kind": "User", "name": KWOK_USER}]}
        binding["roleRef"] = {"apiGroup": rbac, "kind": "ClusterRole", "name": "cluster-admin"}
        self._api("RbacAuthorizationV1Api").create_cluster_role_binding(binding)

    def _start_controller_manager(self) -> None:
        pki, kubeconfig = self.state_dir / "pki", self._kubeconfig("kube-controller-manager")
        port = self.ports["kube-controller-manager"]
        self._spawn(
            "kube-controller-manager",
            f"--kubeconfig={kubeconfig} --authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig} --leader-elect=false --controllers={CONTROLLERS}",
            f"--use-service-account-credentials=true --root-ca-file={self.ca_file}",
            f"--service-account-private-key-file={pki / 'sa.key'} --service-cluster-ip-range={SERVICE_CIDR}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'} --cluster-signing-key-file={pki / 'ca.key'}",
            f"--bind-address=127.0.0.1 --secure-port={port}",
            f"--tls-cert-file={pki / 'serving.crt'} --tls-private-key-file={pki / 'serving.key'}",
        )
        self._wait_healthy("kube-controller-manager", f"https://127.0.0.1:{port}/healthz", 60)
        accounts = self._api("CoreV1Api").list_namespaced_service_account
        # The default ServiceAccount is the service-account controller at work: the controllers have started.
        self._wait("the default ServiceAccount", lambda: bool(accounts("default").items), 60)

    def _start_kwok(self) -> None:
        stages = self.state_dir / "kwok-stages.yaml"
        stages.write_text(KWOK_STAGES)
        self._spawn(
            "kwok",
            f"--kubeconfig={self._kubeconfig('kwok')} --config={stages}",
            f"--manage-all-nodes=false --manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            "--node-lease-duration-seconds=40 --cidr=10.244.0.0/16 --node-ip=10.250.0.1",
            f"--server-address=127.0.0.1:{self.ports['kwok']}",
        )
        self._wait_healthy("kwok", f"http://127.0.0.1:{self.ports['kwok']}/healthz", 60)

    def memory(self) -> dict[str, int]:
        """Resident memory (bytes) of each running component."""
        rss: dict[str, int] = {}
        for name, process in self.processes.items():
            with contextlib.suppress(OSError, ValueError, IndexError):
                status = Path(f"/proc/{process.pid}/status").read_text()
                rss[name] = int(status.split("VmRSS:")[1].split()[0]) * 1024
        return rss

    # --- clients
    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A `kubernetes.client.ApiClient` with the credentials of `kubeconfig` (default: the admin's); close it."""
        import kubernetes

        config: Any = kubernetes.config
        return config.new_client_from_config(config_file=str(kubeconfig or self.admin_kubeconfig))

    def _api(self, group: str) -> Any:
        """An API group ("CoreV1Api") on the one admin client, kept until stop."""
        from kubernetes import client

        if self._admin is None:
            self._admin = self.api_client()
        return getattr(client, group)(self._admin)

    def kubeconfig_for_token(self, name: str, token: str) -> Path:
        """A kubeconfig (kubeconfigs/NAME.kubeconfig) that authenticates with a bearer token."""
        return write_kubeconfig(self._kubeconfig(name), self.server, self.ca_file, {"token": token})

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token of ServiceAccount `namespace/name` by TokenRequest; the account is made if missing."""
        core = self._api("CoreV1Api")
        _exists_ok(core.create_namespaced_service_account, namespace, {"metadata": {"name": name}})
        answer = core.create_namespaced_service_account_token(name, namespace, {"spec": {"expirationSeconds": seconds}})
        return str(answer.status.token)

    def ensure_namespace(self, name: str) -> None:
        _exists_ok(self._api("CoreV1Api").create_namespace, {"metadata": {"name": name}})

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Our kubectl, of the server's release, as the admin."""
        command = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.admin_kubeconfig}", *args]
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=120)

    # --- nodes and pods
    def add_nodes(self, nodes: Iterable[Node], images: Images | None = None, timeout_s: float = 60) -> None:
        """A kwok Node for each gpufleet `Node` (`node_object`), with `images[name]` ((image, bytes) each) as its
        status.images (kwok's status patches keep them); returns once all are Ready and rid of the not-ready taint
        (the node lifecycle controller takes it off), so that a scheduler sees them as it would a kubelet's."""
        from gpufleet.adapters.kubernetes.kube_api import KubeApi, KubeApiError

        api = KubeApi(self.admin_kubeconfig)
        wanted = {node.name: node_object(node, (images or {}).get(node.name, ())) for node in nodes}

        def create(body: dict[str, Any]) -> None:
            try:
                api.create("/api/v1/nodes", body)
            except KubeApiError as error:
                if error.status != 409:
                    raise

        # Raw JSON and many at once: a thousand nodes through the typed client took minutes.
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(create, wanted.values()))

        def ready() -> bool:
            listed = [n for n in api.list("/api/v1/nodes")["items"] if n["metadata"]["name"] in wanted]
            for node in listed:
                conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions") or ()}
                taints = node.get("spec", {}).get("taints") or ()
                if conditions.get("Ready") != "True" or any(t["key"] == NOT_READY_TAINT for t in taints):
                    return False
            return len(listed) == len(wanted)

        try:
            self._wait(f"{len(wanted)} kwok nodes to be Ready and untainted", ready, timeout_s)
        finally:
            api.close()

    def bind_pod(self, namespace: str, name: str, node: str) -> None:
        """Binds a pod to a node through the pods/binding subresource, as a scheduler does."""
        body = {"metadata": {"name": name}, "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        # The client cannot read its own V1Binding answer back (it finds `target` missing): read none.
        self._api("CoreV1Api").create_namespaced_binding(namespace, body, _preload_content=False)

    def delete_all_pods(self, timeout_s: float = 60) -> None:
        """Deletes the pods of every namespace but kube-system at once (no grace period) and waits until they are
        gone: between a kube-scheduler run and a gpufleet run over the same pods, say. Workload controllers
        (Jobs, ReplicaSets) would make new pods: delete those first."""
        core = self._api("CoreV1Api")
        for namespace in core.list_namespace().items:
            if namespace.metadata.name != "kube-system":
                core.delete_collection_namespaced_pod(namespace.metadata.name, grace_period_seconds=0)
        pods = core.list_pod_for_all_namespaces
        self._wait("the pods to go", lambda: {p.metadata.namespace for p in pods().items} <= {"kube-system"}, timeout_s)

    reset = delete_all_pods


# --- command line ---------------------------------------------------------------------------------------


def default_state_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "gpufleet-k8s-testenv" if runtime else Path("/tmp/gpufleet-k8s-testenv")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="k8s-testenv", description="A real local Kubernetes test cluster.")
    parser.add_argument("command", choices=("build", "start", "stop", "status"))
    parser.add_argument("--state-dir", type=Path, default=default_state_dir(), help="default: %(default)s")
    parser.add_argument("--scheduler", action="store_true", help="start: run kube-scheduler too")
    parser.add_argument("--inventory", type=Path, help="start: add the nodes of this gpufleet inventory YAML")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            result = build()
            print(f"{result.bin_dir}{' (cached)' if result.cached else ''}")
        elif args.command == "start":
            cluster = TestCluster(args.state_dir, build().bin_dir)
            cluster.start(scheduler=args.scheduler)
            if args.inventory is not None:
                from gpufleet.adapters.inventory.emulated_inventory import load_inventory_yaml

                cluster.add_nodes(load_inventory_yaml(args.inventory))
            for process in cluster.processes.values():
                process.popen = None  # they outlive us: no "still running" warnings from Popen
            print(f"export KUBECONFIG={cluster.admin_kubeconfig}")
        elif not (args.state_dir / "cluster.json").exists():
            print(f"no test cluster runs in {args.state_dir}")
            return 1 if args.command == "status" else 0
        elif args.command == "stop":
            TestCluster.attach(args.state_dir).stop()
            print(f"stopped the test cluster in {args.state_dir} (its logs: {args.state_dir / 'logs'})")
        else:
            cluster = TestCluster.attach(args.state_dir)
            print(f"{cluster.server} KUBECONFIG={cluster.admin_kubeconfig} (started in {cluster.start_seconds:.1f} s)")
            rss = cluster.memory()
            for name, process in cluster.processes.items():
                state = "running" if process.alive() else "DEAD"
                print(f"  {name:<24} pid {process.pid:<8} {state:<8} {rss.get(name, 0) / 2**20:6.0f} MiB")
            return 0 if all(p.alive() for p in cluster.processes.values()) else 1
    except GpufleetError as error:
        print(f"k8s-testenv: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
