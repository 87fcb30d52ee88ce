"""`gpufleet up` (on loopback, its default): /metrics needs a token, and a real Prometheus scrapes it with a
metrics token read from a file (`authorization: {type: Bearer, credentials_file: …}`, the README's scrape
config) while a scrape without one is refused. `--public-metrics` opens it, and says so."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.server.live import start
from tests.telemetry.prom import get_json, prometheus_server, query, require, wait_for

pytestmark = pytest.mark.slow


def test_prometheus_scrapes_a_loopback_control_plane_with_a_metrics_token(tmp_path: Path) -> None:
    require("prometheus")
    live = start(tmp_path, "--sample-interval", "0.2")
    try:
        assert "/metrics: needs a bearer token" in live.server.output()
        refused = httpx.get(f"{live.url}/metrics")
        assert refused.status_code == 401
        assert "--role metrics" in refused.json()["message"]
        with live.http() as client:
            secret = client.post("/v1/tokens", json={"name": "prometheus", "role": "metrics"}).json()["secret"]
            job = live.submit(client, "sleep", "30", name="watched", gpus=1)
            live.wait_state(client, job, "running")
            assert client.get("/healthz").json()["metrics"] == "token"
        assert httpx.get(f"{live.url}/v1/jobs", headers={"Authorization": f"Bearer {secret}"}).status_code == 403
        target = f"127.0.0.1:{live.server.port}"
        with prometheus_server(target, tmp_path, scrape_interval_s=0.5, bearer=secret, anonymous_too=True) as prom:
            series = wait_for(
                lambda: query(prom, f'DCGM_FI_DEV_GPU_UTIL{{job_id="{job}"}}'),
                30,
                "Prometheus to scrape with the token",
            )
            assert series[0]["metric"]["job"] == "gpufleet"

            def anonymous_refused() -> dict[str, object] | None:
                targets = get_json(prom + "/api/v1/targets")["data"]["activeTargets"]
                found = [t for t in targets if t["labels"]["job"] == "anonymous" and t["health"] == "down"]
                return found[0] if found else None

            anonymous = wait_for(anonymous_refused, 30, "the scrape without a token to be refused")
            assert "401" in str(anonymous["lastError"])
            assert query(prom, 'up{job="anonymous"}')[0]["value"][1] == "0"
    finally:
        with live.http() as client:
            for item in client.get("/v1/jobs").json()["jobs"]:
                client.post(f"/v1/jobs/{item['id']}/cancel", params={"force": "true"})
        live.server.stop()


def test_public_metrics_is_an_explicit_choice_that_up_and_healthz_show(tmp_path: Path) -> None:
    live = start(tmp_path, "--public-metrics")
    try:
        assert "/metrics: public" in live.server.output()
        assert httpx.get(f"{live.url}/metrics").status_code == 200
        with live.http() as client:
            assert client.get("/healthz").json()["metrics"] == "public"
    finally:
        live.server.stop()
