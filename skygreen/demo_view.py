"""How `skygreen demo` shows itself: a rich progress bar on a terminal, plain lines otherwise.

On a terminal one bar counts the demo's stages and a second the run's steps, with each
stage's lines printed above them. Piped into a file or CI log, the same lines print plain,
one per stage change, with no escape codes and no redrawn bar.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from skygreen.demo import STAGES


class PlainView:
    """Lines only: `[3/8] training` when a stage starts, then the stage's own lines."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def stage(self, name: str) -> None:
        """Write the stage's `[i/N] name` line."""
        self.out.write(f"[{STAGES.index(name) + 1}/{len(STAGES)}] {name}\n")
        self.out.flush()

    def progress(self, done: int, total: int) -> None:
        """Nothing: plain output draws no step bar."""

    def line(self, text: str) -> None:
        """Write `text` as a line, flushed at once so a log shows it while the demo runs."""
        self.out.write(text + "\n")
        self.out.flush()

    def close(self) -> None:
        """Nothing: there is no bar to take down."""


class BarView:
    """A rich progress bar: stages overall, and the run's step while it trains."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(file=out, highlight=False)
        self.bar = Progress(
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.stages = self.bar.add_task("demo", total=len(STAGES))
        self.steps: Any = None
        self.bar.start()

    def stage(self, name: str) -> None:
        """Move the stages bar to this stage and print its `[i/N] name` heading above the bars."""
        index = STAGES.index(name)
        self.bar.update(self.stages, completed=index, description=f"[{index + 1}/{len(STAGES)}] {name}")
        self.console.print(f"[bold][{index + 1}/{len(STAGES)}] {name}[/bold]")

    def progress(self, done: int, total: int) -> None:
        """Set the steps bar to `done` of `total`, adding the bar on the first call."""
        if self.steps is None:
            self.steps = self.bar.add_task("training steps", total=total)
        self.bar.update(self.steps, completed=done, total=total)

    def line(self, text: str) -> None:
        """Print `text` above the bars as written (square brackets are not read as rich markup)."""
        self.console.print(text, markup=False)

    def close(self) -> None:
        """Fill the stages bar and stop; the bars are transient, so they leave the screen and the printed
        lines stay."""
        self.bar.update(self.stages, completed=len(STAGES))
        self.bar.stop()


def view_for(out: TextIO) -> PlainView | BarView:
    """A progress bar when `out` is a terminal, plain lines otherwise."""
    try:
        terminal = out.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return BarView(out) if terminal else PlainView(out)


def skygreen_command(
    *, environ: Mapping[str, str] | None = None, executable: str | None = None, cwd: Path | None = None
) -> str:
    """How to type the `skygreen` of this installation, for the commands the demo prints.

    After `bash scripts/install.sh` the command lives in `.venv/bin`, which is on PATH only once
    the venv is activated: a bare `skygreen` in a hint would be "command not found", or run
    another installation. So the hints name the command that runs this one:

    - `skygreen` when the first `skygreen` on PATH is this interpreter's own entry point;
    - else that entry point's path, relative to the current folder when it lies under it
      (`.venv/bin/skygreen` after the quick start), absolute otherwise;
    - else (no entry point beside the interpreter) `PYTHON -m skygreen.cli`.

    Args:
        environ: the environment whose PATH is searched (default: this process's).
        executable: the interpreter running skygreen (default: `sys.executable`).
        cwd: the folder the printed command will be typed in (default: the current one).

    Returns:
        The command, quoted for a POSIX shell where it needs quoting.
    """
    env = os.environ if environ is None else environ
    python = Path(executable or sys.executable)
    here = Path.cwd() if cwd is None else cwd
    own = shutil.which("skygreen", path=str(python.parent))
    if own is None:
        return f"{shlex.quote(str(python))} -m skygreen.cli"
    found = shutil.which("skygreen", path=env.get("PATH", ""))
    if found is not None and os.path.samefile(found, own):
        return "skygreen"
    path = Path(own).absolute()
    try:
        shown = path.relative_to(here.absolute()).as_posix()
    except ValueError:
        shown = str(path)
    return shlex.quote(shown)


def print_summary(result: Any, out: TextIO) -> None:
    """Where everything is (`skygreen.demo.DemoResult`), and what to try next, with commands that
    run as printed (`skygreen_command`)."""
    ending = "early-stopped" if result.early_stopped else result.state
    out.write(
        f"\ndemo done in {result.duration_s:.0f} s: run {result.run_id} {ending} at step {result.final_step}, "
        f"{result.preemptions} preemption(s), {result.recoveries} recovery\n"
    )
    rows = [
        ("run id", result.run_id),
        ("demo folder", str(result.folder)),
        ("checkpoints", result.checkpoints),
        *(("log", str(p)) for p in result.logs),
        ("plot", str(result.plot) if result.plot else (result.plot_hint or "-")),
        ("report", str(result.report) if result.report else "-"),
    ]
    for key, value in rows:
        out.write(f"  {key:<12} {value}\n")
    sg = skygreen_command()
    run = result.run_id
    hints = [
        (f"{sg} plan YOUR_TASK.yaml", "rank spot GPUs for your own task (see tasks/ for examples)"),
        (f"{sg} up YOUR_TASK.yaml --local", "run it here; without --local, on the cloud (needs `sky check`)"),
    ]
    width = max(len(command) for command, _ in hints) + 3
    out.write(
        "\nthe demo's runs live in its folder; to look at them with the other commands:\n"
        f"  export SKYGREEN_DATA_DIR={shlex.quote(str(result.folder))}\n"
        f"  {sg} status {run}; {sg} cost {run}; {sg} report {run}\n"
        "next:\n"
        + "".join(f"  {command:<{width}}{what}\n" for command, what in hints)
        + f"  {sg} simulate TRACE --hours 48h --deadline 72h --changeover 0.3h --policy all\n"
        "      replay a spot availability trace against deadline policies (docs/deadlines.md: where traces come from)\n"
    )
