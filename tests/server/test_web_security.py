"""The dashboard's sign-in, session cookie, CSRF and origin checks, visibility and path prefix, through
HTTP on the real SQL store (no browser needed for these)."""

from __future__ import annotations

import dataclasses
import re
from http.cookies import SimpleCookie

from fastapi.testclient import TestClient

from gpufleet.ports import RequestKind
from gpufleet.server.http_app import create_app
from gpufleet.server.web.common import STATIC_DIR
from tests.server.conftest import Api

BASE = "http://testserver"


def signed_in(api: Api, secret: str) -> tuple[str, str]:
    """Sign in through the form; returns (the Set-Cookie header of the session, the page's CSRF token)."""
    form = api.client.get("/signin")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert nonce is not None
    answer = api.client.post(
        "/signin",
        data={"token": secret, "nonce": nonce.group(1), "next": "/jobs"},
        headers={"Origin": BASE},
        follow_redirects=False,
    )
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/jobs"
    session_cookie = next(h for h in answer.headers.get_list("set-cookie") if h.startswith("gpufleet_session="))
    page = api.client.get("/")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    return session_cookie, csrf.group(1)


def submit(api: Api, secret: str, queue: str) -> str:
    response = api.client.post("/v1/jobs", json={"queue": queue, "command": ["true"]}, headers=api.h(secret))
    assert response.status_code == 201
    return str(response.json()["id"])


def test_pages_need_a_session_and_send_the_browser_to_sign_in(api: Api) -> None:
    answer = api.client.get("/jobs", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/signin?next=%2Fjobs"
    polled = api.client.get("/jobs", headers={"HX-Request": "true"}, follow_redirects=False)
    assert polled.headers["HX-Redirect"] == "/signin?next=%2Fjobs"  # a live region's poll moves the page


def test_the_session_cookie_is_httponly_strict_and_holds_no_url_token(api: Api) -> None:
    cookie, _csrf = signed_in(api, api.team_a)
    attributes = cookie.lower()
    assert "httponly" in attributes
    assert "samesite=strict" in attributes
    assert "path=/" in attributes
    assert api.team_a not in api.client.get("/jobs").text  # never written into a page or a link


def test_a_wrong_token_is_refused_with_a_fix(api: Api) -> None:
    form = api.client.get("/signin")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert nonce is not None
    answer = api.client.post("/signin", data={"token": "gf_nope", "nonce": nonce.group(1)}, headers={"Origin": BASE})
    assert answer.status_code == 401
    assert "the token is not valid" in answer.text
    assert "to fix" in answer.text
    stale = api.client.post("/signin", data={"token": api.admin, "nonce": "forged"}, headers={"Origin": BASE})
    assert stale.status_code == 403


def test_actions_need_the_csrf_token_and_our_origin(api: Api) -> None:
    job_id = submit(api, api.team_a, "team-a")
    _cookie, csrf = signed_in(api, api.team_a)
    url = f"/jobs/{job_id}/cancel"
    missing = api.client.post(url, headers={"Origin": BASE}, follow_redirects=False)
    assert missing.status_code == 403
    foreign = api.client.post(
        url, data={"csrf": csrf}, headers={"Origin": "http://evil.example"}, follow_redirects=False
    )
    assert foreign.status_code == 403
    assert list(api.store.take_requests(0)[0]) == []  # nothing was asked of the loop
    done = api.client.post(url, data={"csrf": csrf}, headers={"Origin": BASE}, follow_redirects=False)
    assert done.status_code == 303
    assert [r.kind for r in api.store.take_requests(0)[0]] == [RequestKind.CANCEL]


def test_another_teams_job_is_404_and_admin_actions_are_refused(api: Api) -> None:
    theirs = submit(api, api.team_b, "team-b")
    _cookie, csrf = signed_in(api, api.team_a)
    assert api.client.get(f"/jobs/{theirs}").status_code == 404
    assert api.client.get(f"/jobs/{theirs}/log").status_code == 404
    cancel = api.client.post(f"/jobs/{theirs}/cancel", data={"csrf": csrf}, headers={"Origin": BASE})
    assert cancel.status_code == 404
    drain = api.client.post("/nodes/node-a/drain", data={"csrf": csrf}, headers={"Origin": BASE})
    assert drain.status_code == 403
    assert "needs an admin token" in drain.text
    assert theirs not in api.client.get("/jobs").text


def test_links_and_cookie_follow_the_forwarded_prefix(api: Api) -> None:
    form = api.client.get("/signin", headers={"X-Forwarded-Prefix": "/gf"})
    assert "path=/gf/" in form.headers["set-cookie"].lower()
    assert 'action="/gf/signin"' in form.text
    signed_in(api, api.admin)  # the browser test signs in through a real proxy; here the cookie is what matters
    page = api.client.get("/jobs", headers={"X-Forwarded-Prefix": "/gf"}).text
    links = re.findall(r'(?:href|src|action)="(/[^"]*)"', page)
    assert links
    assert all(link.startswith("/gf/") for link in links), [link for link in links if not link.startswith("/gf/")]
    bad = api.client.get("/jobs", headers={"X-Forwarded-Prefix": "https://evil.example/x"}).text
    assert "evil.example" not in bad  # not a path: ignored


def test_every_page_answer_carries_the_security_headers(api: Api) -> None:
    signed_in(api, api.admin)
    for path in ("/", "/queues", "/jobs", "/nodes", "/simulator", "/signin"):
        answer = api.client.get(path, follow_redirects=False)
        assert "script-src 'self'" in answer.headers["content-security-policy"], path
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["cache-control"] == "no-store"


def test_the_dashboards_javascript_stays_under_300_kb() -> None:
    total = sum(path.stat().st_size for path in STATIC_DIR.glob("*.js"))
    assert 0 < total < 300 * 1024, total


def test_cookie_parses_as_a_cookie(api: Api) -> None:
    cookie, _csrf = signed_in(api, api.admin)
    parsed = SimpleCookie()
    parsed.load(cookie)
    assert len(parsed["gpufleet_session"].value) >= 43  # a session id of 256 random bits


def test_the_cookie_is_a_session_id_not_the_token_and_opens_no_api(api: Api) -> None:
    cookie, _csrf = signed_in(api, api.admin)
    parsed = SimpleCookie()
    parsed.load(cookie)
    session_id = parsed["gpufleet_session"].value
    assert session_id != api.admin
    assert api.admin not in cookie
    assert not session_id.startswith("gf_")
    assert api.client.get("/jobs", follow_redirects=False).status_code == 200  # the session works in the browser
    stolen = api.client.get("/v1/jobs", headers={"Authorization": f"Bearer {session_id}"})
    assert stolen.status_code == 401  # and is no bearer token for the API
    assert api.client.get("/healthz", headers={"Authorization": f"Bearer {session_id}"}).status_code == 401


def test_a_raw_token_in_the_cookie_is_no_session(api: Api) -> None:
    """A cookie set to an API token (what the dashboard used to keep there) signs nobody in."""
    api.client.cookies.set("gpufleet_session", api.admin)
    answer = api.client.get("/jobs", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/signin?next=%2Fjobs")
    assert 'gpufleet_session=""' in answer.headers["set-cookie"]


def test_sign_out_ends_the_session_on_the_server(api: Api) -> None:
    cookie, csrf = signed_in(api, api.team_a)
    parsed = SimpleCookie()
    parsed.load(cookie)
    session_id = parsed["gpufleet_session"].value
    out = api.client.post("/signout", data={"csrf": csrf}, headers={"Origin": BASE}, follow_redirects=False)
    assert out.status_code == 303
    # A copy of the cookie kept elsewhere (another tab's jar, a proxy's log) opens nothing any more.
    api.client.cookies.clear()
    api.client.cookies.set("gpufleet_session", session_id)
    replayed = api.client.get("/jobs", follow_redirects=False)
    assert replayed.status_code == 303
    assert "why=ended" in replayed.headers["location"]


def test_a_new_session_has_a_new_csrf_token(api: Api) -> None:
    _cookie, first = signed_in(api, api.team_a)
    api.client.cookies.clear()
    _cookie, second = signed_in(api, api.team_a)
    assert first != second
    job_id = submit(api, api.team_a, "team-a")
    stale = api.client.post(f"/jobs/{job_id}/cancel", data={"csrf": first}, headers={"Origin": BASE})
    assert stale.status_code == 403


def test_sessions_expire_unused_and_at_most_after_their_lifetime() -> None:
    from gpufleet.server.web.security import SESSION_IDLE_S, SESSION_MAX_S, WebSessions

    now = [0.0]
    sessions = WebSessions(clock=lambda: now[0])
    idle = sessions.open("hash-a")
    busy = sessions.open("hash-b")
    now[0] = SESSION_IDLE_S / 2
    assert sessions.token_hash(busy) == "hash-b"
    now[0] = SESSION_IDLE_S + 1
    assert sessions.token_hash(idle) is None
    while now[0] < SESSION_MAX_S:
        assert sessions.token_hash(busy) == "hash-b"
        now[0] += SESSION_IDLE_S / 2
    assert sessions.token_hash(busy) is None
    assert len(sessions) == 0
    again = sessions.open("hash-c")
    assert sessions.close_token("hash-c") == 1
    assert sessions.token_hash(again) is None


def test_a_root_path_setting_prefixes_every_link(api: Api) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    # uvicorn's root_path (`gpufleet up --root-path /gpufleet`) reaches the app as the ASGI root_path
    with TestClient(api.client.app, root_path="/gpufleet") as client:  # type: ignore[arg-type]
        form = client.get("/signin")
        assert 'action="/gpufleet/signin"' in form.text
        assert "path=/gpufleet/" in form.headers["set-cookie"].lower()
        page = client.get("/jobs", follow_redirects=False)
        assert page.headers["location"] == "/gpufleet/signin?next=%2Fjobs"


def test_prefixes_are_plain_paths() -> None:
    from gpufleet.server.web.prefix import clean_prefix

    assert clean_prefix("/gpufleet/") == "/gpufleet"
    assert clean_prefix("gpufleet") == "/gpufleet"
    assert clean_prefix("/") == ""
    assert clean_prefix("") == ""
    assert clean_prefix("/a/b-c_d.e~f") == "/a/b-c_d.e~f"
    for bad in ("https://x", "/a/../b", "/a?b", "/a b", "//x/.."):
        assert clean_prefix(bad) is None, bad


def test_a_revoked_token_signs_the_browser_out_with_a_fixed_notice(api: Api) -> None:
    signed_in(api, api.team_a)
    team = next(t for t in api.store.tokens() if t.name == "alice")
    assert api.client.delete(f"/v1/tokens/{team.id}", headers=api.as_admin()).status_code == 200
    answer = api.client.get("/jobs", follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/signin?next=%2Fjobs&why=revoked"
    assert 'gpufleet_session=""' in answer.headers["set-cookie"]
    notice = api.client.get(answer.headers["location"]).text
    assert "no longer valid" in notice
    forged = api.client.get("/signin?why=Call+4242+to+unlock").text
    assert "4242" not in forged  # the page never shows text from its address


def test_after_sign_in_the_browser_goes_only_to_our_own_pages(api: Api) -> None:
    form = api.client.get("/signin")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
    assert nonce is not None
    for target, expected in (("//evil.example/x", "/"), ("https://evil.example", "/"), ("/jobs/j-1:a", "/jobs/j-1:a")):
        answer = api.client.post(
            "/signin",
            data={"token": api.admin, "nonce": nonce.group(1), "next": target},
            headers={"Origin": BASE},
            follow_redirects=False,
        )
        assert answer.headers["location"] == expected
        api.client.cookies.clear()
        form = api.client.get("/signin")
        nonce = re.search(r'name="nonce" value="([^"]+)"', form.text)
        assert nonce is not None


def test_a_control_plane_that_refuses_team_tokens_refuses_them_at_sign_in_as_the_api_does(api: Api) -> None:
    signed_in(api, api.team_a)  # a browser signed in while the control plane still accepted team tokens
    # The same store behind `gpufleet up` as a user that is not root, without --single-user.
    refusing = dataclasses.replace(api.ctx, team_tokens_refused="this control plane runs every job as its own user")
    with TestClient(create_app(refusing), raise_server_exceptions=False) as client:
        client.app.state.web_sessions = api.client.app.state.web_sessions
        client.cookies = api.client.cookies
        answer = client.get("/jobs", follow_redirects=False)
        assert answer.status_code == 303
        assert answer.headers["location"] == "/signin?next=%2Fjobs&why=team-refused"
        assert 'gpufleet_session=""' in answer.headers["set-cookie"]  # signed out, not stuck on an error page
        client.cookies.delete("gpufleet_session")
        notice = client.get(answer.headers["location"])
        assert notice.status_code == 200
        assert "refuses team tokens" in notice.text
        assert 'name="nonce"' in notice.text  # the form, to sign in with an admin token instead
        nonce = re.search(r'name="nonce" value="([^"]+)"', notice.text)
        assert nonce is not None
        refused = client.post("/signin", data={"token": api.team_a, "nonce": nonce.group(1)}, headers={"Origin": BASE})
        assert refused.status_code == 403
        assert "is refused: this control plane runs every job as its own user" in refused.text
        assert "--single-user" in refused.text
        assert "gpufleet_session=" not in refused.headers.get("set-cookie", "")
        api_call = client.get("/v1/jobs", headers=api.h(api.team_a))
        assert api_call.status_code == 403
        assert api_call.json()["message"].startswith("team token 'alice' is refused")
        nonce = re.search(r'name="nonce" value="([^"]+)"', refused.text)  # the form again, with a new nonce
        assert nonce is not None
        admin = client.post(
            "/signin",
            data={"token": api.admin, "nonce": nonce.group(1), "next": "/jobs"},
            headers={"Origin": BASE},
            follow_redirects=False,
        )
        assert admin.status_code == 303
        assert client.get("/jobs").status_code == 200
