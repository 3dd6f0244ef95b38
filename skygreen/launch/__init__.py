"""Launching, on the laptop: render the SkyPilot task, start it, follow it.

`render` (task file + plan -> SkyPilot YAML) -> `launcher` (the seam) with its two
implementations `skypilot_launcher` (managed spot jobs) and `local_launcher` (`--local`);
`runs` (up, resume, cancel, logs) and `status` record each run in the `registry`, reach the
outside world through a `Wiring` (`wiring`), check buckets within a deadline (`bucket`); `status`
also says what a run has spent so far; `smoke` runs the CPU smoke test before paying for a GPU; `report` prints runs.
"""
