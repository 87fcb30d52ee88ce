"""One real `gpufleet up` (emulated inventory of two nodes, two team queues) and one Chromium for every
browser test of the dashboard: Debian's Chromium driven by Playwright, never a downloaded browser."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.bench.api import LocalServer
from tests.web.proxy import PrefixProxy

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "out" / "web"  # screenshots of every page, kept as test artefacts (out/ is not in git)
AXE = Path(__file__).parent / "vendor" / "axe.min.js"
INVENTORY = """
nodes:
  - name: gpu-a
    gpus: 8xA100-80GB
    cpu: 64
    memory: 512GiB
    rack: r1
  - name: gpu-b
    gpus: 4xH100
    cpu: 32
    memory: 256GiB
    rack: r2
"""


@dataclass
class Dashboard:
    server: LocalServer
    admin: str
    alice: str  # team-a
    bob: str  # team-b
    data: Path
    proxy: PrefixProxy

    @property
    def url(self) -> str:
        return self.server.url

    def api(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token or self.admin}"}, timeout=30)

    def submit(self, token: str | None = None, **spec: Any) -> str:
        with self.api(token) as client:
            response = client.post("/v1/jobs", json=spec)
            assert response.status_code == 201, response.text
            return str(response.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        with self.api() as client:
            return dict(client.get(f"/v1/jobs/{job_id}").json())


@pytest.fixture(scope="session")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    root = tmp_path_factory.mktemp("dashboard")
    data = root / "data"
    data.mkdir()
    inventory = root / "inventory.yaml"
    inventory.write_text(INVENTORY)
    server = LocalServer(
        data, emulate=None, extra=("--inventory", str(inventory), "--sample-interval", "0.5", "--stop-jobs")
    )
    proxy = PrefixProxy(server.port)
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}) as client:
            for queue, gpus in (("team-a", 8), ("team-b", 4)):
                assert client.put(f"/v1/queues/{queue}", json={"quotas": {"gpu": gpus}}).status_code == 200
            limits = {"quotas": {"gpu": 8}, "max_pending": 50, "max_grace": "5m"}
            assert client.put("/v1/queues/team-a", json=limits).status_code == 200
            budget = {"amount": 250, "action": "block"}
            assert client.put("/v1/queues/team-a/budget", json=budget).status_code == 200
            secrets = {}
            for name, queue in (("alice", "team-a"), ("bob", "team-b")):
                made = client.post("/v1/tokens", json={"name": name, "role": "team", "queue": queue})
                assert made.status_code == 201, made.text
                secrets[name] = made.json()["secret"]
        yield Dashboard(server, server.token, secrets["alice"], secrets["bob"], data, proxy)
    finally:
        proxy.stop()
        server.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (scripts/setup does)", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def sign_in(browser: Any, base: str, token: str) -> Any:
    """A fresh browser context signed in with `token`; returns its page."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)  # generous: CI machines are small and often busy
    page = context.new_page()
    page.goto(base + "/")
    assert "/signin" in page.url
    page.fill("#token", token)
    page.click("form.signin button[type=submit]")
    page.wait_for_url(base + "/")
    return page


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it is now."""
    page.evaluate(AXE.read_text())
    result = page.evaluate("async () => JSON.stringify((await axe.run(document)).violations)")
    return [v for v in json.loads(result) if v.get("impact") in ("serious", "critical")]


def screenshot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
