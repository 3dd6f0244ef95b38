"""moto_server, except that a ranged GET reads only its range, as S3 serves it.

moto (5.2) answers a GET with a `Range` header by reading the whole object out of its buffer
(`FakeKey.value`, under the object's lock), copying it, and slicing the range from the copy. A
download in 16 MiB ranges of a 1.4 GB blob then costs the server 88 whole-object copies, one at
a time: a benchmark of ranged downloads against it measures moto, not the client. This module
runs the same server with one change: for a GET that carries a `Range` header, `FakeKey.value`
hands back a view whose slice reads just that range from the buffer (under the same lock). Every
other request, and every other use of `FakeKey.value`, is untouched: the HTTP layer, auth, the
range parsing and the 206 answer are moto's own.

Run: python benchmarks/moto_ranged.py -H 127.0.0.1 -p PORT   (moto_server's arguments), or
`s3_server("moto-ranged")` from a benchmark.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from moto.s3.models import FakeKey
from moto.s3.responses import S3Response

_ranged_get = threading.local()


class RangeView:
    """The bytes of a key, read on slicing: `len()` is the size, `view[a:b]` reads `b - a` bytes."""

    def __init__(self, key: FakeKey) -> None:
        self._key = key

    def __len__(self) -> int:
        return int(self._key.size)

    def __getitem__(self, index: slice) -> bytes:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("RangeView reads contiguous slices only")
        start, stop, _ = index.indices(len(self))
        with self._key.lock:
            self._key._value_buffer.seek(start)
            return self._key._value_buffer.read(max(0, stop - start))


_value_property: property = FakeKey.__dict__["value"]
_whole_value = _value_property.fget


def _value(self: FakeKey) -> Any:
    if getattr(_ranged_get, "active", False):
        return RangeView(self)
    assert _whole_value is not None
    return _whole_value(self)


_key_response = S3Response.key_response


def _key_response_ranged(self: S3Response, request: Any, full_url: str, headers: dict[str, Any]) -> Any:
    _ranged_get.active = request.method == "GET" and bool(request.headers.get("range"))
    try:
        status, response_headers, body = _key_response(self, request, full_url, headers)
    finally:
        _ranged_get.active = False
    if isinstance(body, RangeView):  # a range moto answers whole (several ranges, unparsable)
        body = body[:]
    return status, response_headers, body


def s3_server(name: str) -> Any:
    """The loopback S3 server a benchmark runs (`tests/servers.py`'s `ServerProcess`): `moto` as
    released, or `moto-ranged`, this module's."""
    from servers import ServerProcess, moto_process

    if name == "moto":
        return moto_process()
    script = str(Path(__file__).resolve())
    return ServerProcess(
        "moto_server (ranges read alone)", lambda port: [sys.executable, script, "-H", "127.0.0.1", "-p", str(port)]
    )


def patch() -> None:
    """Make ranged GETs read their range only (idempotent)."""
    FakeKey.value = property(_value, _value_property.fset)  # type: ignore[method-assign,assignment]
    S3Response.key_response = _key_response_ranged  # type: ignore[method-assign]


if __name__ == "__main__":
    patch()
    from moto.server import main

    main(sys.argv[1:])
