"""Many local runs at once, then kill -9 half of them and resume: a stress script, not a test.

    .venv/bin/python benchmarks/bench_many_runs.py [--runs 20] [--steps 100] [--hold-step 40] [--seed 0]

A script under `benchmarks/`, not a pytest test: with 20 runs it takes many minutes on a small
machine, so it is run by hand and its figures go to `benchmarks/RESULTS.md`.

Everything goes through the real `skygreen` command as subprocesses, in a private HOME and
`SKYGREEN_DATA_DIR` (a temporary folder), with the task `tasks/tiny.yaml` shrunk to `--steps`
steps (`TINY_STEPS`). All runs share the default local bucket (`<data dir>/buckets`).

Phase 1: `--runs` runs started at once with `skygreen up --local --detach`, while a thread
calls `skygreen status --json`, `skygreen cost RUN --json` and `skygreen compare RUN...` in a
loop until every run has ended. Every run must end SUCCEEDED at the last step, with its ledger
ending "completed" at that step, its final checkpoint's manifest naming the status's
`model_sha256`, and every committed blob matching its manifest's sha256. Every run of the same
seed must end with the same weights. Then no lock under the data folder may be held (the launch
and watch locks, `skygreen.locks.is_locked`), every `.json` file must parse, and no temporary
file of an atomic write (`skygreen.files.TEMP_PREFIX`) may be left.

Phase 2: `--runs` runs again, each held at `--hold-step` (`SKYGREEN_TEST_HOLD_AT_STEPS`: a
checkpoint is committed there, then the runtime waits). Once every run is held there (status at
the step and the "held at step" line in its log, as `tests/test_local_e2e.py` waits), a random
half (`--seed`) is killed with SIGKILL to the whole process group, the hold is released,
`skygreen resume RUN --detach` relaunches the killed ones, and the status loop runs throughout.
All must end SUCCEEDED with one recovery for each killed run and the model digest of the
uninterrupted runs of phase 1; the lock and file checks are made again.

Every wait is bounded (`--timeout-s`) and fails with what it waited for. The script prints the
figures (runs, wall time, status/cost/compare calls) and exits 1 with a summary of every failure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from skygreen.files import TEMP_PREFIX
from skygreen.locks import is_locked
from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tasks" / "tiny.yaml"
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED", "STOPPED")
POLL_S = 0.5
T = TypeVar("T")


class BenchFailure(Exception):
    """A check that failed; the message says what was expected and what was found."""


@dataclass(kw_only=True)
class Tally:
    """What the status loop did and what went wrong anywhere, shared between threads."""

    calls: dict[str, int] = field(default_factory=lambda: {"status": 0, "cost": 0, "compare": 0})
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, message: str) -> None:
        with self.lock:
            self.failures.append(message)
        print(f"FAIL: {message}", flush=True)

    def count(self, command: str) -> None:
        with self.lock:
            self.calls[command] += 1


@dataclass(kw_only=True)
class Env:
    """The private environment every `skygreen` subprocess of this script gets."""

    home: Path
    environ: dict[str, str]
    timeout_s: float

    @property
    def data(self) -> Path:
        return Path(self.environ["SKYGREEN_DATA_DIR"])


def skygreen_command() -> list[str]:
    """The installed `skygreen` entry point beside this Python, else `python -m skygreen.cli`."""
    script = Path(sys.executable).parent / "skygreen"
    return [str(script)] if script.exists() else [sys.executable, "-m", "skygreen.cli"]


SKYGREEN = skygreen_command()


def make_env(home: Path, *, steps: int, timeout_s: float) -> Env:
    """A user of their own: HOME, XDG_DATA_HOME and SKYGREEN_DATA_DIR in `home`, no other
    SKYGREEN_* setting, one OpenMP thread per run (many processes share few cores)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SKYGREEN_")}
    environ.update(
        HOME=str(home),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        SKYGREEN_DATA_DIR=str(home / "skygreen-data"),
        OMP_NUM_THREADS="1",
        TINY_STEPS=str(steps),
    )
    return Env(home=home, environ=environ, timeout_s=timeout_s)


def sg(env: Env, *args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`skygreen ARGS` as a subprocess, bounded by the env's timeout."""
    environ = env.environ if extra is None else {**env.environ, **extra}
    try:
        return subprocess.run(
            [*SKYGREEN, *args], env=environ, cwd=REPO, capture_output=True, text=True, timeout=env.timeout_s
        )
    except subprocess.TimeoutExpired as e:
        raise BenchFailure(f"`skygreen {' '.join(args)}` did not return within {env.timeout_s:.0f} s") from e


def sg_json(env: Env, *args: str) -> Any:
    """The parsed `--json` output of `skygreen ARGS`; a non-zero exit or bad JSON is a failure."""
    out = sg(env, *args)
    if out.returncode != 0:
        raise BenchFailure(f"`skygreen {' '.join(args)}` exited {out.returncode}: {out.stderr.strip()[-500:]}")
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError as e:
        raise BenchFailure(f"`skygreen {' '.join(args)}` printed no JSON ({e}): {out.stdout[:300]!r}") from e


def wait_for(predicate: Callable[[], T | None], what: str, timeout_s: float) -> T:
    """The first truthy value of `predicate()`; a `BenchFailure` naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_S)
    raise BenchFailure(f"timed out after {timeout_s:.0f} s waiting for {what}")


def run_ids(env: Env) -> list[str]:
    return [row["run_id"] for row in sg_json(env, "status", "--json") if "run_id" in row]


def run_record(env: Env, run_id: str) -> dict[str, Any]:
    return json.loads((env.data / "runs" / run_id / "run.json").read_text())


def launch_log(env: Env, run_id: str) -> str:
    """The output of the run's latest launch so far."""
    job = run_record(env, run_id)["launches"][-1]["job_id"]
    path = env.data / "local-jobs" / job / "output.log"
    return path.read_text(errors="replace") if path.exists() else ""


# ---------------------------------------------------------------------------------------
# Starting, watching, killing


def start_runs(env: Env, count: int, *, extra: dict[str, str] | None = None) -> list[str]:
    """`count` runs of the tiny task started at once with `up --local --detach`; their ids."""
    before = set(run_ids(env))

    def up(_: int) -> subprocess.CompletedProcess[str]:
        return sg(env, "up", str(TINY), "--local", "--detach", "--no-smoke", extra=extra)

    with ThreadPoolExecutor(max_workers=count) as pool:
        results = list(pool.map(up, range(count)))
    for out in results:
        if out.returncode != 0:
            raise BenchFailure(f"`skygreen up --local --detach` exited {out.returncode}: {out.stderr.strip()[-800:]}")
    new = sorted(set(run_ids(env)) - before)
    if len(new) != count:
        raise BenchFailure(f"{count} `up` commands succeeded but status lists {len(new)} new runs: {new}")
    return new


class StatusLoop:
    """A thread calling `status`, `cost RUN` and `compare RUN...` in turn until stopped, as a
    user watching the runs from another shell would; every call must exit 0 and parse."""

    def __init__(self, env: Env, tally: Tally) -> None:
        self.env, self.tally = env, tally
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> StatusLoop:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=self.env.timeout_s)

    def _loop(self) -> None:
        rng = random.Random(1)
        while not self.stop.is_set():
            try:
                ids = [r["run_id"] for r in sg_json(self.env, "status", "--json") if "run_id" in r]
                self.tally.count("status")
                if ids:
                    sg_json(self.env, "cost", rng.choice(ids), "--json")
                    self.tally.count("cost")
                    sg_json(self.env, "compare", *ids, "--json")
                    self.tally.count("compare")
            except BenchFailure as e:
                self.tally.fail(f"status loop: {e}")
            except Exception as e:  # any crash of a watcher is a finding, not a stop
                self.tally.fail(f"status loop: {type(e).__name__}: {e}")


def wait_all_ended(env: Env, ids: list[str]) -> dict[str, dict[str, Any]]:
    """Every run's final status once none of `ids` is still going."""

    def ended() -> dict[str, dict[str, Any]] | None:
        rows = {r["run_id"]: r for r in sg_json(env, "status", "--json") if r.get("run_id") in ids}
        return rows if len(rows) == len(ids) and all(r["state"] in ENDED for r in rows.values()) else None

    return wait_for(ended, f"all {len(ids)} runs to end", env.timeout_s)


def wait_held(env: Env, run_id: str, step: int) -> None:
    """Until the run is held at `step` (its checkpoint and ledger segment there are written);
    a failure at once if the run ended first."""

    def held() -> bool:
        status = sg_json(env, "status", run_id, "--json")
        if status["state"] in ENDED:
            raise BenchFailure(f"run {run_id} ended ({status['state']}) before it was held at step {step}")
        return status["step"] == step and f"held at step {step} (" in launch_log(env, run_id)

    wait_for(held, f"run {run_id} held at step {step}", env.timeout_s)


def kill_9(env: Env, run_id: str) -> None:
    """SIGKILL the run's whole process group, as losing the machine would, and wait for STOPPED."""
    pid = run_record(env, run_id)["launches"][-1]["pid"]
    os.killpg(pid, signal.SIGKILL)
    wait_for(
        lambda: sg_json(env, "status", run_id, "--json")["state"] == "STOPPED",
        f"killed run {run_id} to read as STOPPED",
        env.timeout_s,
    )


def stop_leftovers(env: Env) -> None:
    """SIGKILL the process group of every run's latest launch that is still alive, so that a
    failed or interrupted benchmark leaves no training behind."""
    for path in sorted((env.data / "runs").glob("*/run.json")):
        try:
            launches = json.loads(path.read_text()).get("launches") or []
            pid = launches[-1].get("pid") if launches else None
            if pid:
                os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError):
            continue  # already gone, or a record this script cannot read: the checks say so


# ---------------------------------------------------------------------------------------
# Checks


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_checkpoints(env: Env, run_id: str, status: dict[str, Any]) -> list[str]:
    """The run's committed checkpoints in the bucket: every blob matches its manifest, and the
    latest manifest is at the final step with the status's model digest."""
    record = run_record(env, run_id)
    root = Path(record["bucket"]) / run_id / "ckpt"
    manifests = sorted(root.glob("*/manifest.json"))
    if not manifests:
        return [f"{run_id}: no committed checkpoint under {root}"]
    problems = []
    for path in manifests:
        manifest = json.loads(path.read_text())
        for name, blob in manifest["blobs"].items():
            blob_path = path.parent / name
            if not blob_path.exists() or sha256_file(blob_path) != blob["sha256"]:
                problems.append(f"{run_id}: blob {blob_path} missing or not the manifest's sha256")
    last = json.loads(manifests[-1].read_text())
    if last["step"] != status["step"] or last["model_sha256"] != status["model_sha256"]:
        problems.append(
            f"{run_id}: latest manifest step {last['step']} model {last['model_sha256']} "
            f"but status step {status['step']} model {status['model_sha256']}"
        )
    return problems


def check_run(env: Env, run_id: str, status: dict[str, Any], *, steps: int, recoveries: int) -> list[str]:
    """One ended run: state, step, digest, recoveries, ledger and checkpoints."""
    problems = []
    if status["state"] != "SUCCEEDED" or not status["completed"] or status["step"] != steps:
        problems.append(f"{run_id}: ended {status['state']} at step {status['step']}, expected SUCCEEDED at {steps}")
    if not status.get("model_sha256"):
        problems.append(f"{run_id}: no model_sha256 in its status")
    if status["recoveries"] != recoveries or len(run_record(env, run_id)["launches"]) != recoveries + 1:
        problems.append(f"{run_id}: {status['recoveries']} recoveries, expected {recoveries}")
    try:
        cost = sg_json(env, "cost", run_id, "--json")
    except BenchFailure as e:
        return [*problems, f"{run_id}: {e}"]
    ends = [s["end"] for s in cost["segments"]]
    if not ends or ends[-1] != "completed" or cost["segments"][-1]["step"] != steps:
        problems.append(f"{run_id}: ledger segments end {ends}, the last not 'completed' at step {steps}")
    if recoveries and "killed" not in ends:
        problems.append(f"{run_id}: killed and resumed, but no ledger segment ends 'killed': {ends}")
    return problems + check_checkpoints(env, run_id, status)


def check_files(env: Env) -> list[str]:
    """No lock held, every JSON file parses, no temporary file of an atomic write left."""
    problems = []
    for path in sorted(env.home.rglob("*")):
        if not path.is_file():
            continue
        if path.suffix == ".lock" and is_locked(path):
            problems.append(f"lock still held after every run ended: {path}")
        elif path.suffix == ".json":
            try:
                json.loads(path.read_text())
            except (ValueError, UnicodeDecodeError) as e:
                problems.append(f"half-written or corrupt JSON: {path} ({e})")
        if path.name.startswith(TEMP_PREFIX):
            problems.append(f"temporary file of an atomic write left behind: {path}")
    return problems


# ---------------------------------------------------------------------------------------
# Phases


def phase_many(env: Env, tally: Tally, *, runs: int, steps: int) -> tuple[float, str | None]:
    """Phase 1; returns its wall time and the runs' common model digest."""
    started = time.monotonic()
    with StatusLoop(env, tally):
        ids = start_runs(env, runs)
        print(f"phase 1: started {len(ids)} runs", flush=True)
        final = wait_all_ended(env, ids)
    wall_s = time.monotonic() - started
    for run_id in ids:
        for problem in check_run(env, run_id, final[run_id], steps=steps, recoveries=0):
            tally.fail(f"phase 1: {problem}")
    digests = {final[r]["model_sha256"] for r in ids}
    if len(digests) != 1:
        tally.fail(f"phase 1: runs of the same seed ended with {len(digests)} different model digests")
    for problem in check_files(env):
        tally.fail(f"phase 1: {problem}")
    return wall_s, next(iter(digests)) if len(digests) == 1 else None


def phase_kill(
    env: Env, tally: Tally, *, runs: int, steps: int, hold_step: int, seed: int, reference: str | None
) -> tuple[float, int]:
    """Phase 2; returns its wall time and how many runs were killed."""
    release = env.home / "release"
    release.mkdir()
    gated = {HOLD_ENV: str(hold_step), RELEASE_ENV: str(release)}
    started = time.monotonic()
    with StatusLoop(env, tally):
        ids = start_runs(env, runs, extra=gated)
        print(f"phase 2: started {len(ids)} runs, each held at step {hold_step}", flush=True)
        for run_id in ids:
            wait_held(env, run_id, hold_step)
        victims = sorted(random.Random(seed).sample(ids, runs // 2))
        for run_id in victims:
            kill_9(env, run_id)
        print(f"phase 2: killed {len(victims)} runs with SIGKILL at step {hold_step}", flush=True)
        (release / str(hold_step)).touch()
        for run_id in victims:
            out = sg(env, "resume", run_id, "--detach", extra=gated)
            if out.returncode != 0:
                tally.fail(f"phase 2: `skygreen resume {run_id} --detach` exited {out.returncode}: {out.stderr[-500:]}")
        final = wait_all_ended(env, ids)
    wall_s = time.monotonic() - started
    for run_id in ids:
        killed = run_id in victims
        for problem in check_run(env, run_id, final[run_id], steps=steps, recoveries=int(killed)):
            tally.fail(f"phase 2: {problem}")
        if reference is not None and final[run_id]["model_sha256"] != reference:
            what = "killed and resumed" if killed else "uninterrupted"
            tally.fail(f"phase 2: {what} run {run_id} ended with other weights than the uninterrupted runs")
    for problem in check_files(env):
        tally.fail(f"phase 2: {problem}")
    return wall_s, len(victims)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs started at once in each phase (default 20)")
    parser.add_argument("--steps", type=int, default=100, help="training steps of each run (TINY_STEPS)")
    parser.add_argument("--hold-step", type=int, default=40, help="phase 2: the step the kills happen at")
    parser.add_argument("--seed", type=int, default=0, help="which half of phase 2's runs is killed")
    parser.add_argument("--timeout-s", type=float, default=1800, help="bound on every wait")
    parser.add_argument("--keep", action="store_true", help="keep the private home for a look afterwards")
    args = parser.parse_args(argv)
    if args.runs < 2 or not 0 < args.hold_step < args.steps:
        parser.error("need --runs >= 2 and 0 < --hold-step < --steps")
    home = Path(tempfile.mkdtemp(prefix="skygreen-many-runs-"))
    env = make_env(home, steps=args.steps, timeout_s=args.timeout_s)
    tally = Tally()
    started = time.monotonic()
    wall_1 = wall_2 = None
    killed = 0
    try:
        wall_1, reference = phase_many(env, tally, runs=args.runs, steps=args.steps)
        print(f"phase 1: {args.runs} runs ended in {wall_1:.0f} s", flush=True)
        wall_2, killed = phase_kill(
            env, tally, runs=args.runs, steps=args.steps, hold_step=args.hold_step, seed=args.seed, reference=reference
        )
    except BenchFailure as e:
        tally.fail(str(e))
    finally:
        stop_leftovers(env)
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    total_s = time.monotonic() - started
    fmt = lambda s: "not reached" if s is None else f"{s:.0f} s"  # noqa: E731
    print(
        f"\nruns per phase: {args.runs} ({args.steps} steps each); killed and resumed: {killed}\n"
        f"wall time: phase 1 {fmt(wall_1)}, phase 2 {fmt(wall_2)}, total {total_s:.0f} s\n"
        f"calls from the status loop: status {tally.calls['status']}, cost {tally.calls['cost']}, "
        f"compare {tally.calls['compare']}\n"
        f"failures: {len(tally.failures)}" + (f"\nprivate home kept: {home}" if args.keep else "")
    )
    for failure in tally.failures:
        print(f"  - {failure}")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
