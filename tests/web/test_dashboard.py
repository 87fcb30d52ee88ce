"""The dashboard in a real browser (Debian's Chromium through Playwright) against a real `gpufleet up`
with an emulated inventory: live updates, explanations, logs, cancel, team isolation, drain, the Simulator
page, a path prefix behind a proxy, keyboard use, and axe-core on every page."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.kit.jobusers import JOB_PYTHON
from tests.web.conftest import Dashboard, axe_violations, screenshot, sign_in

pytestmark = pytest.mark.slow

LOG_PROGRAM = "import time\nfor i in range(600):\n    print(f'line {i}', flush=True)\n    time.sleep(0.2)\n"


def wait_api(dashboard: Dashboard, job_id: str, done: Any, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = dashboard.job(job_id)
        if done(job):
            return job
        assert time.monotonic() < deadline, f"job {job_id} is still {job['state']}: {job}"
        time.sleep(0.1)


def sleeper(queue: str, seconds: int = 120, **more: Any) -> dict[str, Any]:
    return {"queue": queue, "command": ["sleep", str(seconds)], **more}


def test_every_page_renders_passes_axe_and_is_captured(dashboard: Dashboard, browser: Any) -> None:
    job_id = dashboard.submit(**sleeper("team-a", name="axe-check"))
    page = sign_in(browser, dashboard.url, dashboard.admin)
    for name, path in [
        ("overview", "/"), ("queues", "/queues"), ("jobs", "/jobs"), ("nodes", "/nodes"),
        ("simulator", "/simulator"), ("job", f"/jobs/{job_id}"),
    ]:  # fmt: skip
        response = page.goto(dashboard.url + path)
        assert response is not None, path
        assert response.status == 200, path
        assert "Emulated inventory" in page.inner_text("body"), path  # every page says the GPUs are emulated
        if name == "nodes":  # how jobs are isolated, as `gpufleet up`, `gpufleet nodes` and /healthz say it
            with dashboard.api() as client:
                isolation = client.get("/healthz").json()["isolation"]
            assert isolation["users"] in page.inner_text("main")
            assert isolation["cgroups"] in page.inner_text("main")
        page.wait_for_timeout(600)  # charts draw after load
        screenshot(page, name)
        assert axe_violations(page) == [], path
    page.goto(dashboard.url + "/signin")  # signed in: sent on to the overview
    assert page.url == dashboard.url + "/"
    page.context.close()
    signin = browser.new_page()
    signin.goto(dashboard.url + "/signin")
    screenshot(signin, "signin")
    assert axe_violations(signin) == []
    signin.context.close()


def test_submitted_jobs_appear_and_change_state_without_a_reload(dashboard: Dashboard, browser: Any) -> None:
    page = sign_in(browser, dashboard.url, dashboard.admin)
    page.goto(dashboard.url + "/jobs?queue=team-a&state=active")
    page.evaluate("window.stillTheSamePage = true")
    job_id = dashboard.submit(**sleeper("team-a", name="live-one", gpus=1))
    row = page.locator("tr", has=page.locator(f"#job-{job_id}"))
    row.wait_for()
    page.wait_for_function(
        "id => document.getElementById('job-' + id)?.closest('tr')?.innerText.includes('running')", arg=job_id
    )
    assert page.evaluate("window.stillTheSamePage") is True  # the table changed, the page did not reload
    page.context.close()


def test_a_waiting_job_shows_the_schedulers_explanation(dashboard: Dashboard, browser: Any) -> None:
    # 8 GPUs fit gpu-a but never team-b's quota of 4: accepted (with a warning), it waits and says why. (A job
    # no node could hold, 8 H100s on the 4-H100 node, is refused at submit.)
    job_id = dashboard.submit(**sleeper("team-b", name="over-quota", gpus=8, gpu_models=["A100-80GB"]))
    job = wait_api(dashboard, job_id, lambda j: bool(j["waiting_reason"]))
    page = sign_in(browser, dashboard.url, dashboard.admin)
    page.goto(f"{dashboard.url}/jobs/{job_id}")
    assert page.inner_text("#explain-reason") == job["waiting_reason"]
    assert "its GPU quota allows at most 4" in page.inner_text("#explain-summary")
    page.context.close()


def test_a_log_is_followed_and_the_job_cancelled_from_its_page(dashboard: Dashboard, browser: Any) -> None:
    # JOB_PYTHON: the job runs as team-a's own user, who may not reach this virtual environment.
    job_id = dashboard.submit(queue="team-a", name="talker", command=[JOB_PYTHON, "-u", "-c", LOG_PROGRAM])
    wait_api(dashboard, job_id, lambda j: j["state"] == "running")
    page = sign_in(browser, dashboard.url, dashboard.admin)
    page.goto(f"{dashboard.url}/jobs/{job_id}")
    page.evaluate("window.stillTheSamePage = true")
    first = page.inner_text("#log-text")
    shown = [int(n) for n in re.findall(r"line (\d+)", first)]
    later = f"line {max(shown, default=0) + 5}\n"  # printed a second after the page was rendered
    assert later not in first
    page.wait_for_function("text => document.getElementById('log-text').textContent.includes(text)", arg=later)
    assert page.evaluate("window.stillTheSamePage") is True
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-job")
    wait_api(dashboard, job_id, lambda j: j["state"] == "cancelled")
    page.wait_for_function("() => document.querySelector('#status-title').innerText.includes('cancelled')")
    assert page.locator("#cancel-job").count() == 0
    page.context.close()


def test_a_team_sees_only_its_queue_and_another_teams_job_is_404(dashboard: Dashboard, browser: Any) -> None:
    theirs = dashboard.submit(dashboard.alice, **sleeper("team-a", name="alice-secret"))
    mine = dashboard.submit(dashboard.bob, **sleeper("team-b", name="bob-job"))
    page = sign_in(browser, dashboard.url, dashboard.bob)
    page.goto(dashboard.url + "/jobs")
    assert page.locator(f"#job-{mine}").count() == 1
    assert page.locator(f"#job-{theirs}").count() == 0
    assert "alice-secret" not in page.content()
    response = page.goto(f"{dashboard.url}/jobs/{theirs}")
    assert response is not None
    assert response.status == 404
    assert f"no job '{theirs}'" in page.inner_text("main")
    log = page.goto(f"{dashboard.url}/jobs/{theirs}/log")
    assert log is not None
    assert log.status == 404
    queues = page.goto(dashboard.url + "/queues")
    assert queues is not None
    assert "team-a" not in page.inner_text("main")
    page.goto(dashboard.url + "/nodes")
    assert page.locator("button", has_text="Drain").count() == 0  # no admin actions for a team
    page.context.close()


def test_the_queues_page_shows_each_queues_limits_and_budget(dashboard: Dashboard, browser: Any) -> None:
    page = sign_in(browser, dashboard.url, dashboard.admin)
    page.goto(dashboard.url + "/queues")
    assert page.inner_text("#queue-max-pending-team-a") == "50"
    assert page.inner_text("#queue-max-grace-team-a") == "5 min 00 s"
    assert page.inner_text("#queue-max-pending-team-b") == "no cap"
    budget = page.locator("#queue-budget-team-a")
    budget.wait_for()
    # A budget is measured as soon as it is set: nothing spent yet.
    assert budget.inner_text().strip() == "$0.00 of $250.00 (0 %), calendar month; at 100 %: block"
    assert page.locator("#queue-budget-team-b").count() == 0
    page.context.close()


def test_an_admin_drains_a_node_from_the_nodes_page(dashboard: Dashboard, browser: Any) -> None:
    job_id = dashboard.submit(**sleeper("team-b", name="on-h100", gpus=1, gpu_models=["H100"]))
    wait_api(dashboard, job_id, lambda j: j["state"] == "running")
    page = sign_in(browser, dashboard.url, dashboard.admin)
    page.goto(dashboard.url + "/nodes")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#drain-gpu-b")
    page.wait_for_url("**/nodes?done=drain*")
    assert "Node gpu-b drained" in page.inner_text("main")
    with dashboard.api() as client:
        node = next(n for n in client.get("/v1/nodes").json()["nodes"] if n["name"] == "gpu-b")
    assert node["cordoned"] is True
    events = wait_api(dashboard, job_id, lambda j: j["state"] == "pending" or j["preemptions"] > 0)
    assert events["state"] in ("pending", "evicting")
    page.click("#uncordon-gpu-b")  # put it back for the other tests
    page.wait_for_url("**/nodes?done=uncordon*")
    page.context.close()


def test_the_simulator_page_shows_a_results_file(dashboard: Dashboard, browser: Any) -> None:
    out = dashboard.data / "sim" / "run-1"
    subprocess.run(
        [sys.executable, "-m", "gpufleet", "sim", "-w", "synthetic", "-p", "fifo,default", "--set", "jobs=60",
         "--out", str(out)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    page = sign_in(browser, dashboard.url, dashboard.admin)
    page.goto(dashboard.url + "/simulator?path=sim/run-1/results.json")
    table = page.locator("table.metrics")
    headers = table.locator("thead th").all_inner_texts()
    assert headers == ["Metric", "fifo", "default"]
    assert page.locator("table.metrics th[scope=row]", has_text="avg_jct_s").count() == 1
    assert "Source:" in page.inner_text(".citation")
    page.wait_for_function("() => document.querySelectorAll('.plots canvas').length >= 3")
    screenshot(page, "simulator-results")
    assert axe_violations(page) == []
    page.goto(dashboard.url + "/simulator")
    page.set_input_files("#results-file", str(out / "results.json"))
    page.click("form[enctype] button[type=submit]")
    page.wait_for_url("**/simulator?upload=*")
    assert page.locator("table.metrics thead th").all_inner_texts() == ["Metric", "fifo", "default"]
    page.context.close()
    team = sign_in(browser, dashboard.url, dashboard.alice)
    refused = team.goto(dashboard.url + "/simulator?path=sim/run-1/results.json")
    assert refused is not None
    assert refused.status == 403
    team.context.close()


def test_behind_a_proxy_under_a_path_prefix(dashboard: Dashboard, browser: Any) -> None:
    base = dashboard.proxy.url  # http://127.0.0.1:PORT/gf
    page = sign_in(browser, base, dashboard.admin)
    links = page.eval_on_selector_all("a[href], link[href], script[src]", "els => els.map(e => e.href || e.src)")
    ours = [link for link in links if link.startswith("http://127.0.0.1") and not link.startswith("data:")]
    assert ours
    assert all(link.startswith(base + "/") for link in ours), ours
    cookie = next(c for c in page.context.cookies() if c["name"] == "gpufleet_session")
    assert cookie["path"] == "/gf/"
    assert cookie["httpOnly"]
    assert cookie["sameSite"] == "Strict"
    page.click("nav >> text=Jobs")
    page.wait_for_url(base + "/jobs")
    page.click("text=Sign out")  # a POST through the proxy: CSRF token and origin check pass
    page.wait_for_url(base + "/signin")
    page.context.close()


def test_keyboard_reaches_the_content_and_the_navigation(dashboard: Dashboard, browser: Any) -> None:
    page = sign_in(browser, dashboard.url, dashboard.admin)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("location.hash") == "#main"
    page.goto(dashboard.url + "/")
    for _ in range(3):
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Overview"
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.wait_for_url(dashboard.url + "/queues")
    page.context.close()
