"""FSDP2 runs under `torchrun` (gloo, CPU) with sharded asynchronous checkpoints.

Each test kills a run at a gated point (a rank held inside the upload of a save, or a run held
at a step after its commit: `SKYGREEN_TEST_HOLD_UPLOAD`, `SKYGREEN_TEST_HOLD_AT_STEPS`), never
at a moment it has to race for, and compares the resumed run with an uninterrupted one:

- killed with kill -9 while both ranks upload a save: no commit, resumes from the one before,
  bit-identical at the same world size (local store);
- one rank killed mid-save: the same (GCS emulator);
- 2 -> 4 -> 1 ranks: the checkpoint reshards, every step uses exactly the samples the
  uninterrupted run used, the effective batch is kept (accumulation 4 -> 2 -> 8), and the loss
  stays within 1e-5 (relative) of the uninterrupted run's: only the order of the fp32 sums
  changed (moto S3);
- each rank downloads only the shard files its own slices need, counted at a proxy in front of
  moto for each rank: 2 -> 4 ranks, rank r fetches the one file its half came from; 4 -> 1, all
  four; and a corrupt shard file that only rank 1 needs still makes both ranks fall back;
- `micro: auto` with one rank's device smaller than the other's: both ranks agree on the
  micro-batch the smaller one holds, without ever running out of memory (a fake device).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from faultproxy import FaultProxy
from skygreen.checkpoint.manifest import committed_steps, manifest_key, read_manifest
from skygreen.checkpoint.store_factory import open_store
from skygreen.runtime.sharded import blobs_by_base

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "fsdp_train.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
STEPS = 6
LOSS_RTOL = 1e-5

pytestmark = pytest.mark.skipif(not TORCHRUN.exists() and not shutil.which("torchrun"), reason="torchrun not installed")


def launch(nproc: int, bucket: str, run_id: str, out: Path, **env: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SKYGREEN_")}
    full_env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **env)
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(nproc), str(SCRIPT), bucket, run_id, str(STEPS)]
    return subprocess.Popen([*cmd, str(out)], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    return out


def wait_for(proc: subprocess.Popen, ready, what: str) -> None:
    """Poll `ready()` until true; fail loudly if the run ended first."""
    deadline = time.monotonic() + 300
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {what}: {proc.communicate()[0][-4000:]}")
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (torchrun starts each worker in a session of its own)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def kill_all(proc: subprocess.Popen) -> None:
    """kill -9 the workers and torchrun, as a lost VM would."""
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)


def steps_log(out: Path) -> dict[int, dict]:
    """The last record of each step (a resumed life logs the steps it redid again)."""
    lines = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return {line["step"]: line for line in lines}


def weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "weights.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted 2-rank run to STEPS."""
    root = tmp_path_factory.mktemp("fsdp-ref")
    finish(launch(2, str(root / "bucket"), "ref", root / "out"))
    return root / "out"


def assert_same_as(reference: Path, out: Path) -> None:
    ref, got = weights(reference), weights(out)
    assert ref.keys() == got.keys()
    for name in ref:
        assert torch.equal(ref[name], got[name]), name
    assert steps_log(out) == steps_log(reference)


def test_accumulation_reduce_scatters_once_per_step_and_clipping_sees_the_global_norm(reference):
    for step, line in steps_log(reference).items():
        # 3 sharded Linear layers, accumulation 4: one reduce-scatter each, on the last micro-step only
        assert line["accum"] == 4 and line["reduce_scatters"] == 3, (step, line)
        assert line["grad_norm"] == pytest.approx(line["grad_norm_gathered"], rel=1e-6), (step, line)
        if line["grad_norm_gathered"] > 0.5:
            assert line["grad_norm_after_clip"] == pytest.approx(0.5, rel=1e-4), (step, line)
    assert any(line["grad_norm_gathered"] > 0.5 for line in steps_log(reference).values())  # clipping happened


def test_kill_9_during_an_async_save_leaves_no_commit_and_resumes_bit_identical(tmp_path, reference):
    """Launched as skygreen launches it (`SKYGREEN_LAUNCH` 1, then 2 for the resume): every rank's
    files carry its life's name, and the next launch's ranks each find and read their own."""
    bucket, out, held = str(tmp_path / "bucket"), tmp_path / "out", tmp_path / "held"
    proc = launch(2, bucket, "victim", out, SKYGREEN_LAUNCH="1", SKYGREEN_TEST_HOLD_UPLOAD=f"4:0,1:{held}")
    markers = [held / "upload-4-rank0", held / "upload-4-rank1"]
    wait_for(proc, lambda: all(m.exists() for m in markers), "both ranks were inside the upload of step 4")
    kill_all(proc)
    store = open_store(f"{bucket}/victim")
    assert committed_steps(store) == [2]
    assert not store.exists(manifest_key(4)) and store.list("ckpt/000000000004/")  # files up, no commit
    resumed = finish(launch(2, bucket, "victim", out, SKYGREEN_LAUNCH="2"))
    assert "resumed run victim at step 2" in resumed
    assert_same_as(reference, out)
    manifest = read_manifest(store, max(committed_steps(store)))
    assert manifest.layout == "sharded-dcp" and manifest.world_size == 2 and manifest.meta["state"] == "completed"
    assert {"dcp.metadata", "dcp__0_0.distcp", "dcp__1_0.distcp", "shared.pt"} <= set(blobs_by_base(manifest))
    assert all(".l2-" in name for name in manifest.blobs)  # written by launch 2's ranks, each under its own name
    assert not store.list("ckpt/000000000004/") or store.exists(manifest_key(4))  # the leftovers were cleared
    # the changeover of the sharded restore, in the ledger: rank 0's time and the bytes it fetched
    segments = sorted(
        (json.loads(p.read_text()) for p in (Path(bucket) / "victim" / "ledger").glob("*.json")),
        key=lambda s: s["started_at"],
    )
    assert [s["start_step"] for s in segments] == [0, 2]
    assert segments[0]["restore_bytes"] is None and segments[0]["restore_s"] is None  # started fresh
    restored = read_manifest(store, 2)
    names = blobs_by_base(restored)
    assert all(".l1-" in name for name in restored.blobs)  # launch 1's files, read by launch 2
    own = ("dcp.metadata", "shared.pt", "rank00000.pt", "dcp__0_0.distcp")
    assert segments[1]["restore_bytes"] == sum(restored.blobs[names[name]].size for name in own)
    assert segments[1]["restore_bytes"] < sum(b.size for b in restored.blobs.values())  # not rank 1's files
    assert segments[1]["restore_s"] > 0


def test_a_rank_lost_mid_save_leaves_no_commit_and_the_run_falls_back(tmp_path, reference, gcs_bucket):
    bucket, out, held = f"gs://{gcs_bucket}/runs", tmp_path / "out", tmp_path / "held"
    proc = launch(2, bucket, "victim", out, SKYGREEN_TEST_HOLD_UPLOAD=f"4:1:{held}")
    marker = held / "upload-4-rank1"
    wait_for(proc, marker.exists, "rank 1 was inside the upload of step 4")
    os.kill(int(marker.read_text()), signal.SIGKILL)  # rank 1 only; torchrun then stops rank 0
    proc.communicate(timeout=300)
    assert proc.returncode != 0
    store = open_store(f"{bucket}/victim")
    assert committed_steps(store) == [2]
    assert not store.exists(manifest_key(4))
    resumed = finish(launch(2, bucket, "victim", out))
    assert "resumed run victim at step 2" in resumed
    assert_same_as(reference, out)


@contextlib.contextmanager
def rank_proxies(upstream: str, nproc: int):
    """One request-logging proxy in front of moto per rank, and the variable that routes rank r
    through the r-th (read by fsdp_train.py)."""
    proxies = [FaultProxy(upstream).start() for _ in range(nproc)]
    try:
        yield proxies, {"FSDP_TEST_S3_ENDPOINTS": ",".join(p.url for p in proxies)}
    finally:
        for proxy in proxies:
            proxy.stop()


def shard_gets(proxy: FaultProxy, step: int) -> list[str]:
    """The DCP shard files of `step` this proxy's rank downloaded (GET, any outcome)."""
    folder = f"/ckpt/{step:012d}/"
    return sorted(
        path.rsplit("/", 1)[1]
        for method, path, _ in proxy.log
        if method == "GET" and folder in path and path.rsplit("/", 1)[1].startswith("dcp__")
    )


def test_resharding_from_2_to_4_to_1_ranks_keeps_the_samples_and_the_loss(tmp_path, reference, s3_bucket, moto_server):
    bucket, out = f"s3://{s3_bucket}/runs", tmp_path / "out"
    store = open_store(f"{bucket}/elastic")
    fetched: dict[int, list[list[str]]] = {}
    for nproc, held_at in ((2, 2), (4, 4)):
        with rank_proxies(moto_server.url, nproc) as (proxies, env):
            proc = launch(nproc, bucket, "elastic", out, SKYGREEN_TEST_HOLD_AT_STEPS=str(held_at), **env)
            wait_for(proc, lambda s=held_at: s in committed_steps(store), f"step {held_at} was committed")
            kill_all(proc)
            fetched[nproc] = [shard_gets(p, 2) for p in proxies]
    assert read_manifest(store, 4).world_size == 4
    with rank_proxies(moto_server.url, 1) as (proxies, env):
        finish(launch(1, bucket, "elastic", out, **env))
        fetched[1] = [shard_gets(proxies[0], 4)]
    # 2 -> 4: each rank's slice lies inside one saved rank's half, so it fetches that file only
    assert fetched[4] == [["dcp__0_0.distcp"], ["dcp__0_0.distcp"], ["dcp__1_0.distcp"], ["dcp__1_0.distcp"]]
    # 4 -> 1: the one rank holds everything, so it needs every rank's file
    assert fetched[1] == [[f"dcp__{r}_0.distcp" for r in range(4)]]
    ref, got = steps_log(reference), steps_log(out)
    assert sorted(got) == list(range(STEPS))
    shapes = [(got[s]["world_size"], got[s]["accum"]) for s in range(STEPS)]
    assert shapes == [(2, 4), (2, 4), (4, 2), (4, 2), (1, 8), (1, 8)]
    for step in range(STEPS):
        assert got[step]["samples"] == ref[step]["samples"], step  # the global sample stream continues exactly
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=LOSS_RTOL), step
    ref_w, got_w = weights(reference), weights(out)
    for name in ref_w:
        torch.testing.assert_close(got_w[name], ref_w[name], rtol=LOSS_RTOL, atol=1e-6)


def test_a_corrupt_shard_only_one_rank_needs_still_makes_every_rank_fall_back(
    tmp_path, reference, s3_bucket, moto_server
):
    """Rank 0 never downloads rank 1's shard file at the same world size, so only rank 1 finds it
    corrupt; the ranks agree, and both load the commit before (bit-identical to the reference)."""
    import boto3

    bucket, out = f"s3://{s3_bucket}/runs", tmp_path / "out"
    store = open_store(f"{bucket}/victim")
    proc = launch(2, bucket, "victim", out, SKYGREEN_TEST_HOLD_AT_STEPS="4")
    wait_for(proc, lambda: 4 in committed_steps(store), "step 4 was committed")
    kill_all(proc)
    key = f"runs/victim/ckpt/{4:012d}/dcp__1_0.distcp"
    s3 = boto3.client("s3")
    data = bytearray(s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0xFF  # bit rot in the bucket, same size
    s3.put_object(Bucket=s3_bucket, Key=key, Body=bytes(data))
    with rank_proxies(moto_server.url, 2) as (proxies, env):
        resumed = finish(launch(2, bucket, "victim", out, **env))
        step4 = [shard_gets(p, 4) for p in proxies]
        step2 = [shard_gets(p, 2) for p in proxies]
    assert "resumed run victim at step 2" in resumed
    assert "dcp__1_0.distcp does not match the manifest" in resumed
    assert step4[0] == ["dcp__0_0.distcp"]  # rank 0 fetched its own file only, which verified
    assert "dcp__1_0.distcp" in step4[1]  # only rank 1 saw the corrupt one
    assert step2 == [["dcp__0_0.distcp"], ["dcp__1_0.distcp"]]
    assert_same_as(reference, out)


def test_micro_auto_under_fsdp2_agrees_on_what_the_tightest_rank_holds_without_running_out_of_memory(
    tmp_path, reference
):
    """Rank 1's "GPU" (a `FakeDeviceMemory`: 1000 MiB + 100 MiB per sample, raising torch's
    OutOfMemoryError past its size) holds 3 samples, rank 0's 8. Micro-batch 4, the whole
    per-rank batch, would run rank 1 out of memory in the middle of FSDP's forward. The probe
    measures micro 1 and 2 on both ranks, and both take micro 2 (90% of 1350 MiB holds 2.15
    samples; rank 0 alone would take 4). Nothing runs out of memory, nothing hangs (the run is
    waited for with a timeout), and every step uses the reference's samples with its loss."""
    out = tmp_path / "out"
    log = finish(launch(2, str(tmp_path / "bucket"), "auto", out, FSDP_TEST_MEMORY_MIB="2000,1350"))
    assert "micro: auto: micro-batch 2 (accumulation 2)" in log, log[-3000:]
    assert "rank 0 alone would take 4, the tightest rank 2" in log
    assert "out of memory" not in log.lower().replace("micro: auto", "")
    ref, got = steps_log(reference), steps_log(out)
    assert [got[s]["accum"] for s in range(STEPS)] == [4, 4, 2, 2, 2, 2]  # micro 1, 1 (measured), 2 (measured), 2...
    for step in range(STEPS):
        assert got[step]["samples"] == ref[step]["samples"], step
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=LOSS_RTOL), step
    ref_w, got_w = weights(reference), weights(out)
    for name in ref_w:
        torch.testing.assert_close(got_w[name], ref_w[name], rtol=LOSS_RTOL, atol=1e-6)


def test_the_fsdp2_probe_fits_a_line_and_keeps_to_divisors():
    from skygreen.runtime.autotune import MemoryProbe, divisor_at_most
    from skygreen.testing import FakeDeviceMemory

    mib = 2**20
    fake = FakeDeviceMemory(capacity_bytes=3000 * mib, base_bytes=1000 * mib, bytes_per_sample=50 * mib)
    probe = MemoryProbe(per_rank_batch=48, meter=fake)
    assert probe.schedule == (1, 1, 2)
    for _ in probe.schedule:
        fake.allocate(probe.micro_for_next_step())
        probe.step_done()
    assert probe.done and probe.peaks == {1: 1050 * mib, 2: 1100 * mib}
    assert probe.largest_fitting() == 34  # (0.9 x 3000 - 1000) / 50
    assert divisor_at_most(34, 48) == 24 and divisor_at_most(34, 7) == 7 and divisor_at_most(0, 6) == 1
    assert MemoryProbe(per_rank_batch=9, meter=fake).schedule == (1, 1, 3)
    assert MemoryProbe(per_rank_batch=1, meter=fake).schedule == ()  # nothing to choose
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
        fake.allocate(41)
    assert fake.out_of_memory == [41]


def test_the_tasks_precision_becomes_fsdp2s_mixed_precision_policy():
    from skygreen.errors import InputError
    from skygreen.runtime.fsdp import mixed_precision, task_precision

    bf16 = mixed_precision("bf16")
    assert bf16.param_dtype == torch.bfloat16 and bf16.reduce_dtype == torch.float32
    assert mixed_precision("fp16").param_dtype == torch.float16
    assert mixed_precision("fp32").param_dtype is None  # FSDP2's default: no casting
    with pytest.raises(InputError, match="'fp8' is not one of"):
        mixed_precision("fp8")
    assert task_precision(torch.device("cpu"), {"SKYGREEN_SMOKE": "1"}) == "fp32"
