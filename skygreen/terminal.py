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
    if raw.isdecimal() and int(raw) > 0:
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
    room = max(20, width - indent) if width is not None else 100_000
    words = _word_widths(rows, room)
    natural = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    squeeze = sum(natural) + 2 * (len(natural) - 1) > room  # then word columns wrap at their longest word
    for i, name in enumerate(rows[0]):
        numbers = i in right  # a number never folds; words do, at word boundaries
        table.add_column(name, justify="right" if numbers else "left", overflow="fold",
                         no_wrap=width is None or numbers, min_width=words[i],
                         max_width=words[i] if squeeze and not numbers else None)  # fmt: skip
    for row in rows[1:]:
        table.add_row(*row)
    buffer = io.StringIO()
    Console(file=buffer, width=room, markup=False, emoji=False, highlight=False, color_system=None).print(table)
    pad = " " * indent
    out.write("".join(f"{pad}{line.rstrip()}\n" for line in buffer.getvalue().splitlines() if line.strip()))


def _word_widths(rows: Sequence[Sequence[str]], room: int) -> list[int]:
    """Each column's longest word, so rich wraps its cells between words and never inside one
    ("early-st" / "opped"); where the words alone overflow `room`, the widest columns give way first."""
    widths = [max(len(word) for row in rows for word in (str(row[i]).split() or [""])) for i in range(len(rows[0]))]
    while sum(widths) + 2 * (len(widths) - 1) > room and max(widths) > 1:
        widest = widths.index(max(widths))
        widths[widest] -= 1
    return widths


BOX_HEAVY_HEAD = ("┏━┳┓", "┃┃┃", "┡━╇┩", "│││", "└─┴┘")
"""rich's `box.HEAVY_HEAD`: top, header walls, under the header, row walls, bottom."""

_WORD = re.compile(r"\s*\S+\s*")


def wrap_words(text: str, width: int) -> list[str]:
    """`text` broken into lines of at most `width` columns where rich's `Console.print` breaks it.

    The plan prints without rich (its import and drawing were a third of `skygreen plan`'s CPU
    time), and its output must not change for that: a word keeps the blanks after it, a line
    breaks before the first word that does not fit, and a word longer than a line is cut into
    lines of `width` (rich's `divide_line` with `fold`). ASCII only: each character one column.
    """
    lines: list[str] = []
    line = ""
    for word in _WORD.findall(text) or [text]:
        if len(line) + len(word.rstrip()) <= width:
            line += word
            continue
        if line:
            lines.append(line)
        if len(word.rstrip()) > width:  # cut whole, blanks after it included, as rich chops it
            chunks = [word[i : i + width] for i in range(0, len(word), width)]
            lines.extend(chunks[:-1])
            word = chunks[-1]
        line = word
    lines.append(line)
    return [part[:width] if len(part) > width and not part[width:].strip() else part for part in lines]


def box_table_lines(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int], *, styled: bool
) -> list[str]:
    """A table drawn as rich draws `Table(title=..., title_justify="left", header_style="bold")`
    with its default box, for cells that never fold: each column as wide as its widest header
    line or cell, one blank each side, headers of several lines (`"on-demand\n$/h"`) bottom-aligned.

    `styled` (a terminal): the title in italics and the headers in bold, as ANSI codes; piped
    output gets none. ASCII cells without blanks at either end, as the plan's are (see `wrap_words`).
    """
    header_lines = [header.split("\n") for header in headers]
    depth = max(len(lines) for lines in header_lines)
    widths = [
        max([*(len(line) for line in header_lines[i]), *(len(row[i]) for row in rows)]) for i in range(len(headers))
    ]
    table_width = sum(widths) + 3 * len(widths) + 1

    def cells(values: Sequence[str], bold: bool) -> list[str]:
        out = []
        for i, value in enumerate(values):
            text = value.rjust(widths[i]) if i in right else value.ljust(widths[i])
            out.append(f" \x1b[1m{text}\x1b[0m " if bold and styled and value else f" {text} ")
        return out

    def rule(edges: str) -> str:
        return edges[0] + edges[2].join(edges[1] * (w + 2) for w in widths) + edges[3]

    top, head, under, body, bottom = BOX_HEAVY_HEAD
    lines = [
        f"\x1b[3m{line}\x1b[0m" if styled else line for line in _padded(wrap_words(title, table_width), table_width)
    ]
    lines.append(rule(top))
    for depth_i in range(depth):
        values = [h[depth_i - depth + len(h)] if depth_i >= depth - len(h) else "" for h in header_lines]
        lines.append(head[0] + head[1].join(cells(values, bold=True)) + head[2])
    lines.append(rule(under))
    lines.extend(body[0] + body[1].join(cells(row, bold=False)) + body[2] for row in rows)
    lines.append(rule(bottom))
    return lines


def _padded(lines: list[str], width: int) -> list[str]:
    """Left-justified as rich justifies a table's title: trailing blanks off, then padded to `width`."""
    return [line.rstrip().ljust(width) for line in lines]


def table_width(rows: Sequence[Sequence[str]], *, indent: int = 0) -> int:
    """How wide `write_table` draws `rows` when nothing folds: the widest cell of each column,
    two spaces between columns, and the indent."""
    widths = [max(len(line) for row in rows for line in row[i].splitlines() or [""]) for i in range(len(rows[0]))]
    return indent + sum(widths) + 2 * (len(widths) - 1)
