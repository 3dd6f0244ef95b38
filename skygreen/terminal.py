"""Output that is not a terminal carries no ANSI escape codes.

SkyPilot colours its messages (colorama codes written whatever the output is), and a training
script may colour its own; piped into a file, a CI log or `grep`, those codes are noise. The
CLI wraps stdout and stderr with `PlainText` when they are not terminals, so everything
written through them, by skygreen or by a library in the same process, arrives plain.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import TextIO

ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
"""CSI sequences (colours, cursor moves), OSC sequences (titles, links) and two-byte escapes."""


def strip_ansi(text: str) -> str:
    """`text` without the escape sequences `ANSI_ESCAPE` matches."""
    return ANSI_ESCAPE.sub("", text)


class PlainText:
    """A text stream that drops ANSI escapes on the way to the one it wraps."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        """Write `text` without escapes; returns the length of `text` as given, so a caller that
        checks the count sees everything it wrote taken."""
        self.wrapped.write(strip_ansi(text))
        return len(text)

    def writelines(self, lines) -> None:
        """Each line through `write`, so none keeps its escapes."""
        for line in lines:
            self.write(line)

    def isatty(self) -> bool:
        """Always False, so libraries that colour only on a terminal do not colour at all."""
        return False

    def __getattr__(self, name: str):
        return getattr(self.wrapped, name)


def plain_unless_terminal(stream: TextIO) -> TextIO:
    """`stream` itself on a terminal; otherwise the same stream without escape codes."""
    try:
        if stream.isatty():
            return stream
    except (AttributeError, ValueError):
        pass
    return PlainText(stream)  # type: ignore[return-value]


def output_width(stream: TextIO) -> int | None:
    """How many columns a table written to `stream` may use: `$COLUMNS` when set (as `plan`
    honours it), the terminal's width on a terminal, None (no limit) when piped, so a file or
    `grep` gets every column."""
    raw = os.environ.get("COLUMNS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    try:
        if stream.isatty():
            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError):
        pass
    return None
