"""A request handler served on a loopback port, for tests of the AI client against answers
shaped by hand."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def served(handler: type[BaseHTTPRequestHandler], path: str) -> Iterator[str]:
    """The URL of `path` on a server running `handler` in a thread, until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{path}"
    finally:
        server.shutdown()
        server.server_close()
