"""A loopback HTTP server that answers like AWS, GCP and Azure instance metadata endpoints.

It enforces what the real endpoints enforce (IMDSv2 session tokens on AWS, the
`Metadata-Flavor: Google` and `Metadata: true` headers), counts requests, and its notice can
be raised or cleared while a test runs.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

AWS_TOKEN = "AQAEAexampletoken=="


class MetadataServer:
    def __init__(self, cloud: str) -> None:
        self.cloud = cloud
        self.notice = False
        self.azure_event_type = "Preempt"
        self.azure_events: object = None
        """When not None, Azure answers this as its `Events` value, whatever it is (a malformed answer)."""
        self.polls = 0
        self.rejected = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> MetadataServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, status: int, body: str, content_type: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                if server.cloud == "aws" and self.path == "/latest/api/token":
                    if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                        server.rejected += 1
                        return self._send(400, "missing TTL header")
                    return self._send(200, AWS_TOKEN)
                self._send(404, "not found")

            def do_GET(self):
                handler = getattr(self, f"_{server.cloud}")
                handler()

            def _aws(self):
                if self.path != "/latest/meta-data/spot/instance-action":
                    return self._send(404, "not found")
                if self.headers.get("X-aws-ec2-metadata-token") != AWS_TOKEN:
                    server.rejected += 1
                    return self._send(401, "")
                server.polls += 1
                if not server.notice:
                    return self._send(404, "<?xml version='1.0'?><Error>Not Found</Error>")
                self._send(200, json.dumps({"action": "terminate", "time": "2026-11-29T20:00:00Z"}), "application/json")

            def _gcp(self):
                if self.path != "/computeMetadata/v1/instance/preempted":
                    return self._send(404, "not found")
                if self.headers.get("Metadata-Flavor") != "Google":
                    server.rejected += 1
                    return self._send(403, "Missing Metadata-Flavor:Google header.")
                server.polls += 1
                self._send(200, "TRUE" if server.notice else "FALSE")

            def _azure(self):
                if self.path != "/metadata/scheduledevents?api-version=2020-07-01":
                    return self._send(400, json.dumps({"error": "Bad request"}))
                if self.headers.get("Metadata") != "true":
                    server.rejected += 1
                    return self._send(400, json.dumps({"error": "Bad request. Required metadata header not specified"}))
                server.polls += 1
                events = []
                if server.notice:
                    events.append(
                        {
                            "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
                            "EventType": server.azure_event_type,
                            "ResourceType": "VirtualMachine",
                            "Resources": ["vm-0"],
                            "EventStatus": "Scheduled",
                            "NotBefore": "Sun, 29 Nov 2026 20:00:30 GMT",
                            "Description": "",
                            "EventSource": "Platform",
                            "DurationInSeconds": -1,
                        }
                    )
                if server.azure_events is not None:
                    events = server.azure_events  # type: ignore[assignment]
                self._send(200, json.dumps({"DocumentIncarnation": 2, "Events": events}), "application/json")

        return Handler
