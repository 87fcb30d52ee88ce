"""GPU telemetry in a real `gpufleet up --emulate` (a child process, real job processes), scraped by a real
Prometheus server: DCGM metrics labelled with the jobs on each GPU, reserved-but-idle flags, the reclaim
policy requeueing an idle job so that a waiting one gets its GPUs, `gpufleet top --once`, and
`gpufleet report usage` checked against the jobs' own history.

The GPUs are emulated: each job declares its activity with EMULATED_GPU_ACTIVITY. The server samples every
0.2 s and flags a GPU idle after 1.5 s, so the whole module runs in seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.server.gpu_monitor import ACTIVITY_ENV
from tests.server.live import Live, start
from tests.telemetry.prom import prometheus_server, promtool_check, query, wait_for
from tests.telemetry.prom import wait_for as until

WINDOW_S = 1.5
HOLDING = ("admitted", "launching", "running", "evicting")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    server = start(tmp_path_factory.mktemp("telemetry"), "--sample-interval", "0.2", "--idle-window", str(WINDOW_S))
    try:
        yield server
    finally:
        server.server.stop()


def gpu_series(client: httpx.Client, name: str = "DCGM_FI_DEV_GPU_UTIL") -> list[tuple[dict[str, str], float]]:
    text = client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return [(dict(s.labels), s.value) for s in family.samples]
    return []


def scalar(client: httpx.Client, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def cli(live: Live, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "GPUFLEET_URL": live.url, "GPUFLEET_TOKEN": live.server.token}
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def cancel_all(live: Live, client: httpx.Client, *job_ids: str) -> None:
    for job_id in job_ids:
        if live.job(client, job_id)["state"] not in ("succeeded", "failed", "cancelled"):
            client.post(f"/v1/jobs/{job_id}/cancel")
    for job_id in job_ids:
        live.wait_state(client, job_id, "succeeded", "failed", "cancelled")


def test_metrics_label_each_gpu_with_its_job_and_prometheus_reads_them_back(live: Live, tmp_path: Path) -> None:
    with live.http() as client:
        idle = live.submit(client, "sleep", "120", name="notebook", gpus=1, env={ACTIVITY_ENV: "idle"})
        busy = live.submit(client, "sleep", "120", name="training", gpus=2, env={ACTIVITY_ENV: "busy"})
        for job_id in (idle, busy):
            live.wait_state(client, job_id, "running")

        def by_job() -> dict[str, list[tuple[dict[str, str], float]]] | None:
            found: dict[str, list[tuple[dict[str, str], float]]] = {}
            for labels, value in gpu_series(client):
                found.setdefault(labels["job_id"], []).append((labels, value))
            return found if len(found.get(idle, [])) == 1 and len(found.get(busy, [])) == 2 else None

        series = until(by_job, 10, "samples of both jobs' GPUs")
        assert all(value < 5 for _, value in series[idle])
        assert all(value > 80 for _, value in series[busy])
        for labels, _ in series[idle] + series[busy]:
            assert labels["queue"] == "default"
            assert labels["probe"] == "emulated"
            assert labels["modelName"] == "emulated A100-80GB"
        held = {labels["gpu"] for labels, _ in series[idle] + series[busy]}
        assert len(held) == 3
        free = series.get("", [])
        assert len(free) == 5
        assert all(value == 0 and labels["queue"] == "" for labels, value in free)
        assert not held & {labels["gpu"] for labels, _ in free}

        body = client.get("/metrics").content
        code, problems = promtool_check(body)
        assert code in (0, 3)
        assert all("camelCase" in p and p.startswith("DCGM_FI_DEV_") for p in problems), problems

        target = f"127.0.0.1:{live.server.port}"
        with prometheus_server(target, tmp_path, scrape_interval_s=0.5, bearer=live.server.token) as prom:
            busy_series = wait_for(
                lambda: len(found := query(prom, f'DCGM_FI_DEV_GPU_UTIL{{job_id="{busy}"}}')) == 2 and found,
                30,
                "Prometheus to scrape the busy job's GPUs",
            )
            assert all(float(s["value"][1]) > 80 for s in busy_series)
            assert {s["metric"]["queue"] for s in busy_series} == {"default"}
            assert {s["metric"]["job"] for s in busy_series} == {"gpufleet"}  # Prometheus' scrape job
            # The idle job's GPU is flagged after the window: the queue's reserved-idle gauge says so.
            idle_gpus = wait_for(
                lambda: [s for s in query(prom, 'gpufleet_queue_reserved_idle_gpus{queue="default"}')
                         if float(s["value"][1]) >= 1],
                30,
                "Prometheus to see the reserved-idle GPU",
            )  # fmt: skip
            assert float(idle_gpus[0]["value"][1]) == 1.0
            running = query(prom, 'gpufleet_queue_running_jobs{queue="default"}')
            assert float(running[0]["value"][1]) == 2.0

        # notify (the default policy): flagged, shown, left running.
        usage = client.get(f"/v1/jobs/{idle}/usage").json()
        assert usage["reserved_idle"] is True
        assert usage["idle_policy"] == "notify"
        assert usage["last_flag"]["action"] == "notified"
        assert "reserved but idle" in usage["last_flag"]["reason"]
        assert [g["flagged"] for g in usage["gpus"]] == [True]
        assert usage["reserved_idle_gpu_seconds"] >= WINDOW_S - 0.5
        assert client.get(f"/v1/jobs/{busy}/usage").json()["reserved_idle"] is False
        assert live.job(client, idle)["state"] == "running"
        assert "reserved but idle" in client.get(f"/v1/jobs/{idle}/explain").json()["idle"]
        assert client.get(f"/v1/jobs/{busy}/explain").json()["idle"] is None
        assert "reserved but idle" in cli(live, "explain", idle).stdout
        notices = client.get(f"/v1/jobs/{idle}/events").json()["notices"]
        assert [n["kind"] for n in notices] == ["reserved-idle"]
        assert "policy notify: notified" in notices[0]["message"]
        assert client.get(f"/v1/jobs/{busy}/events").json()["notices"] == []

        frame = cli(live, "top", "--once").stdout
        assert "EMULATED" in frame
        assert "probe emulated" in frame
        for job_id in (idle, busy):
            assert job_id in frame
        rows = {job_id: [line for line in frame.splitlines() if job_id in line] for job_id in (idle, busy)}
        assert len(rows[idle]) == 1
        assert "IDLE" in rows[idle][0]
        assert len(rows[busy]) == 2
        assert not any("IDLE" in line or "low" in line for line in rows[busy])
        assert sum(1 for line in frame.splitlines() if " A100-80GB " in line) == 8
        cancel_all(live, client, idle, busy)


def test_reclaim_requeues_an_idle_preemptible_job_and_a_waiting_job_gets_its_gpus(live: Live) -> None:
    with live.http() as client:
        assert client.put("/v1/queues/lab", json={}).status_code == 200
        assert cli(live, "quota", "idle-policy", "lab", "reclaim").stdout.strip() == "queue lab: idle policy reclaim"
        assert cli(live, "quota", "idle-policy", "lab").stdout.strip() == "queue lab: idle policy reclaim"
        bad = cli(live, "quota", "idle-policy", "lab", "evict", check=False)
        assert bad.returncode == 2
        assert "'notify', 'reclaim' or 'none'" in bad.stderr
        assert "Traceback" not in bad.stderr

        pinned = live.submit(client, "sleep", "120", queue="lab", gpus=1, preemptible=False, env={ACTIVITY_ENV: "idle"})
        hog = live.submit(client, "sleep", "120", queue="lab", gpus=7, env={ACTIVITY_ENV: "idle"})
        for job_id in (pinned, hog):
            live.wait_state(client, job_id, "running")
        waiter = live.submit(client, "sleep", "120", gpus=4, env={ACTIVITY_ENV: "busy"})
        time.sleep(0.3)
        assert live.job(client, waiter)["state"] == "pending"

        started = live.wait_state(client, waiter, "running", timeout_s=20)
        assert started["state"] == "running"
        # The hog was stopped with its checkpoint signal and sent back to its queue; 7 GPUs do not fit now.
        assert live.wait_events("end", hog)[0]["how"] == "signal"
        hog_now = live.wait_state(client, hog, "pending")
        events = client.get(f"/v1/jobs/{hog}/events").json()["events"]
        assert any("reserved but idle" in e["reason"] and e["target"] == "evicting" for e in events), events
        assert hog_now["preemptions"] == 1
        flag = client.get(f"/v1/jobs/{hog}/usage").json()["last_flag"]
        assert flag["policy"] == "reclaim"
        assert flag["action"].startswith("reclaim requested")
        # The non-preemptible job is flagged but left alone.
        pinned_usage = until(
            lambda: (u := client.get(f"/v1/jobs/{pinned}/usage").json())["last_flag"] and u, 10, "the pinned flag"
        )
        assert pinned_usage["last_flag"]["action"] == "not reclaimed: the job is not preemptible"
        assert live.job(client, pinned)["state"] == "running"
        assert scalar(client, "gpufleet_preemptions_total", queue="lab") == 1.0
        cancel_all(live, client, pinned, hog, waiter)


def _held_seconds(events: list[dict[str, Any]]) -> float:
    held, start = 0.0, None
    for e in events:
        if e["target"] in HOLDING and e["source"] not in HOLDING:
            start = e["at"]
        elif e["target"] not in HOLDING and e["source"] in HOLDING and start is not None:
            held += e["at"] - start
            start = None
    return held


def test_report_usage_matches_the_jobs_history_and_their_measured_use(live: Live, tmp_path: Path) -> None:
    with live.http() as client:
        assert client.put("/v1/queues/acct", json={}).status_code == 200
        busy = live.submit(client, "sleep", "2", queue="acct", gpus=2, env={ACTIVITY_ENV: "busy"})
        idle = live.submit(client, "sleep", "3.5", queue="acct", gpus=1, env={ACTIVITY_ENV: "idle"})
        for job_id in (busy, idle):
            live.wait_state(client, job_id, "succeeded", timeout_s=30)
        held = {j: _held_seconds(client.get(f"/v1/jobs/{j}/events").json()["events"]) for j in (busy, idle)}
        assert 2.0 <= held[busy] < 4
        assert 3.5 <= held[idle] < 6
        jobs = {j: client.get(f"/v1/jobs/{j}/usage").json() for j in (busy, idle)}

    png = tmp_path / "usage.png"
    import json

    report = json.loads(cli(live, "report", "usage", "--since", "10m", "--json", "--png", str(png)).stdout)
    row = next(q for q in report["queues"] if q["queue"] == "acct")
    assert row["jobs"] == 2
    assert row["allocated_gpu_hours"] * 3600 == pytest.approx(2 * held[busy] + held[idle], abs=1e-3)
    # Measured use covers the sampled part of the same holds (a sample every 0.2 s). A job's last sample may
    # land after its exit was observed and before the loop recorded it: up to one interval per GPU more.
    sampled = row["sampled_gpu_hours"] * 3600
    assert sampled == pytest.approx(sum(j["sampled_gpu_seconds"] for j in jobs.values()), rel=1e-6)
    allocated = 2 * held[busy] + held[idle]
    assert 0.7 * allocated <= sampled <= allocated + 0.2 * 3
    assert row["used_gpu_hours"] * 3600 == pytest.approx(sum(j["used_gpu_seconds"] for j in jobs.values()), rel=1e-6)
    busy_use, idle_use = jobs[busy], jobs[idle]
    assert 0.85 <= busy_use["used_gpu_seconds"] / busy_use["sampled_gpu_seconds"] <= 0.99
    assert idle_use["used_gpu_seconds"] / idle_use["sampled_gpu_seconds"] <= 0.02
    assert busy_use["reserved_idle_gpu_seconds"] == 0
    # Idle from its first sample; flagged after the window, the whole run counts.
    assert held[idle] - WINDOW_S - 1.5 <= idle_use["reserved_idle_gpu_seconds"] <= idle_use["sampled_gpu_seconds"]
    assert row["reserved_idle_gpu_hours"] * 3600 == pytest.approx(idle_use["reserved_idle_gpu_seconds"], rel=1e-6)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = cli(live, "report", "usage", "--since", "1h").stdout
    assert "acct" in text
    assert "RESERVED-IDLE" in text
    assert "emulated" in text
    bad = cli(live, "report", "usage", "--since", "last tuesday", check=False)
    assert bad.returncode == 2
    assert "to fix" in bad.stderr
    assert "Traceback" not in bad.stderr
