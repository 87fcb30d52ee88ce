"""Property-based run of the whole OpenAPI document (schemathesis): no input, valid or not, gets a 5xx, and every
answer matches its documented schema. Authenticated as admin, so requests reach the handlers.

Random generation rarely draws the numbers that break a service (a 25-digit integer where the database holds
64 bits, a 400-digit size, `1e400`, NaN), so a second test walks the same document and sends each number
parameter and body field such extremes: any 5xx fails it."""

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
# Numbers as a client can send them: past 64 bits, past a double, not finite, negative, a boolean.
EXTREME_QUERY = ("9" * 25, "-" + "9" * 25, str(2**63), str(2**64), "1e400", "-1e400", "nan", "inf", "-1")
EXTREME_BODY: tuple[object, ...] = (10**25, -(10**25), 2**63, 10**400, 1e308, -1e308, True, -1)
EXTREME_TEXT = ("9" * 400, "9" * 400 + "GiB", "1e400", "nan", "-1")  # for fields that take a number or a text
# A body the operation would accept, which each extreme then changes one field of.
BASE_BODIES = {"JobSpec": {"command": ["x"]}, "TokenIn": {"name": "x"}, "IdlePolicyIn": {"policy": "none"}}
PATHS = {"job_id": "j-1", "name": "team-a", "token_id": "t-1"}


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


def test_extreme_numbers_in_every_parameter_and_field_get_no_server_error(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    clock = StepClock()
    secret = bootstrap_admin(store, clock)
    assert secret is not None
    headers = {"Authorization": f"Bearer {secret}"}
    ctx = ApiContext(store=store, clock=clock, emulated=True)
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(ctx))
    sent: dict[int, int] = {}
    failures: list[str] = []
    accepted: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        paths = {p.name: PATHS.get(p.name, "x") for p in operation.iter_parameters() if p.location.value == "path"}
        cases = [
            operation.Case(path_parameters=paths, query={p.name: value}, headers=headers)
            for p in operation.iter_parameters()
            if p.location.value == "query" and _takes_number(p.definition.get("schema", {}))
            for value in EXTREME_QUERY
        ]
        raw = schema.raw_schema["paths"][operation.path][operation.method.lower()]
        for content in raw.get("requestBody", {}).get("content", {}).values():
            model = content["schema"]
            if "$ref" in model:
                model = schema.raw_schema["components"]["schemas"][model["$ref"].rsplit("/", 1)[-1]]
            properties = model.get("properties", {})
            base = BASE_BODIES.get(model.get("title", ""), {})
            for field, spec in properties.items():
                values = [*EXTREME_BODY, *EXTREME_TEXT] if _takes_text(spec) else list(EXTREME_BODY)
                inner = spec.get("additionalProperties")
                if isinstance(inner, dict) and _takes_number(inner):  # a map of numbers: quotas
                    cases += [
                        operation.Case(path_parameters=paths, body={**base, field: {"gpu": v}}, headers=headers,
                                       media_type="application/json")
                        for v in [*EXTREME_BODY, *EXTREME_TEXT]
                    ]  # fmt: skip
                if _takes_number(spec):
                    cases += [
                        operation.Case(path_parameters=paths, body={**base, field: v}, headers=headers, media_type=
                                       "application/json")
                        for v in values
                    ]  # fmt: skip
        for case in cases:
            response = case.call()
            sent[response.status_code] = sent.get(response.status_code, 0) + 1
            if response.status_code < 300:
                accepted.append(f"{operation.label} {case.query or case.body}")
            if response.status_code >= 500:
                failures.append(f"{operation.label} {case.query or case.body}: {response.status_code}")
    store.close()
    assert failures == []
    assert sum(sent.values()) >= 250, sent  # every number of the API was tried
    # Of these extremes only a priority of -1 is a valid value; every other one is refused.
    assert accepted == ["POST /v1/jobs {'command': ['x'], 'priority': -1}"]


def _takes_number(spec: dict[str, Any]) -> bool:
    kinds = [spec.get("type"), *(option.get("type") for option in spec.get("anyOf", ()))]
    return "integer" in kinds or "number" in kinds


def _takes_text(spec: dict[str, Any]) -> bool:
    return "string" in [option.get("type") for option in spec.get("anyOf", ())]


def exercise(operation: Any, mode: GenerationMode, headers: dict[str, str], codes: set[int]) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    def check(case: Any) -> None:
        response = case.call(headers=headers)
        codes.add(response.status_code)
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])

    check()
