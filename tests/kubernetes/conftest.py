"""One real Kubernetes cluster for the session (gpufleet.adapters.kubernetes.testenv): etcd, kube-apiserver with
TLS and Node+RBAC authorization, kube-controller-manager and kwok as the kubelet of fake nodes, all Kubernetes
v1.37.2 binaries built from tools/k8s (a cold build takes minutes; later sessions find them in the cache).

Every test in this folder is marked `kubernetes` (`pytest -m "not kubernetes"` leaves them out). Without the Go
toolchain and without cached binaries the fixture fails, not skips: CI must run these tests.
Every wait has a timeout: a test over its deadline fails instead of hanging the run.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.adapters.kubernetes.kube_api import KubeApi
from gpufleet.domain.errors import GpufleetError
from tests.kit.deadline import within
from tests.kubernetes.kit import REPO, TEAMS, Plane, Pods, apply_manifest, create, fleet_nodes

HERE = Path(__file__).parent
BUILD_S = 3600.0  # a cold build of Kubernetes on two cores; minutes, but a slow module download adds more
START_S = 180.0
STOP_S = 60.0
TEST_S = 300.0  # generous: the folder also holds tests that start a gpufleet control plane


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.kubernetes)


@pytest.fixture(scope="package")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Iterator[Any]:
    from gpufleet.adapters.kubernetes.testenv import TestCluster, build

    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")

    def echo(line: str) -> None:  # past the output capture: the build and start times are worth seeing
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(line)

    try:
        built = within(BUILD_S, "building the Kubernetes test binaries", lambda: build(echo=echo))
        cluster = TestCluster(tmp_path_factory.mktemp("k8s"), built.bin_dir, echo=echo)
        within(START_S, "starting the Kubernetes test cluster", cluster.start)
        problem = ""
    except GpufleetError as error:
        problem = str(error)
    if problem:  # failed here rather than in the handler, so that the report shows the message alone
        pytest.fail(f"the Kubernetes test cluster cannot run: {problem}", pytrace=False)
    try:
        yield cluster
    finally:
        within(STOP_S, "stopping the Kubernetes test cluster", cluster.stop)


@pytest.fixture(autouse=True)
def _deadline() -> Iterator[None]:
    """Each test of this folder fails after TEST_S rather than hanging on a wait that never ends."""

    def expired(_signo: int, _frame: object) -> None:
        raise TimeoutError(f"the test took more than {TEST_S:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, TEST_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# gpufleet on the cluster (tests/kubernetes/kit.py): the manifests, the pods a team makes, a running control plane.


@pytest.fixture(scope="package")
def admin(k8s_cluster: Any) -> Iterator[KubeApi]:
    api = KubeApi(Path(k8s_cluster.admin_kubeconfig))
    for manifest in ("namespace.yaml", "serviceaccount.yaml", "clusterrole.yaml", "clusterrolebinding.yaml"):
        apply_manifest(api, REPO / "deploy/kubernetes/base" / manifest)
    for team in TEAMS:
        create(api, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team}})
    for name, value in (("low", 100), ("high", 10_000)):
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        create(api, "/apis/scheduling.k8s.io/v1/priorityclasses", body)
    k8s_cluster.add_nodes(fleet_nodes())
    yield api
    api.close()


@pytest.fixture(scope="module")
def plane(k8s_cluster: Any, admin: KubeApi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    token = k8s_cluster.service_account_token("gpufleet-system", "gpufleet")
    kubeconfig = Path(k8s_cluster.kubeconfig_for_token("gpufleet", token))
    running = Plane(tmp_path_factory.mktemp("k8s-plane") / "data", kubeconfig)
    with running.client() as http:
        for team in TEAMS:
            answer = http.put(f"/v1/queues/{team}", json={})
            assert answer.status_code in (200, 201), answer.text
    yield running
    running.server.stop()


@pytest.fixture
def pods(admin: KubeApi, plane: Plane) -> Iterator[Pods]:
    made = Pods(admin)
    yield made
    made.clear()
