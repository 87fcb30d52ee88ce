"""`/v1/reservations`: admins hold nodes for a queue or for maintenance; every bad request is refused whole with the
field and a fix, and the loop sees the window (the cluster version moves)."""

from __future__ import annotations

from tests.server.conftest import Api


def test_an_admin_creates_lists_replaces_and_deletes_a_maintenance_window(api: Api) -> None:
    before = api.store.cluster_version()
    body = {"nodes": ["node-a"], "start": 2_000, "end": "1970-01-01T01:00:00Z", "maintenance": True}
    created = api.client.put("/v1/reservations/fw-upgrade", json=body, headers=api.as_admin())
    assert created.status_code == 201, created.text
    assert created.json()["state"] == "upcoming"
    assert created.json()["end"].startswith("1970-01-01T01:00:00")
    assert api.store.cluster_version() > before
    assert api.wakes
    (window,) = api.store.windows()
    assert (window.name, window.nodes, window.start, window.end, window.queue) == (
        "fw-upgrade", ("node-a",), 2_000.0, 3_600.0, None,
    )  # fmt: skip
    again = api.client.put("/v1/reservations/fw-upgrade", json={**body, "nodes": ["node-h"]}, headers=api.as_admin())
    assert again.status_code == 200
    listed = api.client.get("/v1/reservations", headers=api.h(api.team_a)).json()["reservations"]
    assert [(r["name"], r["nodes"]) for r in listed] == [("fw-upgrade", ["node-h"])]
    assert api.client.delete("/v1/reservations/fw-upgrade", headers=api.as_admin()).status_code == 204
    assert api.store.windows() == ()
    missing = api.client.delete("/v1/reservations/fw-upgrade", headers=api.as_admin())
    assert missing.status_code == 404
    assert "gpufleet reservation list" in missing.json()["message"] + str(missing.json())


def test_a_team_token_may_look_but_not_hold_nodes(api: Api) -> None:
    body = {"nodes": ["node-a"], "start": 2_000, "end": 3_000, "queue": "team-a"}
    refused = api.client.put("/v1/reservations/mine", json=body, headers=api.h(api.team_a))
    assert refused.status_code == 403
    assert api.store.windows() == ()


def test_bad_reservations_are_refused_whole_with_each_problem_named(api: Api) -> None:
    cases = [
        ({"nodes": ["node-x"], "start": 2_000, "end": 3_000, "maintenance": True}, "node-x"),
        ({"nodes": ["node-a"], "start": 2_000, "end": 3_000, "queue": "team-z"}, "team-z"),
        ({"nodes": ["node-a"], "start": 10, "end": 20, "maintenance": True}, "in the past"),
        ({"nodes": ["node-a"], "start": 3_000, "end": 2_000, "maintenance": True}, "not after the start"),
        ({"nodes": ["node-a"], "start": 2_000, "end": 3_000}, "either a queue"),
        ({"nodes": ["node-a"], "start": 2_000, "end": 3_000, "queue": "team-a", "maintenance": True}, "either a queue"),
        ({"nodes": [], "start": 2_000, "end": 3_000, "maintenance": True}, "nodes"),
    ]
    for body, words in cases:
        answer = api.client.put("/v1/reservations/bad", json=body, headers=api.as_admin())
        assert answer.status_code == 422, (body, answer.text)
        assert words in answer.text, (body, answer.text)
    assert api.client.put("/v1/reservations/Bad_Name", json=cases[0][0], headers=api.as_admin()).status_code == 422
    assert api.store.windows() == ()
