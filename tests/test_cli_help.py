"""`skygreen --help` as a new user reads it, and the packaging metadata pip reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from skygreen.cli import app

REPO = Path(__file__).resolve().parents[1]


def help_text(*args: str, columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns)}
    out = subprocess.run(
        [sys.executable, "-m", "skygreen.cli", *args, "--help"], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def listed_commands(text: str) -> dict[str, str]:
    """The Commands section: name -> its description with the wrapped lines joined."""
    section = text.split("Commands:\n", 1)[1]
    commands: dict[str, str] = {}
    name = None
    for line in section.splitlines():
        match = re.match(r"^  (\S+)\s+(.*)$", line)
        if match:
            name = match.group(1)
            commands[name] = match.group(2).strip()
        elif line.strip() and name:  # textwrap also breaks after a hyphen ("on-" / "demand")
            commands[name] += ("" if commands[name].endswith("-") else " ") + line.strip()
    return commands


def first_sentence(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("group", [(), ("catalog",)])
def test_help_shows_each_commands_whole_first_sentence(columns, group):
    listed = listed_commands(help_text(*group, columns=columns))
    command_group = app if not group else app.commands[group[0]]
    assert isinstance(command_group, click.Group)
    assert set(listed) == set(command_group.commands)
    for name, shown in listed.items():
        assert "..." not in shown, (name, shown)
        assert shown.endswith("."), (name, shown)
        assert shown == first_sentence(command_group.commands[name].help), name


def test_each_first_sentence_starts_with_a_verb_and_stands_alone():
    """A first line such as "Runs with their state" reads as a noun phrase, not a command."""
    catalog = app.commands["catalog"]
    assert isinstance(catalog, click.Group)
    for group in (app, catalog):
        for name, command in group.commands.items():
            first = first_sentence(command.help)
            word = first.split()[0].lower().rstrip(",;:")
            assert word in VERBS, (name, first)


VERBS = {
    "rank",
    "update",
    "download",
    "smoke-test",
    "show",
    "relaunch",
    "stop",
    "print",
    "move",
    "run",
    "compare",
    "write",
    "replay",
    "hold",
}
"""Imperative first words in use; a new command whose first line starts with another verb adds it here."""


def test_license_is_an_spdx_string():
    """pip warns that `project.license` as a TOML table is deprecated; the SPDX string form
    needs setuptools 77 or newer to build."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    requires = project["build-system"]["requires"]
    setuptools_req = next(r for r in requires if r.startswith("setuptools"))
    assert re.fullmatch(r"setuptools>=(\d+)", setuptools_req) and int(setuptools_req.split(">=")[1]) >= 77


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_command_table_lists_every_command_help_shows(page):
    table = [line for line in (REPO / page).read_text().splitlines() if line.startswith("| `skygreen ")]
    named = {name for line in table for name in re.findall(r"`skygreen (\w+)", line.split(" | ")[0])}
    assert named == set(app.commands), set(app.commands) ^ named
