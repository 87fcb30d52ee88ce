"""The way to the control plane, for the SDK and the CLI alike: where it is (argument, environment, config
file), and an HTTP transport whose every failure is a `GpufleetError` with a fix, never a traceback."""

from __future__ import annotations

import json
import os
import random
import time
import tomllib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx

from gpufleet.domain.errors import FieldProblem, GpufleetError, SpecError

URL_ENV = "GPUFLEET_URL"
TOKEN_ENV = "GPUFLEET_TOKEN"
CONFIG_ENV = "GPUFLEET_CLIENT_CONFIG"
DEFAULT_URL = "http://127.0.0.1:8080"
IDEMPOTENCY_HEADER = "Idempotency-Key"


def config_path() -> Path:
    """`~/.config/gpufleet/client.toml` (platformdirs), or the file named by GPUFLEET_CLIENT_CONFIG."""
    override = os.environ.get(CONFIG_ENV)
    if override:
        return Path(override).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir("gpufleet")) / "client.toml"


def read_config(path: Path | None = None) -> dict[str, str]:
    file = path or config_path()
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as error:
        raise GpufleetError(
            f"cannot read the client config {file}: {error}",
            "fix it, or write it again with `gpufleet login URL TOKEN`",
        ) from None
    return {k: str(v) for k, v in data.items() if k in ("url", "token")}


def write_config(url: str, token: str, path: Path | None = None) -> Path:
    """Save URL and token for later commands; the file is readable by its owner only (it holds a secret)."""
    file = path or config_path()
    if not file.parent.exists():
        file.parent.mkdir(mode=0o700, parents=True)  # its folder is private too (others cannot even list it)
    # json.dumps of a str is a valid TOML basic string.
    text = f"url = {json.dumps(url)}\ntoken = {json.dumps(token)}\n"
    descriptor = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(file, 0o600)
    return file


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None


def resolve(url: str | None, token: str | None, *, environment: bool = False) -> Target:
    """Given, then (with `environment`: the CLI's Typer reads it into its options) GPUFLEET_URL and
    GPUFLEET_TOKEN, then the config file, then the default."""
    if environment:
        url = url or os.environ.get(URL_ENV) or None
        token = token or os.environ.get(TOKEN_ENV) or None
    saved = read_config() if url is None or token is None else {}
    return Target((url or saved.get("url") or DEFAULT_URL).rstrip("/"), token or saved.get("token") or None)


class ApiError(GpufleetError):
    """An error answer of the API, as the user should read it."""

    def __init__(self, status: int, code: str, message: str, fields: tuple[FieldProblem, ...] = ()) -> None:
        self.status = status
        self.code = code
        self.fields = fields
        super().__init__(message)


class Transport:
    """HTTP calls to the control plane's API (`/v1/...`), answers as decoded JSON."""

    def __init__(self, target: Target, timeout: float = 30.0) -> None:
        self.target = target
        headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
        self._http = httpx.Client(base_url=target.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Any = None,
        headers: dict[str, str] | None = None,
        retry_s: float = 0.0,
        on_retry: Callable[[str], None] | None = None,
    ) -> Any:
        """One API call; its answer's body, or a GpufleetError. With `retry_s`, a call that could not reach the
        control plane, lost its connection, or got 429/503 is sent again (with the same headers, so an
        idempotency key makes that safe) until `retry_s` seconds have passed."""
        deadline = time.monotonic() + retry_s
        pause = 0.2
        told = False
        while True:
            try:
                response = self._send(method, path, json_body, params, headers)
            except GpufleetError as error:
                if time.monotonic() + pause > deadline:
                    raise
                why = error.message
            else:
                retry_after = _retry_after(response)
                if retry_after is None or time.monotonic() + retry_after > deadline:
                    return self._answer(response)
                pause = max(pause, retry_after)
                why = f"the control plane answered {response.status_code}"
            if on_retry is not None and not told:
                on_retry(f"{why}; retrying for up to {retry_s:g} s")
                told = True
            time.sleep(pause * random.uniform(1.0, 1.25))
            pause = min(pause * 2, 5.0)

    def _send(
        self, method: str, path: str, json_body: Any, params: Any, headers: dict[str, str] | None
    ) -> httpx.Response:
        try:
            return self._http.request(method, path, json=json_body, params=params, headers=headers)
        except httpx.ConnectError:
            raise GpufleetError(
                f"cannot reach the control plane at {self.target.url}",
                f"start it with `gpufleet up`, or point to it with --url or {URL_ENV}",
            ) from None
        except httpx.TimeoutException:
            raise GpufleetError(
                f"the control plane at {self.target.url} did not answer in time", "check that it runs, then retry"
            ) from None
        except httpx.HTTPError as error:
            raise GpufleetError(
                f"cannot talk to the control plane at {self.target.url}: {error}", f"check --url / {URL_ENV}"
            ) from None

    def _answer(self, response: httpx.Response) -> Any:
        if response.status_code == 204:
            return None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success:
            return body
        raise self._error(response.status_code, body)

    def _error(self, status: int, body: Any) -> GpufleetError:
        if not isinstance(body, dict) or "message" not in body:
            return GpufleetError(
                f"the server at {self.target.url} answered {status} without a gpufleet error",
                "check that --url points to a gpufleet control plane",
            )
        fields = tuple(
            FieldProblem(str(f.get("field", "")), str(f.get("problem", "")), str(f.get("fix", "")))
            for f in body.get("fields") or ()
            if isinstance(f, dict)
        )
        if status == 422 and fields:
            return SpecError(_what(str(body["message"])), fields)
        message = str(body["message"])
        if status == 401 and self.target.token is None:
            message += f" (no token given; pass --token, set {TOKEN_ENV}, or run `gpufleet login URL TOKEN`)"
        return ApiError(status, str(body.get("code", "")), message, fields)

    def download(self, path: str, destination: Path) -> None:
        """POST `path` and stream the answer's body into `destination` (an error answer is raised)."""
        try:
            with self._http.stream("POST", path) as response:
                if not response.is_success:
                    response.read()
                    self._answer(response)
                with destination.open("wb") as out:
                    for chunk in response.iter_bytes(1 << 20):
                        out.write(chunk)
        except httpx.TransportError as error:
            raise GpufleetError(
                f"the download from {self.target.url} broke off: {error}",
                "check that the control plane runs, then retry",
            ) from None

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None} or None)

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, json_body=body)


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds to wait before sending again, for answers that ask for it (429, 503); None for the others."""
    if response.status_code not in (429, 503):
        return None
    try:
        return max(0.0, float(response.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0


def new_idempotency_key() -> str:
    """A fresh key for one submit: its retries send the same one."""
    return str(uuid.uuid4())


def _what(message: str) -> str:
    # "invalid job spec: gpus: …" -> "job spec"; the fields carry the details.
    head = message.split(":", 1)[0]
    return head.removeprefix("invalid ").strip() or "request"


def save_client_config(url: str, token: str, *, overwrite: bool = True) -> Path | None:
    """Write the client config (as `gpufleet login` does); with `overwrite=False`, keep an existing file and
    return None. Returns the path written."""
    path = config_path()
    if not overwrite and path.exists():
        return None
    return write_config(url, token, path)
