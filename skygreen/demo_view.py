"""How `skygreen demo` shows itself: a rich progress bar on a terminal, plain lines otherwise.

On a terminal one bar counts the demo's stages and a second the run's steps, with each
stage's lines printed above them. Piped into a file or CI log, the same lines print plain,
one per stage change, with no escape codes and no redrawn bar.
"""

from __future__ import annotations

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


def print_summary(result: Any, out: TextIO) -> None:
    """Where everything is (`skygreen.demo.DemoResult`), and what to try next."""
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
    out.write(
        "\nthe demo's runs live in its folder; to look at them with the other commands:\n"
        f"  export SKYGREEN_DATA_DIR={result.folder}\n"
        f"  skygreen status {result.run_id}; skygreen cost {result.run_id}; skygreen report {result.run_id}\n"
        "next:\n"
        "  skygreen plan YOUR_TASK.yaml           rank spot GPUs for your own task (see tasks/ for examples)\n"
        "  skygreen up YOUR_TASK.yaml --local     run it here; without --local, on the cloud (needs `sky check`)\n"
        "  skygreen simulate TRACE --hours 48h --deadline 72h --changeover 0.3h --policy all\n"
        "                                         replay a spot availability trace against deadline policies\n"
        "                                         (README, Deadlines: where traces come from)\n"
    )
