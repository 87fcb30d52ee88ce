"""Serving under a path prefix behind a reverse proxy: `--root-path` (uvicorn's root_path) or the proxy's
`X-Forwarded-Prefix` header. Both end up as the request's ASGI `root_path`, which every link, form, asset
and the sign-in cookie's path are built from."""

from __future__ import annotations

import re
from typing import Any

_SEGMENTS = re.compile(r"(/[A-Za-z0-9._~-]+)*")


def clean_prefix(text: str) -> str | None:
    """`/gpufleet`, `gpufleet/` and `/gpufleet/` are the prefix `/gpufleet`; empty or `/` is none (`""`);
    anything that is not a plain path (a scheme, a query, `..`) is None."""
    text = text.strip()
    if text in ("", "/"):
        return ""
    path = "/" + text.strip("/")
    if not _SEGMENTS.fullmatch(path) or any(part in (".", "..") for part in path.split("/")):
        return None
    return path


class ForwardedPrefix:
    """ASGI middleware: a valid `X-Forwarded-Prefix` becomes the request's `root_path`.

    The header only shapes the links of the answer to the request that carried it, so a client that
    forges one misleads nobody but itself."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for name, value in scope.get("headers", ()):
                if name == b"x-forwarded-prefix":
                    prefix = clean_prefix(value.decode("latin-1"))
                    if prefix:
                        scope = {**scope, "root_path": prefix}
                    break
        await self.app(scope, receive, send)
