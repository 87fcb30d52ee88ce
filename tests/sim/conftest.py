"""Fixtures for the workload loader tests: the public traces (`tests/kit/traces.py`), loaded once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.sim.workload import Workload
from gpufleet.sim.workloads import load_openb, load_philly
from tests.kit import traces


@pytest.fixture(scope="session")
def traces_root() -> Path:
    """$GPUFLEET_TRACES or ../shared/traces; a missing folder fails the test (see tests/kit/traces.py)."""
    return traces.traces_root()


@pytest.fixture(scope="session")
def openb_dir(traces_root: Path) -> Path:
    return traces_root / "alibaba-openb-2023"


@pytest.fixture(scope="session")
def openb_default(openb_dir: Path) -> Workload:
    return load_openb(openb_dir)


@pytest.fixture(scope="session")
def openb_gpuspec33(openb_dir: Path) -> Workload:
    return load_openb(openb_dir, pods="gpuspec33")


@pytest.fixture(scope="session")
def philly(traces_root: Path) -> Workload:
    return load_philly(traces_root / "philly-2017")
