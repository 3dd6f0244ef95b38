"""The commands and snippets that README.md and docs/quickstart.md show, run as a reader runs them.

A page follows these conventions, and this test holds it to them:

- Shell examples are ```` ```console ```` blocks. A line starting with `$ ` is a command; the lines
  after it, up to the next command, are the output shown. The shown lines must appear in the
  real output (stdout and stderr as one stream, as a terminal shows them) in the same order;
  a page may leave lines out, and `...` on a line of its own marks where it does. Every
  command must exit 0.
- ```` ```python ```` blocks are executed, each in a fresh interpreter. A block with a title
  (```` ```python title="train.py" ````, also for `yaml`) is a file the page creates: it is
  written into the page's folder, and the commands after it use it.
- `<!-- docs-test: skip: REASON -->` on the line just before a block skips the whole block (the
  install itself, the test suite).
- A `skygreen` command in any other fenced block of these pages (and of docs/index.md and
  docs/existing-script.md) fails the test: nothing a reader could copy escapes it. Mermaid
  diagrams are pictures, not commands, and are not searched.

Each page runs as a new user's clone would, on the embedded default: a private HOME and data
dir, one for both pages (`helpers.user_env`, no `SKYGREEN_*` settings, so the catalog is the price table shipped in
the package and checkpoints go to the local bucket), in a folder holding a copy of `tasks/`,
with this interpreter's `bin` first on PATH (what `source .venv/bin/activate` does). Commands
run through bash as subprocesses of the real `skygreen` entry point; `cd DIR`, `export K=V`
and `unset K` carry over to the page's later commands, as in a shell. `skygreen demo` runs once for both
pages.

What varies run to run is normalised on both sides before the comparison (`normalise`): the
private HOME becomes `~`; run ids (`NAME-YYYYMMDD-HHMMSS-xxxx`) keep their name only; dates and
times, durations (`13 s`, `6.8 min`), pids, hex digests, and every figure with a decimal point
(money, energy, hours, losses: they follow the machine's speed and load) become placeholders;
runs of blanks become one (tables pad to their widest cell). A run id in a command is replaced
by the real id last printed for that task name, so `skygreen status my-task-2026...` asks for
the run the page just made.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import user_env
from skygreen.cli import app

REPO = Path(__file__).resolve().parents[1]
RUN_PAGES = ("README.md", "docs/quickstart.md")
CHECKED_PAGES = (*RUN_PAGES, "docs/index.md", "docs/existing-script.md")
SKIP = re.compile(r"^<!-- docs-test: skip: (?P<reason>\S.*) -->$")
FENCE = re.compile(r"^```(?P<info>.*)$")
TITLE = re.compile(r'title="(?P<name>[^"]+)"')
RUN_ID = re.compile(r"\b(?P<name>[a-z0-9][a-z0-9_.-]*?)-\d{8}-\d{6}-[0-9a-f]{4}\b")
SUBCOMMANDS = "|".join(sorted(app.commands))
SKYGREEN_COMMAND = re.compile(rf"^\s*(\$\s+)?(\S*/)?skygreen\s+({SUBCOMMANDS})\b")
RUN_ONCE = ("skygreen demo",)
COMMAND_TIMEOUT_S = 600


@dataclass(frozen=True, kw_only=True)
class Block:
    """One fenced block of a page: its language, title (a file the page creates), lines, and the
    skip reason when the line before it carries the marker."""

    page: str
    line: int
    language: str
    title: str | None
    lines: tuple[str, ...]
    skip: str | None


@dataclass(kw_only=True)
class Command:
    """A `$ ` line of a console block and the output lines the page shows after it."""

    text: str
    shown: list[str] = field(default_factory=list)


def blocks(page: str) -> list[Block]:
    """Every fenced block of `page`, in order."""
    lines = (REPO / page).read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        info = opening["info"].strip()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        marker = SKIP.match(lines[i - 1].strip()) if i else None
        title = TITLE.search(info)
        found.append(
            Block(
                page=page,
                line=i + 1,
                language=info.split()[0] if info else "",
                title=title["name"] if title else None,
                lines=tuple(lines[i + 1 : end]),
                skip=marker["reason"] if marker else None,
            )
        )
        i = end + 1
    return found


def commands(block: Block) -> list[Command]:
    """The commands of a console block, each with the output lines shown after it."""
    found: list[Command] = []
    for line in block.lines:
        if line.startswith("$ "):
            found.append(Command(text=line[2:].strip()))
        elif found:
            found[-1].shown.append(line)
        elif line.strip():
            raise AssertionError(f"{block.page}:{block.line}: output before the first `$ ` command: {line!r}")
    return found


def normalise(text: str, home: str) -> list[str]:
    """The lines of `text` with what varies run to run replaced (see the module's docstring)."""
    if home:
        text = text.replace(home, "~")
    rules = (
        (RUN_ID, r"\g<name>-<id>"),
        (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?Z?"), "<time>"),
        (re.compile(r"\b\d{8}T\d{6,}Z"), "<time>"),
        (re.compile(r"\b\d{2}-\d{2} \d{2}:\d{2}\b"), "<time>"),  # a table's short month-day time
        (re.compile(r"\b\d+(\.\d+)? ?(ms|s|min|h)\b"), "<duration>"),
        (re.compile(r"\bpid \d+"), "pid <pid>"),
        (re.compile(r"\b[0-9a-f]{12,64}\b"), "<digest>"),
        (re.compile(r"\d+\.\d+"), "<figure>"),
        (re.compile(r"[ \t]+"), " "),
    )
    lines = []
    for line in text.splitlines():
        for pattern, replacement in rules:
            line = pattern.sub(replacement, line)
        lines.append(line.strip())
    return lines


def missing_lines(shown: list[str], real: list[str]) -> list[str]:
    """The shown lines (normalised, `...` left out) that the real lines do not hold in order:
    empty when every shown line appears, each after the one before it."""
    position = 0
    for index, line in enumerate(shown):
        if line == "...":
            continue
        try:
            position = real.index(line, position) + 1
        except ValueError:
            return [s for s in shown[index:] if s != "..."]
    return []


@dataclass(kw_only=True)
class Session:
    """One page's shell: its folder, environment and the run ids its commands printed."""

    cwd: Path
    env: dict[str, str]
    home: str
    ids: dict[str, str] = field(default_factory=dict)

    def run(self, command: str, cache: dict[str, subprocess.CompletedProcess[str]]) -> subprocess.CompletedProcess[str]:
        command = RUN_ID.sub(lambda m: self.ids.get(m["name"], m[0]), command)
        cd = re.fullmatch(r"cd (\S+)", command)
        if cd:
            self.cwd = (self.cwd / cd[1]).resolve()
            assert self.cwd.is_dir(), f"cd {cd[1]}: no such folder"
            return subprocess.CompletedProcess(command, 0, "", "")
        export = re.fullmatch(r"export (\w+)=(\S+)", command)
        if export:
            self.env[export[1]] = os.path.expanduser(export[2].replace("~", self.home, 1))
            return subprocess.CompletedProcess(command, 0, "", "")
        unset = re.fullmatch(r"unset (\w+)", command)
        if unset:
            self.env.pop(unset[1], None)
            return subprocess.CompletedProcess(command, 0, "", "")
        done = cache.get(command) or subprocess.run(
            ["bash", "-c", command],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # one stream, in the order a terminal shows it
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        if command in RUN_ONCE:
            cache[command] = done
        for match in RUN_ID.finditer(done.stdout):
            self.ids[match["name"]] = match[0]
        return done


@pytest.fixture(scope="module")
def once() -> dict[str, subprocess.CompletedProcess[str]]:
    """Output of the slow commands (`RUN_ONCE`), shared by the pages."""
    return {}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """The reader's HOME, one for both pages: the demo runs once and both pages may look at it."""
    return tmp_path_factory.mktemp("reader") / "home"


def _session(tmp_path: Path, home: Path) -> Session:
    home.mkdir(exist_ok=True)
    clone = tmp_path / "clone"
    shutil.copytree(REPO / "tasks", clone / "tasks", ignore=shutil.ignore_patterns("__pycache__", "out"))
    env = user_env(home)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("COLUMNS", None)
    return Session(cwd=clone, env=env, home=str(home))


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES)
def test_every_command_and_snippet_on_the_page_runs_and_prints_what_it_shows(page, tmp_path, home, once):
    session = _session(tmp_path, home)
    ran = 0
    for block in blocks(page):
        where = f"{page}:{block.line}"
        if block.skip is not None:
            continue
        if block.title is not None:
            (session.cwd / block.title).write_text("\n".join(block.lines) + "\n", encoding="utf-8")
            continue
        if block.language == "python":
            script = tmp_path / f"snippet-{block.line}.py"
            script.write_text("\n".join(block.lines) + "\n", encoding="utf-8")
            done = subprocess.run([sys.executable, str(script)], cwd=session.cwd, env=session.env,
                                  capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)  # fmt: skip
            assert done.returncode == 0, f"{where}: the snippet failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
            ran += 1
        elif block.language == "console":
            for command in commands(block):
                done = session.run(command.text, once)
                output = done.stdout
                assert done.returncode == 0, f"{where}: `{command.text}` exited {done.returncode}:\n{output[-3000:]}"
                shown = normalise("\n".join(command.shown), session.home)
                missing = missing_lines(shown, normalise(output, session.home))
                assert not missing, (
                    f"{where}: `{command.text}` no longer prints what the page shows; first line not found in order:\n"
                    f"  {missing[0]}\nreal output (normalised):\n" + "\n".join(normalise(output, session.home))
                )
                ran += 1
    assert ran, f"{page}: nothing ran"


@pytest.mark.parametrize("page", CHECKED_PAGES)
def test_no_skygreen_command_hides_outside_a_console_block(page):
    for block in blocks(page):
        if block.language in ("console", "mermaid"):
            continue
        for line in block.lines:
            assert not SKYGREEN_COMMAND.match(line), (
                f"{page}:{block.line}: a `skygreen` command in a ```{block.language} block, which this test does "
                f"not run: {line.strip()!r}; show it in a ```console block (`$ ` before the command)"
            )


def test_the_readme_stays_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the rest belongs on the docs site (docs/)"


def test_a_changed_or_reordered_output_line_is_found_and_what_varies_is_not():
    home = "/tmp/h"
    real = normalise(
        "launched run my-task-20261202-013643-fb15 on this machine (job my-task-20261202-013643-fb15-1)\n"
        "  checkpoints: /tmp/h/.local/share/skygreen/buckets/my-task-20261202-013643-fb15\n"
        "step 200 val_loss 0.0119\n"
        "demo done in 114 s: state RUNNING - pid 4242 at 2026-12-02T01:37:28.197475Z, $0.0069\n",
        home,
    )
    same_but_varying = normalise(
        "launched run my-task-20251130-101010-abcd on this machine (job my-task-20251130-101010-abcd-1)\n"
        "...\n"
        "demo done in 13 s: state RUNNING - pid 7 at 2025-11-30T10:10:10Z, $0.0071\n",
        "",
    )
    assert missing_lines(same_but_varying, real) == []
    assert missing_lines(normalise("  checkpoints: ~/.local/share/skygreen/buckets/my-task-x", ""), real)
    assert missing_lines(normalise("step 300 val_loss 0.0119", ""), real) == ["step 300 val_loss <figure>"]
    reordered = normalise("step 200 val_loss 0.5\nlaunched run my-task-20251130-101010-abcd on this machine", "")
    assert missing_lines(reordered, real)


def test_a_block_after_the_marker_is_skipped_and_a_title_makes_a_file(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: skip: needs a cloud account -->\n```console\n$ skygreen up task.yaml\n```\n\n"
        '```python title="train.py"\nprint(1)\n```\n```console\n$ skygreen status\nRUN\n...\n```\n',
        encoding="utf-8",
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    skipped, titled, console = blocks("page.md")
    assert skipped.skip == "needs a cloud account" and skipped.language == "console"
    assert titled.title == "train.py" and titled.language == "python" and titled.skip is None
    assert [(c.text, c.shown) for c in commands(console)] == [("skygreen status", ["RUN", "..."])]
    assert SKYGREEN_COMMAND.match("skygreen plan task.yaml   # rank") and SKYGREEN_COMMAND.match(
        ".venv/bin/skygreen up x"
    )
    assert not SKYGREEN_COMMAND.match("  gpus: [T4]   # default: every GPU skygreen knows")
