"""A loopback HTTP proxy that injects the faults object stores really produce.

Put it between a client and a test server (moto_server, gcp-storage-emulator) by pointing
the client's endpoint at `proxy.url`. Faults are queued with `inject` and consumed in order
by the requests that match:

- "403":       access denied (S3 `AccessDenied`, GCS 403 `forbidden`, Azure `AuthorizationFailure`),
               not forwarded;
- "500":       an InternalError answer, the request never reaches the server;
- "503":       throttling (S3 `SlowDown`, GCS 503 `rateLimitExceeded`, Azure `ServerBusy`), not forwarded;
- "drop":      the connection is reset after half of the request body is read;
- "drop_reply": the request IS forwarded and done by the server, then the connection is
               reset before the reply: the client cannot tell that it succeeded;
- "corrupt":   the request is forwarded and answered, with one byte of the reply body flipped
               (same length, same headers): bit rot in transit that only a hash can catch;
- "hang":      the request is read and held, never forwarded, until `release_hung()`, and then
               reset: a VM that dies in the middle of a request (tests gate on `hung`).

Every request is logged as (method, path, outcome) so tests can check what happened; a request
with a `Range` header is also logged in `ranges` as (path, range, outcome), and `inject(range_from=N)`
aims a fault at the ranged request that starts at byte N.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FAULTS = ("403", "500", "503", "drop", "drop_reply", "corrupt", "hang")
HANG_LIMIT_S = 600.0
"""A hung request is reset after this long even if nobody releases it."""
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}

_S3_BODIES = {
    "403": b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>",
    "500": b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
    b"<Message>We encountered an internal error. Please try again.</Message></Error>",
    "503": b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>",
}
_GCS_BODIES = {
    "403": b'{"error": {"code": 403, "message": "caller does not have storage.objects.create access", "errors": [{"reason": "forbidden"}]}}',
    "500": b'{"error": {"code": 500, "message": "Internal error. Please try again.", "errors": [{"reason": "backendError"}]}}',
    "503": b'{"error": {"code": 503, "message": "The service is currently unavailable.", "errors": [{"reason": "rateLimitExceeded"}]}}',
}
_AZURE_CODES = {"403": "AuthorizationFailure", "500": "InternalError", "503": "ServerBusy"}
_AZURE_BODIES = {
    status: f"<?xml version='1.0' encoding='utf-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
    for (status, code), message in zip(
        _AZURE_CODES.items(),
        (
            "This request is not authorized to perform this operation.",
            "Server encountered an internal error. Please try again after some time.",
            "The server is busy.",
        ),
        strict=True,
    )
}


@dataclass
class _Fault:
    kind: str
    times: int
    match: Callable[[str, str, str], bool]


class FaultProxy:
    """A threaded HTTP/1.1 proxy to `upstream` on a free 127.0.0.1 port."""

    def __init__(self, upstream: str, *, flavour: str = "s3") -> None:
        parts = urlsplit(upstream)
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port
        self.flavour = flavour
        self.log: list[tuple[str, str, str]] = []
        self.ranges: list[tuple[str, str, str]] = []
        """(path, Range header, outcome) of every ranged request, in arrival order."""
        self.bodies: list[tuple[str, str, bytes]] = []
        """(method, path, body) of forwarded requests with small bodies, for assertions."""
        self.bytes_forwarded = 0
        self.reply_mb_s: float | None = None
        """When set, each reply is sent at no more than this many MB/s per connection, as a
        cloud's front end serves one stream (benchmarks model the link with it)."""
        self.on_bytes: Callable[[int], None] | None = None
        """Called with the running upload byte count after each forwarded request body."""
        self.hung: list[str] = []
        """Paths of the requests "hang" holds or held, in arrival order."""
        self._released = threading.Event()
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release_hung()
        self._server.shutdown()
        self._server.server_close()

    def inject(
        self,
        kind: str,
        *,
        times: int = 1,
        method: str | None = None,
        path_contains: str | None = None,
        range_from: int | None = None,
        ranged: bool | None = None,
    ) -> None:
        """Queue `times` faults of `kind` for the next requests matching method/path, and with
        `range_from` only the ranged request from that byte, with `ranged` only requests with
        (True) or without (False) a `Range` header."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {FAULTS}")

        def match(m: str, p: str, r: str) -> bool:
            if range_from is not None and not r.startswith(f"bytes={range_from}-"):
                return False
            if ranged is not None and bool(r) != ranged:
                return False
            return (method is None or m == method) and (path_contains is None or path_contains in p)

        with self._lock:
            self._faults.append(_Fault(kind, times, match))

    def release_hung(self) -> None:
        """Reset every request "hang" holds now or later (none of them is forwarded)."""
        self._released.set()

    def pending(self) -> int:
        with self._lock:
            return sum(f.times for f in self._faults)

    def outcomes(self, kind: str) -> int:
        return sum(1 for _, _, outcome in self.log if outcome == kind)

    def ranged_requests(self, outcome: str | None = None, *, path_contains: str = "") -> list[str]:
        """The Range headers of ranged requests (with `outcome` only, to paths that contain
        `path_contains`), in arrival order."""
        return [r for p, r, o in self.ranges if (outcome is None or o == outcome) and path_contains in p]

    def _take_fault(self, method: str, path: str, range_header: str) -> str | None:
        with self._lock:
            for fault in self._faults:
                if fault.times > 0 and fault.match(method, path, range_header):
                    fault.times -= 1
                    if fault.times == 0:
                        self._faults.remove(fault)
                    return fault.kind
        return None

    def _handler_class(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _range(self) -> str:
                """The request's byte range: `Range`, or Azure's own `x-ms-range` (which its SDK sends)."""
                return self.headers.get("Range") or self.headers.get("x-ms-range") or ""

            def _record(self, outcome: str) -> None:
                proxy.log.append((self.command, self.path, outcome))
                if self._range():
                    with proxy._lock:
                        proxy.ranges.append((self.path, self._range(), outcome))

            def _handle(self) -> None:
                fault = proxy._take_fault(self.command, self.path, self._range())
                if fault == "drop":
                    length = int(self.headers.get("Content-Length") or 0)
                    self.rfile.read(length // 2)
                    self._record("drop")
                    self._reset()
                    return
                body = self._read_body()
                if fault == "hang":
                    self._record("hang")
                    with proxy._lock:
                        proxy.hung.append(self.path)
                    proxy._released.wait(HANG_LIMIT_S)
                    self._reset()
                    return
                if fault in ("403", "500", "503"):
                    self._record(fault)
                    self._answer_error(int(fault))
                    return
                forwarded = self._forward(body)
                if forwarded is None:
                    self._record("upstream_down")
                    return
                status, headers, reply = forwarded
                proxy.bytes_forwarded += len(body)
                if len(body) <= 64 * 1024:
                    proxy.bodies.append((self.command, self.path, body))
                if proxy.on_bytes is not None:
                    proxy.on_bytes(proxy.bytes_forwarded)
                if fault == "drop_reply":
                    self._record("drop_reply")
                    self._reset()
                    return
                if fault == "corrupt" and reply:
                    flipped = bytearray(reply)
                    flipped[len(flipped) // 2] ^= 0xFF
                    reply = bytes(flipped)
                self._record("corrupt" if fault == "corrupt" else str(status))
                self.send_response(status)
                # A HEAD reply has no body but carries the object's length, as the server sent it.
                keep_length = self.command == "HEAD"
                for name, value in headers:
                    if name.lower() not in _HOP_BY_HOP and (keep_length or name.lower() != "content-length"):
                        self.send_header(name, value)
                if not (keep_length and any(name.lower() == "content-length" for name, _ in headers)):
                    self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                if self.command != "HEAD":
                    self._send_paced(reply)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle

            def _read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self, body: bytes):
                conn = http.client.HTTPConnection(proxy.upstream_host or "127.0.0.1", proxy.upstream_port, timeout=120)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                    headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    return response.status, response.getheaders(), response.read()
                except OSError:
                    # The server is gone: the client sees the connection die, as it would.
                    self._reset()
                    return None
                finally:
                    conn.close()

            def _send_paced(self, reply: bytes) -> None:
                rate = proxy.reply_mb_s
                if rate is None:
                    self.wfile.write(reply)
                    return
                started, chunk = time.monotonic(), 256 * 1024
                for offset in range(0, len(reply), chunk):
                    self.wfile.write(reply[offset : offset + chunk])
                    ahead_s = (offset + chunk) / (rate * 1e6) - (time.monotonic() - started)
                    if ahead_s > 0:
                        time.sleep(ahead_s)

            def _answer_error(self, status: int) -> None:
                bodies = {"gcs": _GCS_BODIES, "azure": _AZURE_BODIES}.get(proxy.flavour, _S3_BODIES)
                body = bodies[str(status)]
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if proxy.flavour == "gcs" else "application/xml")
                self.send_header("Content-Length", str(len(body)))
                if proxy.flavour == "azure":
                    self.send_header("x-ms-error-code", _AZURE_CODES[str(status)])
                if status == 503:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(body)

            def _reset(self) -> None:
                """Close with RST (SO_LINGER 0), as a dying peer or middlebox does."""
                try:
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                except OSError:
                    pass
                self.close_connection = True

        return Handler
