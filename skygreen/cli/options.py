"""What the `skygreen` commands share: the context, common arguments and options, and output."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from skygreen.terminal import output_width

# click, not Typer: Typer builds its parameters through pydantic (about 0.3 s of imports),
# which would eat a third of `skygreen plan`'s one-second budget.
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def task_argument(f):
    """The TASK argument: a task file's path, passed as a `Path` (whether it exists is checked on reading)."""
    return click.argument("task", type=click.Path(path_type=Path), metavar="TASK")(f)


def catalog_option(f):
    """`--catalog DIR`, passed as a `Path`, or None for the default the help names."""
    return click.option(
        "--catalog",
        type=click.Path(path_type=Path),
        default=None,
        help="Catalog directory holding <cloud>/vms.csv (default: $SKYGREEN_CATALOG_DIR, "
        "else ~/.sky/catalogs/v8, else the embedded price table).",
    )(f)


def json_option(f):
    """`--json`, passed as the flag `json_output`."""
    return click.option("--json", "json_output", is_flag=True, help="Print machine-readable JSON.")(f)


def run_argument(f):
    """The RUN argument: a run id or a unique prefix of one, passed as typed (the registry resolves it)."""
    return click.argument("run", metavar="RUN")(f)


def print_json(data: object) -> None:
    """JSON on stdout, one document, for scripts."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def print_notice(line: str) -> None:
    """A remark for the user on stderr, so `--json` output stays clean; wrapped to the terminal's
    width (or `$COLUMNS`), its continuation lines indented under the text, one line when piped."""
    width = output_width(sys.stderr)
    if width is None:
        sys.stderr.write(f"note: {line}\n")
        return
    import textwrap

    lines = textwrap.wrap(line, width=max(width, 20), initial_indent="note: ", subsequent_indent="      ",
                          break_long_words=False, break_on_hyphens=False)  # fmt: skip
    sys.stderr.write("\n".join(lines) + "\n")


def plot_option(f):
    """`--plot FILE`, passed as the `Path` `plot`, or None when not given."""
    return click.option(
        "--plot", "plot", type=click.Path(path_type=Path), default=None,
        help="Also draw the figures to FILE (.png, or .html for one page); needs skygreen[report].",
    )(f)  # fmt: skip
