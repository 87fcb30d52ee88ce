"""The public traces the simulator tests read: found, or a failure that says how to provide them.

The tests behind every published-result claim need the traces (and the price tables beside them). A clone
without them must not pass by skipping those tests silently: a missing folder fails each test that needs
it, with the fix. Only `GPUFLEET_SKIP_TRACE_TESTS=1` turns them into skips, and the session then ends with a
banner that counts them (`tests/conftest.py`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACES_ENV = "GPUFLEET_TRACES"
OPT_OUT = "GPUFLEET_SKIP_TRACE_TESTS"
DEFAULT_TRACES = REPO_ROOT.parent / "shared" / "traces"
SKIP_PREFIX = "public traces missing"


def opted_out() -> bool:
    return os.environ.get(OPT_OUT, "").strip().lower() in ("1", "true", "yes", "on")


def traces_folder() -> Path:
    """Where the tests look: $GPUFLEET_TRACES, else ../shared/traces beside the checkout."""
    given = os.environ.get(TRACES_ENV, "").strip()
    return Path(given).expanduser() if given else DEFAULT_TRACES


def require(path: Path, what: str) -> Path:
    """`path` if it exists; else fail the test with how to provide it (skip only when opted out)."""
    if path.exists():
        return path
    if opted_out():
        pytest.skip(f"{SKIP_PREFIX}: {what} not found at {path} ({OPT_OUT}=1: this test did not run)")
    pytest.fail(
        f"{what} not found at {path}; to fix: set {TRACES_ENV}=DIR to the folder holding the public trace "
        f"folders (alibaba-openb-2023/, philly-2017/, ...), or put them at {DEFAULT_TRACES} (../shared/traces "
        f"beside the checkout); or set {OPT_OUT}=1 to skip the tests that need them (they are then counted "
        "as skipped, not passed)",
        pytrace=False,
    )


def traces_root() -> Path:
    return require(traces_folder(), "the public traces folder")


def published_constants() -> Path:
    """The compiled interconnect, collective and failure constants (`../costs/published-constants`)."""
    folder = traces_folder().parent / "costs" / "published-constants"
    return require(folder / "published_constants.csv", "the published constants table")


def spot_traces() -> Path:
    """The spot interruption statistics that sit beside the traces (`../costs/spot-traces-nsdi24`)."""
    return require(traces_folder().parent / "costs" / "spot-traces-nsdi24", "the NSDI'24 spot statistics")


def price_tables() -> Path:
    """The GPU price tables that sit beside the traces (`../costs/gcp-gpu-prices-skypilot`)."""
    return require(traces_folder().parent / "costs" / "gcp-gpu-prices-skypilot", "the GCP GPU price table")
