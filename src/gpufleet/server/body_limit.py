"""A cap on the size of request bodies (413 with a clear message), checked before anything is parsed: by
its declared `Content-Length` at once, and by counting as it arrives for a body sent in chunks."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def too_large_message(limit: int) -> str:
    return (
        f"the request body is larger than {limit // 1024} KiB, the most this API accepts; to fix: send a smaller "
        "request (a job's long inputs belong in files it reads, not in its command or environment)"
    )


class BodyLimit:
    """ASGI middleware: refuse request bodies over `limit` bytes with 413."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await _refuse(send, self.limit)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # An HTTPException is passed on by FastAPI's body reader, to our handler of them.
                    raise HTTPException(413, too_large_message(self.limit))
            return message

        await self.app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Send, limit: int) -> None:
    body = json.dumps({"code": "body_too_large", "message": too_large_message(limit), "fields": []}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
