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


def test_gpus_by_count_and_model_pick_whole_free_nodes_or_say_how_many_there_are(api: Api) -> None:
    # node-a: 4 A100-80GB; node-h: 2 H100.
    h100 = {"gpus": 2, "gpu_model": "H100", "start": 2_000, "end": 3_000, "maintenance": True}
    made = api.client.put("/v1/reservations/h", json=h100, headers=api.as_admin())
    assert made.status_code == 201, made.text
    assert made.json()["nodes"] == ["node-h"]
    # The H100 node is held then: asking again for another window at the same time finds none left.
    clash = api.client.put("/v1/reservations/h2", json=h100, headers=api.as_admin())
    assert clash.status_code == 422
    assert "asks for 2 GPUs of model H100" in clash.text
    assert "have 0" in clash.text
    later = api.client.put("/v1/reservations/h2", json={**h100, "start": 3_000, "end": 4_000}, headers=api.as_admin())
    assert later.status_code == 201
    both = api.client.put(
        "/v1/reservations/all",
        json={"gpus": 6, "start": 5_000, "end": 6_000, "queue": "team-b"},
        headers=api.as_admin(),
    )
    assert both.json()["nodes"] == ["node-a", "node-h"]
    neither = api.client.put(
        "/v1/reservations/x", json={"start": 5_000, "end": 6_000, "maintenance": True}, headers=api.as_admin()
    )
    assert neither.status_code == 422
    assert "either the nodes, or how many GPUs" in neither.text
