"""The exit status of every `skygreen` command, in one table.

A command that follows a run to its end (`up --local` and `resume` in the foreground,
`logs --follow`) exits with the run's outcome, so a script or CI job that calls it can tell a
finished run from a failed one without parsing text. Commands that do not follow a run exit
0 when they did what was asked, 1 when the world refused (a bucket, a cloud) and 2 when the
input was wrong.

`MEANINGS` below says what each code means; the CLI reference prints it as a table.

75 is EX_TEMPFAIL, the same code the runtime exits with after committing a checkpoint on
SIGTERM (`PREEMPTED_EXIT_CODE` below, re-exported by `skygreen.runtime`), which SkyPilot's
job recovery relaunches. 130 is the shell's code for a process ended by SIGINT (128 + 2).
This module imports nothing, so every other module (errors, launcher) can take its codes here.
"""

from __future__ import annotations

SUCCEEDED = 0
FAILED = 1
BAD_INPUT = 2
SUPERSEDED = 3
"""The runtime's exit status when a newer life of its run took over the bucket (`skygreen.checkpoint.lease`)."""
STOPPED_WITH_CHECKPOINT = 75
INTERRUPTED = 130

MEANINGS: dict[int, str] = {
    SUCCEEDED: "done: the run succeeded (or early stopping ended it)",
    FAILED: "failed: the run failed, or it stopped with no checkpoint to resume from; a bucket or cloud refused",
    BAD_INPUT: "bad input: the task file, a flag or a run id is wrong; nothing was launched",
    SUPERSEDED: "superseded (the runtime's own code): a newer launch of the same run holds its checkpoint lease; "
    "this process stopped without writing",
    STOPPED_WITH_CHECKPOINT: "stopped with a checkpoint (preempted or cancelled): `skygreen resume RUN` continues it",
    INTERRUPTED: "interrupted (Ctrl-C) while following: the run itself goes on",
}
"""What each code means, one line each: the exit code table of the CLI reference is made from it."""

PREEMPTED_EXIT_CODE = STOPPED_WITH_CHECKPOINT
"""The runtime's exit status after committing a checkpoint on SIGTERM (75 is EX_TEMPFAIL: try
again later): the job was interrupted, not failed. Rendered into SkyPilot's
`job_recovery.recover_on_exit_codes` so it recovers the job; a local run ending with it reads
as stopped, for `skygreen resume`. `skygreen.runtime` re-exports it for training code."""

_STOPPED_STATES = frozenset({"STOPPED", "CANCELLED"})


def for_outcome(state: str, *, has_checkpoint: bool) -> int:
    """The exit code of a command that followed a run which ended in `state` (a
    `skygreen.launch.launcher.JobState` value). A stopped or cancelled run with a committed
    checkpoint is resumable (75); without one nothing was kept, which is a failure (1)."""
    if state == "SUCCEEDED":
        return SUCCEEDED
    if state in _STOPPED_STATES and has_checkpoint:
        return STOPPED_WITH_CHECKPOINT
    return FAILED
