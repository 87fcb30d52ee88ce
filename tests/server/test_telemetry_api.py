"""Telemetry endpoints on the API (real SQL store, in-process app): who may set and read idle policies, what
the endpoints answer without telemetry, bad input; and the cost of a `/metrics` scrape of the control plane's
own view with 8 nodes x 8 GPUs and 1,000 jobs."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.adapters.metrics import render
from gpufleet.adapters.storage.sql import SqlStore, default_sqlite_url
from gpufleet.domain.cluster import GpuShare, WorkerPlacement, make_node
from gpufleet.domain.errors import SpecError
from gpufleet.domain.jobs import Job, RunningJob, RunSpec
from gpufleet.domain.quotas import QueueSpec
from gpufleet.domain.resources import GiB, WorkerRequest
from gpufleet.scheduling.state import Holding
from gpufleet.scheduling.table import NodeTable
from gpufleet.server.gpu_monitor import ACTIVITY_ENV, LoopView, Telemetry, TelemetrySettings, declared_activity
from tests.server.conftest import Api


def test_admins_set_idle_policies_teams_read_their_own(api: Api) -> None:
    client = api.client
    assert client.get("/v1/queues/team-a/idle-policy", headers=api.h(api.team_a)).json() == {
        "queue": "team-a",
        "policy": "notify",
    }
    put = client.put("/v1/queues/team-a/idle-policy", json={"policy": "reclaim"}, headers=api.as_admin())
    assert put.status_code == 200
    assert put.json()["policy"] == "reclaim"
    assert api.store.get_setting("idle_policy:team-a") == "reclaim"
    assert client.get("/v1/queues/team-a/idle-policy", headers=api.h(api.team_a)).json()["policy"] == "reclaim"

    denied = client.put("/v1/queues/team-a/idle-policy", json={"policy": "none"}, headers=api.h(api.team_a))
    assert denied.status_code == 403
    assert "admin" in denied.json()["message"]
    hidden = client.get("/v1/queues/team-a/idle-policy", headers=api.h(api.team_b))
    assert hidden.status_code == 404  # another team's queue answers as missing
    unknown = client.put("/v1/queues/nope/idle-policy", json={"policy": "none"}, headers=api.as_admin())
    assert unknown.status_code == 404
    assert "to fix" in unknown.json()["message"]
    bad = client.put("/v1/queues/team-a/idle-policy", json={"policy": "evict"}, headers=api.as_admin())
    assert bad.status_code == 422
    assert bad.json()["fields"][0]["field"] == "policy"
    assert api.store.get_setting("idle_policy:team-a") == "reclaim"  # unchanged by the refused calls
    assert client.get("/v1/queues/team-a/idle-policy").status_code == 401


def test_without_telemetry_the_gpu_views_say_so_and_usage_reports_allocation_only(api: Api) -> None:
    client = api.client
    answer = client.get("/v1/telemetry", headers=api.as_admin())
    assert answer.status_code == 404
    assert "telemetry is not enabled" in answer.json()["message"]
    usage = client.get("/v1/usage", params={"since": 0}, headers=api.as_admin())
    assert usage.status_code == 200
    body = usage.json()
    assert body["probe"] is None
    assert body["queues"] == []
    assert body["total"]["allocated_gpu_hours"] == 0
    assert any("only allocation" in note for note in body["notes"])
    backwards = client.get("/v1/usage", params={"since": 2000, "until": 1000}, headers=api.as_admin())
    assert backwards.status_code == 422
    assert backwards.json()["fields"][0]["field"] == "until"
    assert client.get("/v1/usage", params={"since": -5}, headers=api.as_admin()).status_code == 422


def test_settings_and_declared_activity_refuse_or_default_clearly() -> None:
    with pytest.raises(SpecError) as error:
        TelemetrySettings(interval_s=0, idle_threshold_pct=120, idle_window_s=-1)
    assert {f.field for f in error.value.fields} == {"sample_interval", "idle_threshold", "idle_window"}

    def job(env: dict[str, str]) -> Job:
        return Job("j", "q", WorkerRequest(gpus=1), run=RunSpec(("true",), env=tuple(env.items())))

    assert declared_activity(job({ACTIVITY_ENV: "Idle "})).value == "idle"
    assert declared_activity(job({})).value == "busy"
    assert declared_activity(job({ACTIVITY_ENV: "sleepy"})).value == "busy"


def _fleet_view(jobs: int, nodes: int = 8, gpus: int = 8) -> tuple[list, LoopView]:
    fleet = [make_node(f"node-{n:02d}", "A100-80GB", gpus, 80 * GiB, nvlink_groups=2) for n in range(nodes)]
    keys = [(node.name, gpu.index) for node in fleet for gpu in node.gpus]
    pending: dict[str, Job] = {}
    holdings: dict[str, Holding] = {}
    for i in range(jobs):
        activity = ("busy", "busy", "light", "idle")[i % 4]
        job = Job(
            f"job-{i:05d}",
            f"queue-{i % 8}",
            WorkerRequest(gpus=1),
            submitted_at=1000.0,
            run=RunSpec(("true",), env=((ACTIVITY_ENV, activity),)),
        )
        if i < len(keys):
            node, index = keys[i]
            workers = (WorkerPlacement(node, (GpuShare(index),)),)
            holdings[job.id] = Holding(job, workers, (), RunningJob(job, workers, started_at=1000.0 + i))
        else:
            pending[job.id] = job
    return fleet, LoopView(2000.0, pending, holdings, frozenset())


def test_a_scrape_of_64_gpus_and_1000_jobs_reads_no_store(tmp_path: Path) -> None:
    store = SqlStore.open(default_sqlite_url(tmp_path))
    store.set_queue(QueueSpec("queue-0"))
    fleet, view = _fleet_view(1000)
    telemetry = Telemetry(store, fleet, emulated=True, hostname="x", settings=TelemetrySettings(interval_s=5))
    telemetry.observer.view = view
    table = NodeTable(fleet)
    for holding in view.holdings.values():
        table.apply_many(list(holding.workers), -1)
    telemetry.observer.table = table
    telemetry.tick(2000.0)
    telemetry.tick(2005.0)
    store.close()  # a scrape must not need the store
    times = []
    for _ in range(30):
        started = time.perf_counter()
        body = render(telemetry.registry)
        times.append(time.perf_counter() - started)
    median_ms = 1000 * statistics.median(times)
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert len(util) == 64
    assert all(s.labels["job_id"].startswith("job-") for s in util)
    pending = {s.labels["queue"]: s.value for s in families["gpufleet_queue_pending_jobs"].samples}
    assert pending == {f"queue-{q}": 117.0 for q in range(8)}  # 936 pending over 8 queues
    allocated = {s.labels["queue"]: s.value for s in families["gpufleet_queue_allocated_gpus"].samples}
    assert sum(allocated.values()) == 64
    assert families["gpufleet_fragmentation_ratio"].samples[0].value == 0.0  # every GPU is taken
    print(f"scrape of 64 GPUs, 1,000 jobs: {median_ms:.2f} ms median; tick {telemetry.tick_seconds / 2 * 1e3:.2f} ms")
