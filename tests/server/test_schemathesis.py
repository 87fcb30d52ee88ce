"""Property-based run of the whole OpenAPI document (schemathesis): no input, valid or not, gets a 5xx, and every
answer matches its documented schema. Authenticated as admin, so requests reach the handlers."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Starlette's test client (used for ASGI apps) warns about httpx
    import schemathesis
    from schemathesis.checks import not_a_server_error
    from schemathesis.generation import GenerationMode
    from schemathesis.specs.openapi.checks import response_schema_conformance

from gpufleet.server.auth import bootstrap_admin
from gpufleet.server.context import ApiContext
from gpufleet.server.http_app import create_app
from tests.server.conftest import StepClock, make_store

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
EXAMPLES = 15  # per operation and mode: about 600 requests, a few seconds


def test_no_server_errors_and_documented_answers(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    clock = StepClock()
    secret = bootstrap_admin(store, clock)
    assert secret is not None
    headers = {"Authorization": f"Bearer {secret}"}
    log = tmp_path / "attempt-1" / "worker-0.log"
    log.parent.mkdir()
    log.write_text("hello\n")
    ctx = ApiContext(store=store, clock=clock, log_paths=lambda _job_id: [log], emulated=True)
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(ctx))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 19
    calls: dict[str, set[int]] = {}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                exercise(operation, mode, headers, calls.setdefault(operation.label, set()))
            except Unsatisfiable:
                # An operation without parameters or body has no invalid input to generate.
                if mode is GenerationMode.POSITIVE:
                    raise
    store.close()
    # Every operation was reached, and some answers were successes (the token works, valid input passes).
    assert len(calls) == len(operations)
    assert sum(1 for codes in calls.values() if any(c < 300 for c in codes)) >= len(operations) // 2, calls


def exercise(operation: Any, mode: GenerationMode, headers: dict[str, str], codes: set[int]) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    def check(case: Any) -> None:
        response = case.call(headers=headers)
        codes.add(response.status_code)
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])

    check()
