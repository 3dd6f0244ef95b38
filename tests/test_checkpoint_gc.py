"""`skygreen gc`: stale checkpoints to cold storage on a real S3 server, dry run by default."""

from __future__ import annotations

import pytest

from skygreen.checkpoint.manifest import SHARED_BLOB, Manifest, blob_info, manifest_key
from skygreen.checkpoint.store_factory import open_store
from skygreen.cli import main

OLD = "2020-01-01T00:00:00.000000Z"


def commit(store, step: int, *, created_at: str = OLD, metric=None, pinned=False) -> None:
    payload = b"weights %d" % step
    store.put(f"ckpt/{step:012d}/{SHARED_BLOB}", payload)
    m = Manifest(
        step=step, created_at=created_at, blobs={SHARED_BLOB: blob_info(payload)}, metric=metric, pinned=pinned
    )
    store.put(manifest_key(step), m.dumps())


def run_cli(capsys, *argv: str) -> str:
    main(list(argv))
    return capsys.readouterr().out


def test_gc_moves_only_stale_unprotected_blobs_and_only_with_yes(s3_bucket, capsys):
    run_url = f"s3://{s3_bucket}/runs/r1"
    store = open_store(run_url)
    commit(store, 1, metric=0.1)  # best
    commit(store, 2, pinned=True)  # gold
    commit(store, 3)  # stale: the one to move
    commit(store, 4, created_at="2999-01-01T00:00:00.000000Z")  # recent
    commit(store, 5)  # latest
    blob = "ckpt/000000000003/shared.pt"

    dry = run_cli(capsys, "gc", f"s3://{s3_bucket}/runs", "--older-than", "90d")
    assert f"would move {run_url}/{blob}" in dry and "to GLACIER" in dry and "--yes" in dry
    assert dry.count("would move") == 1
    assert store.storage_class(blob) == "STANDARD"

    done = run_cli(capsys, "gc", run_url, "--older-than", "90d", "--yes", "--storage-class", "deep_archive")
    assert f"moved {run_url}/{blob}" in done
    assert store.storage_class(blob) == "DEEP_ARCHIVE"
    assert store.storage_class(manifest_key(3)) == "STANDARD", "the manifest stays readable"
    for step in (1, 2, 4, 5):
        assert store.storage_class(f"ckpt/{step:012d}/{SHARED_BLOB}") == "STANDARD"
    again = run_cli(capsys, "gc", run_url, "--older-than", "90d", "--yes")
    assert "nothing older than 90d" in again, "objects already in a cold class are left alone"


def test_gc_on_a_local_bucket_says_cold_storage_does_not_apply(tmp_path, capsys):
    commit(open_store(str(tmp_path)), 1)
    out = run_cli(capsys, "gc", str(tmp_path), "--older-than", "1d", "--yes")
    assert "cold storage classes do not apply" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--older-than", "ninety"], "--older-than"),
        (["--storage-class", "ARCHIVE"], "--storage-class"),
    ],
)
def test_gc_bad_flags_exit_2_naming_the_flag(s3_bucket, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(["gc", f"s3://{s3_bucket}/runs", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_gc_by_run_id_finds_the_runs_bucket_through_the_registry(private_home, s3_bucket, capsys):
    from skygreen.launch.registry import Registry, RunRecord

    record = RunRecord(
        run_id="demo-20260101-000000-abcd", task_path="task.yaml", task_name="demo", mode="cloud",
        launcher="skypilot", bucket=f"s3://{s3_bucket}/runs", task_yaml="task.yaml", spec_snapshot={},
        created_at=OLD, state="SUCCEEDED",
    )  # fmt: skip
    Registry().save(record)
    store = open_store(record.checkpoint_url)
    commit(store, 1)
    commit(store, 2)
    out = run_cli(capsys, "gc", record.run_id)
    assert f"would move {record.checkpoint_url}/ckpt/000000000001/{SHARED_BLOB}" in out
    assert out.count("would move") == 1
