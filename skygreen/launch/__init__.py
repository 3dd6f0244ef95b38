"""Launching, on the laptop: render the SkyPilot task, start it, follow it.

`render` (task file + plan -> SkyPilot YAML) -> `launcher` (the seam) with its two
implementations `skypilot_launcher` (managed spot jobs) and `local_launcher` (`--local`);
`runs` (up, status, resume, cancel, logs) records each run in the `registry` and asks `spend`
what it cost; `smoke` runs the CPU smoke test before paying for a GPU; `report` prints runs.
"""
