"""A small reverse proxy for tests: serves the control plane under a path prefix, as nginx's
`location /gf/ { proxy_pass http://backend/; proxy_set_header Host $host;
proxy_set_header X-Forwarded-Prefix /gf; }` does. Real HTTP on loopback, one thread per connection."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class PrefixProxy:
    def __init__(self, backend_port: int, prefix: str = "/gf") -> None:
        self.prefix = prefix
        backend = backend_port
        prefix_ = prefix

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: object) -> None:  # quiet
                return

            def _forward(self) -> None:
                if not (self.path == prefix_ or self.path.startswith(prefix_ + "/")):
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path = self.path[len(prefix_) :] or "/"
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                headers["X-Forwarded-Prefix"] = prefix_
                connection = http.client.HTTPConnection("127.0.0.1", backend, timeout=30)
                try:
                    connection.request(self.command, path, body=body, headers=headers)
                    answer = connection.getresponse()
                    data = answer.read()
                    self.send_response(answer.status, answer.reason)
                    for name, value in answer.getheaders():
                        if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    connection.close()

            do_GET = do_POST = do_PUT = do_DELETE = _forward  # noqa: N815 - http.server's method names

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{prefix}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
