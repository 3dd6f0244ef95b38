"""Changeovers, measured: a real local run of tasks/tiny.yaml held at a checkpoint, killed with
SIGKILL and resumed; the resumed segment records its restore (bytes, seconds, rate), the setup
the rendered script stamped, the seconds to its first new step and the steps redone, and
`status`, `cost RUN` (table and --json) show them. The setup script's stamps are checked by
running the rendered script itself with bash."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from helpers import user_env, wait_for
from skygreen.checkpoint.local_store import LocalStore
from skygreen.launch.render import render_task
from skygreen.ledger import read_ledger
from skygreen.ledger.changeover import (
    Changeover,
    describe,
    read_setup,
    stamp_paths,
    typical_changeover_s,
)
from skygreen.plan.catalog import load_catalog
from skygreen.plan.cost import DEFAULT_RESTART_S, PROVISION_S
from skygreen.plan.rank import Candidate, Plan, make_plan
from skygreen.runtime.hold import HOLD_ENV, HOLD_UNCOMMITTED_ENV, RELEASE_ENV
from skygreen.runtime.peak_memory import CPU_MEASURE
from skygreen.task.settings import RuntimeSettings
from skygreen.task.spec import parse_spec, parse_spec_text

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tasks" / "tiny.yaml"
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]
FIXTURE_CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"


def skygreen(env, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def status(env, run_id: str) -> dict:
    out = skygreen(env, "status", run_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def run_json(env, run_id: str) -> Path:
    return Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json"


def launch_log(env, run_id: str) -> str:
    job = json.loads(run_json(env, run_id).read_text())["launches"][-1]["job_id"]
    path = Path(env["XDG_DATA_HOME"]) / "skygreen" / "local-jobs" / job / "output.log"
    return path.read_text(errors="replace") if path.exists() else ""


def wait_for_step(env, run_id: str, step: int) -> dict:
    """The run's status once it is held at `step` (checkpoint and ledger written); fails at once
    if the run ended first."""

    def at_step():
        s = status(env, run_id)
        assert s["state"] in ("RUNNING", "PENDING", "STARTING"), f"the run ended ({s['state']}) before step {step}"
        return s if s["step"] == step and f"held at step {step} (" in launch_log(env, run_id) else None

    return wait_for(at_step, f"the run held at step {step}")


# ---------------------------------------------------------------- the setup script's stamps


def rendered_setup(tmp_path: Path, bucket: str = "s3://b/runs") -> tuple[str, str]:
    """The setup script `skygreen up` renders for a task whose own setup sleeps 0.2 s, and its run id."""
    spec = parse_spec({"name": "t", "skygreen": {}, "run": "python train.py", "setup": "sleep 0.2"})
    plan = Plan(
        candidates=(
            Candidate(cloud="aws", region="us-east-1", zone=None, instance_type="g6.xlarge", accelerator="L4",
                      accelerator_count=1, spot=True, price_usd_per_hour=0.3, on_demand_price_usd_per_hour=0.8,
                      spot_price_usd_per_hour=0.3, est_hours=1.0, est_cost_usd=0.3, energy_kwh=0.1, co2e_kg=0.03),
        ),
        objective="cost",
    )  # fmt: skip
    settings = RuntimeSettings.from_spec(spec.green, run_id="t-20260101-000000-abcd", bucket=bucket)
    return render_task(spec, plan, settings=settings, task_dir=tmp_path)["setup"], settings.run_id


def fake_tools(tmp_path: Path, *names: str) -> tuple[Path, Path]:
    """A bin folder whose `names` (python, uv) log their arguments and succeed; the log file."""
    fake_bin, log = tmp_path / "bin", tmp_path / "calls.log"
    fake_bin.mkdir(parents=True, exist_ok=True)
    for name in names:
        (fake_bin / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexit 0\n')
        (fake_bin / name).chmod(0o755)
    return fake_bin, log


def test_the_rendered_setup_stamps_its_start_and_end_for_the_runtime(tmp_path):
    setup, run_id = rendered_setup(tmp_path)

    fake_bin, _ = fake_tools(tmp_path, "python")  # stands in for pip: nothing is installed
    home = tmp_path / "home"
    home.mkdir()
    before = time.time()
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "HOME": str(home)}
    subprocess.run(["bash", "-c", setup], check=True, env=env, timeout=60)
    started_path, ended_path = stamp_paths(run_id, home)
    assert started_path.exists() and ended_path.exists()
    stamps = read_setup(run_id, home=home, process_started_at=time.time())
    assert before - 1 <= stamps["setup_started_at"] <= time.time()
    assert stamps["setup_s"] >= 0.2  # the task's own setup ran between the stamps
    # A stamp from after the process started is not this process's setup: ignored.
    assert read_setup(run_id, home=home, process_started_at=before - 10) == {}
    assert read_setup("another-run", home=home, process_started_at=time.time()) == {}


FAKE_UV = r"""
import importlib.metadata as md, os, subprocess, sys, time
from pathlib import Path
from packaging.requirements import Requirement

args = sys.argv[1:]
log = Path(os.environ["FAKE_UV_LOG"])
assert args[:2] == ["pip", "install"], args
py = args[args.index("--python") + 1]
names = [a for a in args[2:] if not a.startswith("--") and a != py]
fresh = Path(subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True).strip())
farm = fresh.parent / "installed-by-fake-uv"
farm.mkdir(exist_ok=True)
(fresh / "installed-by-fake-uv.pth").write_text(str(farm) + "\n")


def link(top: Path) -> None:
    if not (farm / top.name).exists():
        (farm / top.name).symlink_to(top)


def closure(name: str, seen: set) -> None:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return
    key = dist.metadata["Name"].lower()
    if key in seen:
        return
    seen.add(key)
    for f in dist.files or ():
        if f.parts[0] != ".." and f.parts[0] != "__pycache__":
            link(Path(dist.locate_file(f.parts[0])))
    for line in dist.requires or ():
        r = Requirement(line)
        if r.marker is None or r.marker.evaluate({"extra": ""}):
            closure(r.name, seen)


heavy = any(Requirement(n).name == "torch" for n in names if "--no-deps" not in args)
note = ""
if heavy:  # the rest of the runtime: held until the prefetch started before it has finished
    before = subprocess.run([py, "-c", "import google.cloud.storage"], capture_output=True).returncode == 0
    prefetch_log = Path(os.environ["FAKE_UV_PREFETCH_LOG"])
    deadline = time.monotonic() + 120
    while "prefetched" not in (prefetch_log.read_text() if prefetch_log.exists() else ""):
        if time.monotonic() > deadline:
            sys.exit("fake uv: the prefetch did not finish while the runtime requirements were installing")
        time.sleep(0.05)
    note = f" [held until the prefetch finished; google-cloud-storage importable before: {before}]"
if "--no-deps" in args:
    link(Path(os.environ["FAKE_UV_SKYGREEN"]))
else:
    seen = set()
    for n in names:
        closure(Requirement(n).name, seen)
with log.open("a") as f:
    f.write("uv " + " ".join(args) + note + "\n")
"""


@pytest.mark.slow
def test_on_a_fresh_image_the_prefetch_starts_before_the_runtime_requirements_are_installed(tmp_path, s3_bucket):
    """A fresh virtualenv without skygreen, the rendered setup script run with bash, and an
    installer that installs for real into that virtualenv (linking the packages this checkout's
    environment holds, as no package index is reachable from tests) and holds the install of the
    runtime requirements until the prefetch has finished: setup must have started the prefetch
    with only skygreen and the bucket's client installed."""
    import torch

    from skygreen.checkpoint.manifest import file_info, iter_manifests
    from skygreen.checkpoint.prefetch import prefetch_dir, run_url
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.runtime.checkpointer import Checkpointer

    bucket = f"s3://{s3_bucket}/runs"
    setup, run_id = rendered_setup(tmp_path, bucket=bucket)
    url = run_url(bucket, run_id)
    with Checkpointer(url) as ck:
        ck.save(3, {"model": {"w": torch.randn(256, 256)}, "step": 3})

    venv = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "uv").write_text(f"#!{sys.executable}\n{FAKE_UV}")
    (fake_bin / "uv").chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    stamps = home / ".skygreen" / "changeover"
    env = {
        **{k: v for k, v in os.environ.items() if k.startswith("AWS_")},
        "PATH": f"{venv / 'bin'}:{fake_bin}:/usr/bin:/bin",
        "HOME": str(home),
        "SKYGREEN_BUCKET": bucket,
        "SKYGREEN_RUN_ID": run_id,
        "FAKE_UV_LOG": str(tmp_path / "uv.log"),
        "FAKE_UV_PREFETCH_LOG": str(stamps / f"{run_id}.prefetch.log"),
        "FAKE_UV_SKYGREEN": str(REPO / "skygreen"),
    }
    fresh = subprocess.run(
        [venv / "bin" / "python", "-c", "import skygreen"], env=env, cwd=tmp_path, capture_output=True
    )
    assert fresh.returncode != 0  # the image holds no skygreen
    done = subprocess.run(["bash", "-c", setup], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

    order = (stamps / f"{run_id}.setup.log").read_text().splitlines()
    assert order == [
        "skygreen setup: installing boto3 for the bucket before the rest, so the prefetch can start",
        "skygreen setup: checkpoint prefetch started in the background",
        "skygreen setup: installing the runtime requirements",
        "skygreen setup: runtime requirements installed",
    ]
    installs = (tmp_path / "uv.log").read_text().splitlines()
    assert len(installs) == 3 and "--no-deps skygreen==" in installs[0]
    assert installs[1].endswith("--quiet boto3>=1.28")
    assert "torch>=2.4" in installs[2]
    assert installs[2].endswith("[held until the prefetch finished; google-cloud-storage importable before: False]")
    assert f"prefetch: {url}: step 3 prefetched" in (stamps / f"{run_id}.prefetch.log").read_text()
    manifest = next(iter_manifests(open_store(url)))
    folder = prefetch_dir(url, home=home) / "3"
    assert {name: file_info(folder / name) for name in manifest.blobs} == dict(manifest.blobs)
    # After setup the image holds the whole runtime.
    after = [venv / "bin" / "python", "-c", "import google.cloud.storage, torch, skygreen"]
    assert subprocess.run(after, env=env, cwd=tmp_path, capture_output=True).returncode == 0


def test_typical_changeover_is_the_median_per_cloud_and_gpu():
    def row(cloud: str, gpu: str | None, seconds: float) -> Changeover:
        return Changeover(segment=2, cloud=cloud, gpu=gpu, setup_s=None, restore_s=None, restore_bytes=None,
                          restore_bytes_per_s=None, to_first_step_s=seconds, redone_steps=0)  # fmt: skip

    rows = [row("aws", "L4", 100), row("aws", "L4", 300), row("aws", "T4", 50), row("gcp", "L4", 70)]
    typical = typical_changeover_s(rows)
    assert typical[("aws", "L4")] == (200.0, 2)
    assert typical[("aws", None)] == (100.0, 3)
    assert typical[("gcp", "L4")] == (70.0, 1)
    assert "restore" not in describe(rows[0]) and "first step after 100 s" in describe(rows[0])


def test_redone_steps_reach_to_the_furthest_heartbeat_of_an_earlier_life():
    from skygreen.ledger.changeover import redone_steps
    from skygreen.ledger.records import Place, Segment

    def life(key: str, step: int, reached: int | None) -> Segment:
        return Segment(run_id="r", key=key, place=Place(cloud="aws", region="us-east-1"), started_at=1.0,
                       updated_at=2.0, step=step, reached_step=reached)  # fmt: skip

    assert redone_steps([], 0) is None  # a first life
    assert redone_steps([life("a", 30, 60)], 30) == 30  # the heartbeat's steps past the commit
    assert redone_steps([life("a", 30, None)], 30) == 0  # no heartbeat: nothing known past the commit
    assert redone_steps([life("a", 90, 95), life("b", 30, 60)], 90) == 5
    assert redone_steps([life("a", 30, 60)], 60) == 0


def test_setup_installs_with_uv_where_present_else_pip_and_skips_what_is_installed(tmp_path):
    setup, _ = rendered_setup(tmp_path)
    with_uv, log = fake_tools(tmp_path / "a", "python", "uv")
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": f"{with_uv}:/usr/bin:/bin", "HOME": str(home)}
    subprocess.run(["bash", "-c", setup], check=True, env=env, timeout=60)
    lines = log.read_text().splitlines()
    # skygreen "imports" here, so the prefetch is started first (in the background: not awaited).
    assert lines[0] == "python -c import skygreen.runtime.prefetch"
    calls = [c for c in lines if "prefetch" not in c]
    assert [c.split()[:3] for c in calls] == [["uv", "pip", "install"]] * 2
    assert "--no-deps skygreen==" in calls[0] and "torch" in calls[1] and "--upgrade-strategy" not in calls[1]

    # The same VM again (a restarted job): this version and these requirements are installed.
    log.unlink()
    again = subprocess.run(["bash", "-c", setup], check=True, env=env, timeout=60, capture_output=True, text=True)
    assert "already installed; skipping the installs" in again.stdout
    again_calls = [c for c in log.read_text().splitlines() if "prefetch" not in c]
    assert [c.split()[:2] for c in again_calls] == [["python", "-c"]]  # the version check only

    # A fresh VM without uv: pip, with the upgrade strategy that keeps the image's torch.
    without_uv, pip_log = fake_tools(tmp_path / "b", "python")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    subprocess.run(["bash", "-c", setup], check=True, env={"PATH": f"{without_uv}:/usr/bin:/bin", "HOME": str(fresh)},
                   timeout=60)  # fmt: skip
    calls = [c for c in pip_log.read_text().splitlines() if "prefetch" not in c]
    assert [c.split()[:4] for c in calls] == [["python", "-m", "pip", "install"]] * 2
    assert "--upgrade-strategy only-if-needed" in calls[1]


def test_a_prefetched_checkpoint_is_used_once_verified_and_a_bad_blob_is_downloaded_again(
    tmp_path, monkeypatch, caplog
):
    import torch

    from skygreen.checkpoint.manifest import blob_key
    from skygreen.checkpoint.prefetch import RECEIPT_SUFFIX, prefetch_dir, run_url
    from skygreen.runtime.checkpointer import Checkpointer
    from skygreen.runtime.prefetch import main as prefetch_main

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    bucket, run_id = str(tmp_path / "bucket"), "r-1"
    url = run_url(bucket, run_id)
    torch.manual_seed(0)
    state = {"model": {"w": torch.randn(64, 64)}, "step": 3}
    with Checkpointer(url) as ck:
        ck.save(3, state)
    env = {"SKYGREEN_BUCKET": bucket, "SKYGREEN_RUN_ID": run_id}

    # A good prefetch is used: with a blob gone from the bucket, the load still succeeds. What an
    # earlier life on this disk prefetched and never took (step 1) is removed.
    (prefetch_dir(url) / "1").mkdir(parents=True)
    (prefetch_dir(url) / "1" / "shared.pt").write_bytes(b"stale")
    assert prefetch_main(env) == 0
    assert not (prefetch_dir(url) / "1").exists()
    folder = prefetch_dir(url) / "3"
    names = sorted(p.name for p in folder.iterdir() if not p.name.endswith(RECEIPT_SUFFIX))
    assert names and not [n for n in names if n.endswith(".part")]
    assert sorted(p.name for p in folder.glob(f"*{RECEIPT_SUFFIX}")) == [n + RECEIPT_SUFFIX for n in names]
    (Path(url) / blob_key(3, names[0])).rename(tmp_path / "aside")
    loaded = Checkpointer(url).load_latest()
    assert loaded is not None and loaded.step == 3 and torch.equal(loaded.state["model"]["w"], state["model"]["w"])
    assert not list(folder.iterdir())  # taken, not copied
    (tmp_path / "aside").rename(Path(url) / blob_key(3, names[0]))

    # A prefetched blob that does not match the manifest is never loaded: downloaded again. Each
    # still has its receipt: one file is put in another's place (a new inode), the other is
    # written over in place (its modification time moves on), so no receipt vouches for either.
    assert prefetch_main(env) == 0
    for i, name in enumerate(names):
        blob = folder / name
        flipped = blob.read_bytes()[:-1] + bytes([blob.read_bytes()[-1] ^ 1])
        if i % 2 == 0:
            (folder / "other").write_bytes(flipped)
            os.replace(folder / "other", blob)
        else:
            mtime_ns = blob.stat().st_mtime_ns
            blob.write_bytes(flipped)
            os.utime(blob, ns=(mtime_ns + 10**9, mtime_ns + 10**9))  # whatever the clock's tick
        assert (folder / (name + RECEIPT_SUFFIX)).exists()
    with caplog.at_level("WARNING", logger="skygreen.runtime"):
        again = Checkpointer(url).load_latest()
    assert again is not None and again.step == 3 and torch.equal(again.state["model"]["w"], state["model"]["w"])
    assert sum("does not match the manifest" in r.getMessage() and "downloading it again" in r.getMessage()
               for r in caplog.records) == len(names)  # fmt: skip
    assert not list(folder.iterdir())
    assert prefetch_main({"SKYGREEN_BUCKET": str(tmp_path / "empty"), "SKYGREEN_RUN_ID": "none"}) == 0


def test_a_trainer_folder_is_prefetched_under_its_paths_and_taken_by_the_folder_restore(tmp_path, monkeypatch):
    # A Hugging Face or Lightning run commits checkpoint folders (files under `files/<path>`):
    # the prefetch keeps their paths and the folder restore takes each proven file.
    from skygreen.checkpoint.folders import commit_folder, restore_latest
    from skygreen.checkpoint.manifest import blob_key
    from skygreen.checkpoint.prefetch import RECEIPT_SUFFIX, prefetch_dir, run_url
    from skygreen.runtime.prefetch import main as prefetch_main

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    bucket, run_id = str(tmp_path / "bucket"), "r-hf"
    url = run_url(bucket, run_id)
    out = tmp_path / "out" / "checkpoint-4"
    (out / "nested").mkdir(parents=True)
    (out / "model.safetensors").write_bytes(os.urandom(3000))
    (out / "nested" / "trainer_state.json").write_text('{"global_step": 4}')
    store = LocalStore(url)
    commit_folder(store, out, step=4)
    assert prefetch_main({"SKYGREEN_BUCKET": bucket, "SKYGREEN_RUN_ID": run_id}) == 0
    folder = prefetch_dir(url) / "4"
    assert (folder / "files" / "nested" / "trainer_state.json").read_text() == '{"global_step": 4}'
    assert (folder / "files" / "nested" / ("trainer_state.json" + RECEIPT_SUFFIX)).exists()

    rotten = Path(url) / blob_key(4, "files/model.safetensors")
    rotten.write_bytes(bytes(rotten.stat().st_size))  # the bucket's copy no longer verifies: only the prefetch's can
    restored = restore_latest(LocalStore(url), tmp_path / "again")
    assert restored is not None and restored.step == 4
    assert (restored.path / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert (restored.path / "nested" / "trainer_state.json").read_text() == '{"global_step": 4}'
    assert not [p for p in folder.rglob("*") if p.is_file()]  # every file taken, no receipt left


def test_a_sharded_checkpoint_is_prefetched_on_one_node_and_left_to_the_ranks_over_several(tmp_path, monkeypatch):
    import torch

    from skygreen.checkpoint.manifest import blob_key, iter_manifests
    from skygreen.checkpoint.prefetch import prefetch_dir, run_url
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.runtime.sharded import ShardedCheckpointer

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    bucket, run_id = str(tmp_path / "bucket"), "r-fsdp"
    url = run_url(bucket, run_id)
    with ShardedCheckpointer(url, template=lambda: {"model": {"w": torch.zeros(8)}}) as ck:
        ck.save(2, {"model": {"w": torch.arange(8.0)}})
    command = [sys.executable, "-m", "skygreen.runtime.prefetch"]
    env = {**os.environ, "SKYGREEN_BUCKET": bucket, "SKYGREEN_RUN_ID": run_id}

    # Over two nodes each rank downloads what it reads: nothing is prefetched.
    two = subprocess.run(command, env={**env, "SKYPILOT_SETUP_NODE_IPS": "10.0.0.1\n10.0.0.2\n"},
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert two.returncode == 0, two.stderr
    assert "step 2 is sharded over 2 nodes; each rank downloads the shard files it reads" in two.stdout
    assert not prefetch_dir(url).exists() or not [
        p for p in prefetch_dir(url).rglob("*") if p.is_file() and p.name != ".prefetching"
    ]

    # On one node the ranks read every file between them: prefetched, and taken once proven.
    one = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0 and "step 2 prefetched" in one.stdout, one.stderr
    manifest = next(iter_manifests(open_store(url)))
    for name in manifest.blobs:  # the bucket's copies no longer verify: only the prefetch's can
        blob = Path(url) / blob_key(2, name)
        blob.write_bytes(bytes(blob.stat().st_size))
    loaded = ShardedCheckpointer(url, template=lambda: {"model": {"w": torch.zeros(8)}}).load_latest()
    assert loaded is not None and loaded.step == 2 and torch.equal(loaded.state["model"]["w"], torch.arange(8.0))


def test_ranks_of_one_node_taking_the_same_prefetched_file_get_it_once_and_never_fail(tmp_path):
    import threading

    from skygreen.checkpoint.manifest import Manifest, file_info
    from skygreen.checkpoint.prefetch import take_prefetched, write_receipt

    (tmp_path / "4").mkdir()
    part, final = tmp_path / "4" / "dcp.metadata.part", tmp_path / "4" / "dcp.metadata"
    part.write_bytes(os.urandom(1 << 20))
    info = file_info(part)
    write_receipt(part, info, final=final)
    os.replace(part, final)
    manifest = Manifest(step=4, blobs={"shared.pt": info, "dcp.metadata": info}, created_at="2026-01-01T00:00:00Z")
    results: list[bool] = []
    start = threading.Barrier(8)

    def rank(r: int) -> None:
        start.wait()
        results.append(take_prefetched(tmp_path, manifest, "dcp.metadata", tmp_path / f"rank{r}.metadata"))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]  # one took it; the others download, none raised
    assert [file_info(p) for p in tmp_path.glob("rank*.metadata")] == [info]
    assert not list((tmp_path / "4").iterdir())  # nothing left half-taken


def test_a_prefetch_still_writing_is_waited_for_while_it_lives_and_a_dead_one_is_not(tmp_path, monkeypatch):
    from skygreen.checkpoint import prefetch as prefetch_module
    from skygreen.checkpoint.manifest import BlobInfo, Manifest, file_info
    from skygreen.checkpoint.prefetch import LOCK_NAME, take_prefetched, wait_for_part
    from skygreen.locks import held_while_alive

    folder = tmp_path / "7"
    folder.mkdir()
    data = os.urandom(4096)
    (folder / "shared.pt").write_bytes(data)
    info = file_info(folder / "shared.pt")
    (folder / "shared.pt").rename(folder / "shared.pt.part")  # the prefetch is mid-download
    manifest = Manifest(step=7, blobs={"shared.pt": info}, created_at="2026-01-01T00:00:00Z")
    polls: list[float] = []

    def prefetch_writes_its_part_after_a_while(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 50:  # a whole ranged part lands at last: the prefetch renames the file
            (folder / "shared.pt.part").rename(folder / "shared.pt")

    monkeypatch.setattr(prefetch_module.time, "sleep", prefetch_writes_its_part_after_a_while)
    with held_while_alive(tmp_path / LOCK_NAME):  # the prefetch process, alive
        assert take_prefetched(tmp_path, manifest, "shared.pt", tmp_path / "taken")  # waited, verified, taken
    assert len(polls) == 50  # no write for 49 polls did not make it download the blob a second time
    monkeypatch.undo()
    assert (tmp_path / "taken").read_bytes() == data
    assert info == BlobInfo(size=4096, sha256=info.sha256)

    (folder / "dead.part").write_bytes(b"x")  # the prefetch died mid-download: nothing holds the lock
    wait_for_part(folder / "dead.part", folder / "dead", lock=tmp_path / LOCK_NAME)
    assert not (folder / "dead").exists()
    with held_while_alive(tmp_path / LOCK_NAME):  # alive but hung: given up after the stall
        wait_for_part(folder / "dead.part", folder / "dead", lock=tmp_path / LOCK_NAME, stall_s=0.2)


def test_a_manifest_naming_a_blob_outside_the_folder_writes_nothing_there_and_is_skipped(tmp_path, s3_bucket):
    """A bucket is untrusted: a newer manifest listing `../../../../escaped.txt` (with an object
    under that literal S3 key and its true sha256) must not make setup's prefetch or the runtime
    write outside their folders; both skip it and take the older checkpoint."""
    import hashlib

    import torch

    from skygreen.checkpoint.manifest import blob_key, iter_manifests, manifest_key
    from skygreen.checkpoint.prefetch import run_url
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.runtime.checkpointer import Checkpointer

    url = run_url(f"s3://{s3_bucket}", "r-evil")
    with Checkpointer(url) as ck:
        ck.save(3, {"model": {"w": torch.ones(4)}})
    store = open_store(url)
    good = next(iter_manifests(store))
    escape, payload = "../../../../escaped.txt", b"written outside\n"
    store.put(blob_key(5, escape), payload)
    for name in good.blobs:
        store.put(blob_key(5, name), store.get(blob_key(3, name)))
    evil = {**good.to_json(), "step": 5}
    evil["blobs"] = {**evil["blobs"], escape: {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}}
    store.put(manifest_key(5), json.dumps(evil).encode())

    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "SKYGREEN_BUCKET": f"s3://{s3_bucket}", "SKYGREEN_RUN_ID": "r-evil"}
    done = subprocess.run(
        [sys.executable, "-m", "skygreen.runtime.prefetch"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "step 3 prefetched" in done.stdout
    assert "is not a plain file name" in done.stderr  # step 5 skipped, named
    loaded = subprocess.run(
        [sys.executable, "-c", f"from skygreen.runtime.checkpointer import Checkpointer; print(Checkpointer({url!r}).load_latest().step)"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert loaded.returncode == 0 and loaded.stdout.split() == ["3"], loaded.stderr
    assert not list(tmp_path.rglob("escaped.txt*")), "a blob was written outside its folder"


def test_a_receipt_vouches_only_for_the_file_and_the_blob_it_was_written_for(tmp_path):
    from skygreen.checkpoint.manifest import BlobInfo, file_info
    from skygreen.checkpoint.prefetch import receipt_path, receipt_vouches, write_receipt

    part, blob = tmp_path / "shared.pt.part", tmp_path / "shared.pt"
    part.write_bytes(os.urandom(4096))
    proved = file_info(part)
    write_receipt(part, proved, final=blob)
    os.replace(part, blob)  # as the prefetch does: receipt first, then the rename
    assert receipt_vouches(blob, proved)
    assert not receipt_vouches(blob, BlobInfo(size=proved.size, sha256="0" * 64))  # another manifest's blob
    assert not receipt_vouches(blob, BlobInfo(size=proved.size + 1, sha256=proved.sha256))
    os.utime(blob, ns=(blob.stat().st_atime_ns, blob.stat().st_mtime_ns + 1))  # written since
    assert not receipt_vouches(blob, proved)
    for broken in ("", "{", "[]", '{"size": 4096}', '{"size": 1, "sha256": 2, "identity": "x"}'):
        receipt_path(blob).write_text(broken)
        assert not receipt_vouches(blob, proved)  # a bad receipt is no receipt, never an error
    receipt_path(blob).unlink()
    assert not receipt_vouches(blob, proved)


SHM = Path("/dev/shm")


@pytest.mark.skipif(not SHM.is_dir() or not os.access(SHM, os.W_OK), reason="no writable /dev/shm (a tmpfs) here")
def test_a_prefetched_blob_is_taken_into_a_load_folder_on_another_filesystem(tmp_path):
    # A VM whose /tmp is a tmpfs loads into another filesystem than the prefetch's (under HOME):
    # a rename cannot cross it, so the verified blob is moved by a copy, not refused or crashed on.
    from skygreen.checkpoint.manifest import Manifest, file_info
    from skygreen.checkpoint.prefetch import take_prefetched

    load_folder = Path(tempfile.mkdtemp(dir=SHM))
    if os.stat(load_folder).st_dev == os.stat(tmp_path).st_dev:
        shutil.rmtree(load_folder)
        pytest.skip("/dev/shm is on the same filesystem as the test's folder here")
    try:
        (tmp_path / "7").mkdir()
        data = os.urandom(8192)
        (tmp_path / "7" / "shared.pt").write_bytes(data)
        manifest = Manifest(
            step=7, blobs={"shared.pt": file_info(tmp_path / "7" / "shared.pt")}, created_at="2026-01-01T00:00:00Z"
        )
        assert take_prefetched(tmp_path, manifest, "shared.pt", load_folder / "shared.pt")
        assert (load_folder / "shared.pt").read_bytes() == data
        assert not (tmp_path / "7" / "shared.pt").exists()  # moved, not left behind
    finally:
        shutil.rmtree(load_folder)


# ---------------------------------------------------------------- the plan learns it


def test_the_plan_uses_the_changeover_measured_on_a_cloud_and_gpu_and_says_so():
    task = parse_spec_text("skygreen: {gpus: [L4, T4], work: {gpu_hours: 50, gpu: T4}}\nrun: python train.py\n")
    catalog = load_catalog(FIXTURE_CATALOG, env={})
    flat = make_plan(task, catalog)
    learned = make_plan(task, catalog, measured_changeover_s={"aws/L4": 60.0, "gcp": 1800.0})
    flat_by = {(c.cloud, c.region, c.accelerator): c for c in flat.candidates}
    for c in learned.candidates:
        before = flat_by[(c.cloud, c.region, c.accelerator)]
        if (c.cloud, c.accelerator) == ("aws", "L4"):
            assert c.restart_s == PROVISION_S + 60.0 < before.restart_s
            assert c.est_cost_usd < before.est_cost_usd
        elif c.cloud == "gcp":  # the cloud's figure where its GPU has none
            assert c.restart_s == PROVISION_S + 1800.0 and c.est_cost_usd > before.est_cost_usd
        else:
            assert c.restart_s == DEFAULT_RESTART_S and c.est_cost_usd == before.est_cost_usd
    line = learned.assumptions[1]
    assert "restart 4 min provisioning (Can't Be Late, NSDI'24) + the changeover measured" in line
    assert "aws/L4 1 min, gcp 30 min; elsewhere 6 min" in line
    assert "restart 6 min (no changeover measured yet)" in flat.assumptions[1]


# ---------------------------------------------------------------- a real kill -9 and resume


@pytest.mark.slow
def test_a_resumed_local_run_records_its_changeover_and_status_and_cost_show_it(private_home, tmp_path):
    env = user_env(private_home, TINY_STEPS="300")
    release = tmp_path / "release"
    release.mkdir()
    gated = {**env, HOLD_ENV: "100,200", RELEASE_ENV: str(release)}
    launched = skygreen(gated, "up", str(TINY), "--local", "--no-smoke", "--detach")
    assert launched.returncode == 0, launched.stderr
    run_id = wait_for(lambda: [r["run_id"] for r in json.loads(skygreen(env, "status", "--json").stdout)], "the run")[0]
    wait_for_step(env, run_id, 100)
    os.killpg(json.loads(run_json(env, run_id).read_text())["launches"][-1]["pid"], signal.SIGKILL)
    wait_for(lambda: status(env, run_id)["state"] == "STOPPED", "the run to read as stopped")

    # This machine's "setup" for the next life: stamps as the rendered setup script writes them.
    started_path, ended_path = stamp_paths(run_id, Path(env["HOME"]))
    started_path.parent.mkdir(parents=True, exist_ok=True)
    setup_started = time.time()
    started_path.write_text(f"{setup_started}\n")
    ended_path.write_text(f"{setup_started + 0.5}\n")
    time.sleep(0.6)  # the process starts after setup ended, as on a VM

    resumed = skygreen(gated, "resume", run_id, "--detach")
    assert resumed.returncode == 0, resumed.stderr
    wait_for_step(env, run_id, 200)

    cost = skygreen(env, "cost", run_id, "--json")
    assert cost.returncode == 0, cost.stderr
    segments = json.loads(cost.stdout)["segments"]
    assert [s["end"] for s in segments] == ["killed", "running"]
    first, second = (s["changeover"] for s in segments)
    assert first["restore_bytes"] is None and first["redone_steps"] is None  # started from scratch
    assert second["restore_bytes"] > 0 and second["restore_s"] > 0
    assert second["restore_bytes_per_s"] == pytest.approx(second["restore_bytes"] / second["restore_s"])
    assert second["setup_s"] == pytest.approx(0.5)
    # From the first setup line to the first new step: the setup, the process start and the restore.
    assert second["to_first_step_s"] >= 0.6 + second["restore_s"]
    assert second["redone_steps"] == 0  # killed held at its commit: nothing beyond it to redo

    shown = status(env, run_id)["changeovers"]
    assert len(shown) == 1 and shown[0]["restore_bytes"] == second["restore_bytes"]
    detail = skygreen(env, "status", run_id)
    line = describe(Changeover(**shown[0]))
    assert line.startswith("segment 2: setup 0.5 s, restore ") and line.endswith(", 0 steps redone")
    assert detail.returncode == 0 and ["changeover", line] in [row.split(None, 1) for row in detail.stdout.splitlines()]
    table = skygreen(env, "cost", run_id)
    assert table.returncode == 0 and "changeovers (first setup line" in table.stdout
    assert f"  {line}\n" in table.stdout

    page = tmp_path / "report.html"
    written = skygreen(env, "report", run_id, "-o", str(page))
    assert written.returncode == 0, written.stderr
    assert "<h3>Changeovers</h3>" in page.read_text() and f"<li>{line}</li>" in page.read_text()

    (release / "200").touch()
    wait_for(lambda: status(env, run_id)["state"] == "SUCCEEDED", "the run to finish")

    # The next plan of the task learns the measured changeover from the run's history.
    assert skygreen(env, "cost", run_id).returncode == 0  # refreshes what the run measured
    planned = skygreen(env, "plan", str(TINY), "--catalog", str(FIXTURE_CATALOG), "--json")
    assert planned.returncode == 0, planned.stderr
    restart_line = json.loads(planned.stdout)["assumptions"][1]
    assert f"the changeover measured by earlier runs of this task (local {second['to_first_step_s'] / 60:.3g} min" in (
        restart_line
    )


@pytest.mark.slow
def test_a_kill_9_past_the_last_commit_counts_the_heartbeats_steps_as_redone(private_home, tmp_path):
    """Committed at step 30, then held at step 60 without a commit (checkpoints an hour apart, so
    none lands in between) until the ledger's heartbeat records step 60; kill -9 and `resume`:
    the new life restores step 30 and trains steps 31-60 again, and its changeover says so."""
    spec = yaml.safe_load(TINY.read_text())
    spec["skygreen"]["checkpoint"] = {"every": "1h", "keep": 3, "bucket": str(tmp_path / "bucket")}
    spec["skygreen"].pop("early_stopping", None)
    spec["skygreen"]["model"] = {"params": 110_000}  # the plan's memory estimate meets the measured peak
    spec["workdir"] = str(REPO / "tasks")
    task = tmp_path / "tiny.yaml"
    task.write_text(yaml.safe_dump(spec))
    release = tmp_path / "release"
    release.mkdir()
    env = user_env(private_home, TINY_STEPS="80", SKYGREEN_LEDGER_HEARTBEAT_S="0.001")
    gated = {**env, HOLD_ENV: "30", HOLD_UNCOMMITTED_ENV: "60", RELEASE_ENV: str(release)}
    launched = skygreen(gated, "up", str(task), "--local", "--no-smoke", "--detach")
    assert launched.returncode == 0, launched.stderr
    (run,) = json.loads(skygreen(env, "status", "--json").stdout)
    run_id = run["run_id"]
    store = LocalStore(str(tmp_path / "bucket" / run_id))
    wait_for_step(env, run_id, 30)
    (release / "30").touch()

    def held_at_60_with_its_heartbeat() -> bool:
        s = status(env, run_id)
        assert s["state"] == "RUNNING", f"the run ended ({s['state']}) before step 60"
        segments = read_ledger(store)
        return "held at step 60 (" in launch_log(env, run_id) and segments[-1].reached_step == 60

    wait_for(held_at_60_with_its_heartbeat, "the run held at step 60, its heartbeat recorded")
    assert status(env, run_id)["step"] == 30  # nothing was committed past step 30
    os.killpg(json.loads(run_json(env, run_id).read_text())["launches"][-1]["pid"], signal.SIGKILL)
    wait_for(lambda: status(env, run_id)["state"] == "STOPPED", "the run to read as stopped")

    resumed = skygreen(env, "resume", run_id)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert status(env, run_id)["state"] == "SUCCEEDED"
    cost = skygreen(env, "cost", run_id, "--json")
    assert cost.returncode == 0, cost.stderr
    killed, finished = json.loads(cost.stdout)["segments"]
    assert killed["end"] == "killed" and killed["reached_step"] == 60 and finished["start_step"] == 30
    assert finished["changeover"]["redone_steps"] == 30  # steps 31-60, trained twice
    first, second = read_ledger(store)
    assert second.redone_steps == 30 and first.reached_step == 60
    (shown,) = status(env, run_id)["changeovers"]
    assert shown["redone_steps"] == 30 and describe(Changeover(**shown)).endswith(", 30 steps redone")
    table = skygreen(env, "cost", run_id)
    assert table.returncode == 0 and "30 steps redone" in table.stdout
    # The plan's memory per GPU and the peak this life measured, side by side in the ledger and status.
    memory = status(env, run_id)["memory"]
    assert memory["planned_gb"]["gpus"] == 1 and 0 < memory["planned_gb"]["tensors"] < memory["planned_gb"]["low"]
    assert memory["peak_gb"] > 0 and memory["measure"] == CPU_MEASURE and memory["segment"] == 2
    assert second.memory_peak_gb == memory["peak_gb"] and second.memory_planned_gb == memory["planned_gb"]
    shown_lines = skygreen(env, "status", run_id).stdout.splitlines()
    assert [line for line in shown_lines if line.startswith("memory/GPU ") and "; measured peak " in line]
