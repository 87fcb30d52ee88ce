"""Session fixtures shared by every test folder: a private PostgreSQL server (see tests/kit/postgres.py), our
fake NVML library (tests/telemetry/fakenvml), the removal of the job users the session created, and the
closing banner when tests went without the public traces (tests/kit/traces.py).

Hypothesis profiles, for every folder: `ci` (the default: derandomized, no deadline and no "too slow" health
check, since a loaded two-core machine makes timings meaningless) keeps the property suite at about 10 s;
`thorough` (`HYPOTHESIS_PROFILE=thorough pytest tests/property`, ~1.5 min) and `deep` (~5 min) search further
with fresh random examples each run."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.kit import traces
from tests.kit.jobusers import job_users_and_folders
from tests.kit.postgres import OPT_OUT, PostgresServer, PostgresUnavailableError, opted_out
from tests.telemetry.fakenvml import build_library

settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)
settings.register_profile(
    "thorough",
    max_examples=600,
    deadline=None,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)
settings.register_profile(
    "deep",
    max_examples=2500,
    deadline=None,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session", autouse=True)
def _remove_job_users() -> Iterator[None]:
    """A control plane run as root creates a user per queue (gpufleet-<queue>): the session removes those it
    created, and the folders it shared with their jobs."""
    with job_users_and_folders():
        yield


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session. Fails (not skips) when PostgreSQL is not installed; set
    GPUFLEET_TEST_POSTGRES=0 to skip the tests that need it."""
    if opted_out():
        pytest.skip(f"PostgreSQL tests turned off by {OPT_OUT}=0")
    try:
        server = PostgresServer()
        server.start()
    except PostgresUnavailableError as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a fresh, empty database on the session's server, dropped after the test."""
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(url)


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding our fake libnvidia-ml.so.1 (emulation, built with gcc once per test session)."""
    try:
        return build_library(tmp_path_factory.mktemp("fakenvml"))
    except RuntimeError as exc:
        pytest.fail(str(exc))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say loudly how many tests did not run for want of the public traces (skipped on request, or failed)."""
    stats = terminalreporter.stats
    skipped = sum(1 for r in stats.get("skipped", []) if traces.SKIP_PREFIX in str(getattr(r, "longrepr", "")))
    failed = sum(
        1
        for kind in ("failed", "error")
        for r in stats.get(kind, [])
        if f"{traces.TRACES_ENV}=DIR" in getattr(r, "longreprtext", "")
    )
    if not skipped and not failed:
        return
    where = traces.traces_folder()
    if skipped:
        terminalreporter.write_sep("!", f"{skipped} TESTS SKIPPED: public traces not found at {where}", red=True)
        terminalreporter.write_line(
            f"{traces.OPT_OUT}=1 turned them into skips: the published-result claims were NOT checked. "
            f"Set {traces.TRACES_ENV}=DIR (or put the traces at {traces.DEFAULT_TRACES}) and run again."
        )
    if failed:
        terminalreporter.write_sep("!", f"{failed} TESTS FAILED: public traces not found at {where}", red=True)
        terminalreporter.write_line(
            f"to fix: set {traces.TRACES_ENV}=DIR to the folder holding the trace folders, or put them at "
            f"{traces.DEFAULT_TRACES}; {traces.OPT_OUT}=1 skips these tests instead (and says so)."
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Detach the private /tmp of jobs that outlived their test's control plane (a test that stops it with
    jobs still running, as a crash would): nothing of this session stays mounted on the machine, so that
    pytest can remove its folders later."""
    if os.geteuid() != 0:
        return
    from gpufleet.adapters.local import namespaces

    factory = getattr(session.config, "_tmp_path_factory", None)
    roots = [str(factory.getbasetemp())] if factory is not None else []
    roots.append("/var/tmp/gpufleet-")
    for point in namespaces.attempt_mounts():
        if any(point.startswith(root) for root in roots):
            with contextlib.suppress(OSError):
                namespaces.release(point)
