"""The plan is drawn without rich, exactly as rich draws it: the same lines, broken at the same
places. Each drawing is compared with rich's own over generated text and tables."""

from __future__ import annotations

import io
import string

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from skygreen.terminal import box_table_lines, wrap_words

_TEXT = st.text(alphabet=string.ascii_letters + string.digits + " .,:;$%()-/", max_size=300)
_CELL = st.text(alphabet=string.ascii_letters + string.digits + " .:$-", min_size=0, max_size=14).map(str.strip)
"""Cells as the plan makes them: no blanks at either end."""


def _rich_lines(renderable: object, width: int) -> list[str]:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, markup=False, emoji=False, highlight=False)
    console.print(renderable)
    return buffer.getvalue().split("\n")[:-1]


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, width=st.integers(min_value=1, max_value=120))
def test_lines_break_where_rich_breaks_them(text: str, width: int) -> None:
    assert wrap_words(text, width) == _rich_lines(text, width)


def test_a_word_longer_than_the_line_is_cut_into_whole_lines() -> None:
    assert wrap_words("ab abcdefghij cd", 4) == ["ab ", "abcd", "efgh", "ij ", "cd"]


@st.composite
def _tables(draw: st.DrawFn) -> tuple[str, list[str], list[list[str]], set[int]]:
    columns = draw(st.integers(min_value=1, max_value=6))
    headers = []
    for _ in range(columns):
        first = draw(st.text(alphabet=string.ascii_letters + "$#", min_size=1, max_size=10))
        second = draw(st.one_of(st.none(), st.text(alphabet=string.ascii_letters + "$/", min_size=1, max_size=8)))
        headers.append(first if second is None else f"{first}\n{second}")
    rows = draw(st.lists(st.lists(_CELL, min_size=columns, max_size=columns), max_size=6))
    right = set(draw(st.lists(st.integers(min_value=0, max_value=columns - 1), max_size=columns)))
    title = draw(_TEXT.filter(lambda t: t.strip() != ""))
    return title, headers, rows, right


@settings(max_examples=200, deadline=None)
@given(table=_tables())
def test_a_table_is_drawn_as_rich_draws_it(table: tuple[str, list[str], list[list[str]], set[int]]) -> None:
    title, headers, rows, right = table
    drawn = Table(title=title, title_justify="left", header_style="bold")
    for i, header in enumerate(headers):
        drawn.add_column(header, justify="right" if i in right else "left", no_wrap=True)
    for row in rows:
        drawn.add_row(*row)
    assert box_table_lines(title, headers, rows, right, styled=False) == _rich_lines(drawn, 500)


def test_a_terminal_gets_an_italic_title_and_bold_headers() -> None:
    lines = box_table_lines("Offers", ["cloud", "$/h"], [["aws", "0.5"]], {1}, styled=True)
    assert lines[0].startswith("\x1b[3mOffers")
    assert "\x1b[1mcloud\x1b[0m" in lines[2]
    plain = box_table_lines("Offers", ["cloud", "$/h"], [["aws", "0.5"]], {1}, styled=False)
    assert all("\x1b" not in line for line in plain)
