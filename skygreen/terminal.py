"""Output that is not a terminal carries no ANSI escape codes.

SkyPilot colours its messages (colorama codes written whatever the output is), and a training
script may colour its own; piped into a file, a CI log or `grep`, those codes are noise. The
CLI wraps stdout and stderr with `PlainText` when they are not terminals, so everything
written through them, by skygreen or by a library in the same process, arrives plain.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Collection, Sequence
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
            import shutil  # only on a terminal: the plan path, piped, skips its import

            return shutil.get_terminal_size().columns
    except (AttributeError, ValueError):
        pass
    return None


def write_table(
    rows: Sequence[Sequence[str]],
    out: TextIO,
    *,
    width: int | None = None,
    indent: int = 0,
    right: Collection[int] = (),
) -> None:
    """Write `rows` (the first is the header) to `out` as a `rich.Table` without borders, columns
    two spaces apart, lines without trailing blanks.

    With `width`, the table fits in that many columns: rich narrows the widest cells and folds
    them onto more lines (never cut to `…`); None: every cell on one line, however wide.

    Args:
        rows: the header, then one tuple of cells per row, all of the same length.
        out: where the lines go.
        width: the most columns a line may take, the indent included.
        indent: spaces before every line.
        right: indexes of the columns aligned right (numbers, which never fold).
    """
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 2, 0, 0), header_style="none")
    for i, name in enumerate(rows[0]):
        numbers = i in right  # a number never folds; words do
        table.add_column(
            name, justify="right" if numbers else "left", overflow="fold", no_wrap=width is None or numbers
        )
    for row in rows[1:]:
        table.add_row(*row)
    buffer = io.StringIO()
    room = max(20, width - indent) if width is not None else 100_000
    Console(file=buffer, width=room, markup=False, emoji=False, highlight=False, color_system=None).print(table)
    pad = " " * indent
    out.write("".join(f"{pad}{line.rstrip()}\n" for line in buffer.getvalue().splitlines() if line.strip()))


def table_width(rows: Sequence[Sequence[str]], *, indent: int = 0) -> int:
    """How wide `write_table` draws `rows` when nothing folds: the widest cell of each column,
    two spaces between columns, and the indent."""
    widths = [max(len(line) for row in rows for line in row[i].splitlines() or [""]) for i in range(len(rows[0]))]
    return indent + sum(widths) + 2 * (len(widths) - 1)
