"""Ray's token authentication as gpufleet uses it.

Every Ray cluster gpufleet starts runs with `RAY_AUTH_MODE=token`: its GCS, raylets and agents refuse any call
without the cluster's token (HTTP 401 "Missing authentication token", gRPC UNAUTHENTICATED). The token lives in
a file of mode 0600 owned by the engine's user (root) in gpufleet's data folder, never in `~/.ray/auth_token`
(which `ray get-auth-token --generate` writes world-readable), and never in an environment variable (a job
inherits and `ps e` shows those): Ray finds it through `RAY_AUTH_TOKEN_PATH`.

A cluster gpufleet joins (`up --ray ADDRESS`) must have authentication on: `probe_auth` calls its GCS without a
token and expects a refusal.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from gpufleet.domain.errors import GpufleetError

MODE_ENV = "RAY_AUTH_MODE"
PATH_ENV = "RAY_AUTH_TOKEN_PATH"
TOKEN_ENV = "RAY_AUTH_TOKEN"


def new_token_file(path: Path) -> Path:
    """Write a fresh token to `path` (mode 0600, created that way, never readable by others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
    return path


def check_private(path: Path) -> None:
    """Raise a GpufleetError unless `path` is a token file only its owner can read."""
    try:
        info = path.stat()
    except OSError as error:
        raise GpufleetError(
            f"cannot read the Ray token file {path}: {error.strerror or error}",
            "give the file the cluster was started with (RAY_AUTH_TOKEN_PATH) as --ray-token-file",
        ) from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise GpufleetError(
            f"the Ray token file {path} is readable by other users (mode {stat.S_IMODE(info.st_mode):o}): any "
            "local process, a job included, could take over the cluster with it",
            f"chmod 600 {path}",
        )


def env_for(token_path: Path) -> dict[str, str]:
    """The environment of a Ray process (daemon or client) of a cluster with that token."""
    return {MODE_ENV: "token", PATH_ENV: str(token_path)}


def use_token(token_path: Path) -> None:
    """Make this process's Ray client authenticate with the token in `token_path` (before `ray.init`)."""
    os.environ.pop(TOKEN_ENV, None)
    os.environ.update(env_for(token_path))
    _refresh()


def no_token() -> None:
    """This process's Ray client calls without a token (a cluster joined with --ray-insecure)."""
    os.environ.pop(TOKEN_ENV, None)
    os.environ.pop(PATH_ENV, None)
    os.environ[MODE_ENV] = "disabled"
    _refresh()


def _refresh() -> None:
    # Ray reads its mode and token once per process (its config and the token loader cache them).
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def probe_auth(address: str, timeout_s: float = 5.0) -> bool:
    """Whether the Ray cluster whose GCS is at `address` (HOST:PORT) refuses a call without a token."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=timeout_s)  # type: ignore[attr-defined]
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.UNAUTHENTICATED:
                return True
            raise GpufleetError(
                f"cannot ask the Ray cluster at {address} whether it needs a token: {error.code().name}",
                "check the address (`ray status` on its head node prints it)",
            ) from None
    return False
