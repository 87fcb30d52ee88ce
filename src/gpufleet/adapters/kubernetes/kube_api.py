"""The calls gpufleet makes to a Kubernetes API server, on the official client (imported here, lazily).

Every answer is read as plain JSON (`_preload_content=False`): the client's model classes cost more than the
rest of a bind, and their `V1Binding` answer cannot even be read back. Failures become `KubeApiError` with the
HTTP status, so callers decide by status (409 conflict, 404 gone, 410 expired, 429 a PodDisruptionBudget).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpufleet.domain.errors import GpufleetError

COMPONENT = "gpufleet"


class KubeApiError(Exception):
    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:300]}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def message(self) -> str:
        try:
            return str(json.loads(self.body).get("message", self.reason))
        except (ValueError, AttributeError):
            return self.reason


def _kubernetes() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise GpufleetError("the Kubernetes client is not installed", "pip install 'gpufleet[kubernetes]'") from None
    return kubernetes


class KubeApi:
    """One connection (a pool of them) to the API server, with the credentials of a kubeconfig or, with none, of
    the pod gpufleet runs in."""

    def __init__(self, kubeconfig: Path | None = None, *, pool_size: int = 32) -> None:
        k8s = _kubernetes()
        configuration = k8s.client.Configuration()
        try:
            if kubeconfig is not None:
                k8s.config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
            else:
                k8s.config.load_incluster_config(client_configuration=configuration)
        except (k8s.config.ConfigException, OSError, TypeError, ValueError) as error:
            where = str(kubeconfig) if kubeconfig is not None else "the pod's service account (in-cluster)"
            raise GpufleetError(
                f"cannot read Kubernetes credentials from {where}: {error}",
                "give the path of a kubeconfig: gpufleet up --kubernetes PATH",
            ) from None
        configuration.connection_pool_maxsize = pool_size
        self.server = configuration.host
        self._client = k8s.client.ApiClient(configuration)
        self._exception = k8s.client.exceptions.ApiException

    def close(self) -> None:
        self._client.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        query: Mapping[str, object] | None = None,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
    ) -> Any:
        """One request; the answer's JSON (or its text when it is not JSON)."""
        response = self._request(method, path, body=body, query=query, content_type=content_type, timeout_s=timeout_s)
        data = response.data
        try:
            return json.loads(data) if data else None
        except ValueError:
            return data.decode(errors="replace")

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        query: Mapping[str, object] | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = 30.0,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        try:
            method, url, headers, payload, _ = self._client.param_serialize(
                method, path, query_params=params, header_params=headers, body=body, auth_settings=["BearerToken"]
            )
            response = self._client.call_api(method, url, headers, payload, _request_timeout=timeout_s).response
        except self._exception as error:
            raise KubeApiError(int(error.status or 0), str(error.reason), str(error.body or "")) from None
        except Exception as error:  # urllib3's errors (refused, timed out, TLS) share no base importable lazily
            raise KubeApiError(0, f"API server unreachable: {type(error).__name__}: {error}") from None
        if response.status >= 300:
            text = response.data.decode(errors="replace") if response.data else ""
            raise KubeApiError(response.status, str(response.reason), text)
        return response

    def list(self, path: str, **query: object) -> dict[str, Any]:
        answer = self.call("GET", path, query=query, timeout_s=120.0)
        assert isinstance(answer, dict)
        return answer

    def watch(
        self, path: str, resource_version: str, timeout_s: int = 300, field_selector: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """The events of a watch from `resource_version`, with bookmarks, until the server ends it."""
        query: dict[str, object] = {
            "fieldSelector": field_selector,
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_s,
        }
        response = self._request("GET", path, query=query, timeout_s=timeout_s + 30)
        buffer = b""
        try:
            for chunk in response.stream(65536, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        except Exception as error:  # a connection cut mid-stream: the caller watches again from its version
            if isinstance(error, GeneratorExit):
                raise
            raise KubeApiError(0, f"watch ended: {type(error).__name__}") from None
        finally:
            response.release_conn()

    def bind(self, namespace: str, pod: str, node: str, uid: str = "") -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        if uid:
            # Binds this pod and no other of the same name made since (a deleted and recreated pod).
            body["metadata"]["uid"] = uid
        self.call("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/binding", body=body)

    def evict(self, namespace: str, pod: str, grace_s: int) -> None:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
            "deleteOptions": {"gracePeriodSeconds": grace_s},
        }
        self.call("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", body=body)

    def delete_pod(self, namespace: str, pod: str, grace_s: int | None = None) -> None:
        body = {"gracePeriodSeconds": grace_s} if grace_s is not None else None
        self.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{pod}", body=body)

    def pod_condition(self, namespace: str, pod: str, reason: str, message: str) -> None:
        """`PodScheduled=False` with gpufleet's reason: what `kubectl describe pod` and `get pods` show."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        patch = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": now,
                    }
                ]
            }
        }
        self.call(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{pod}/status",
            body=patch,
            content_type="application/strategic-merge-patch+json",
        )

    def event(self, namespace: str, pod: str, uid: str, kind: str, reason: str, message: str) -> None:
        """An Event on the pod, as kube-scheduler writes them (`kubectl describe pod` lists them)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{pod}.", "namespace": namespace},
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": pod, "uid": uid, "apiVersion": "v1"},
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.call("POST", f"/api/v1/namespaces/{namespace}/events", body=body)

    def apply(self, path: str, body: Mapping[str, Any]) -> Any:
        """Server-side apply of an object gpufleet owns (field manager `gpufleet`)."""
        return self.call(
            "PATCH",
            path,
            body=json.dumps(body),
            query={"fieldManager": COMPONENT, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    def create(self, path: str, body: Mapping[str, Any]) -> Any:
        return self.call("POST", path, body=body)

    def pod_log(self, namespace: str, pod: str, tail_bytes: int | None = None) -> str:
        query: dict[str, object] = {}
        if tail_bytes is not None:
            query["limitBytes"] = tail_bytes
        answer = self.call("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}/log", query=query)
        return answer if isinstance(answer, str) else json.dumps(answer)
