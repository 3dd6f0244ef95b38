"""Checkpoint folders as verified, manifest-last commits, on a local directory, S3 (moto) and
GCS (the emulator): commit a nested folder, restore the newest one that verifies (falling back
past corrupt and partial ones), retention by `keep`, and a bucket whose manifest names files
outside the folder. The runtime's own loader passes folder commits over."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from skygreen.checkpoint.folders import (
    FILES_DIR,
    commit_and_retain,
    commit_folder,
    committed_folder_steps,
    folder_model_sha256,
    folder_step,
    mark_completed,
    restore_latest,
)
from skygreen.checkpoint.manifest import (
    FOLDER_KIND,
    RUN_META_KEYS,
    Manifest,
    blob_info,
    blob_key,
    manifest_key,
    read_manifest,
    run_meta,
)
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import CheckpointError
from skygreen.runtime.checkpointer import Checkpointer


@pytest.fixture(params=["local", "s3", "gs", "az"])
def url(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "bucket" / "run")
    bucket = request.getfixturevalue({"s3": "s3_bucket", "gs": "gcs_bucket", "az": "azure_bucket"}[request.param])
    return f"{request.param}://{bucket}/runs/r1"


def write_checkpoint(parent: Path, step: int) -> Path:
    """A folder shaped like an HF Trainer checkpoint, nested files included, contents per step."""
    folder = parent / f"checkpoint-{step}"
    (folder / "sub" / "deeper").mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(bytes([step % 256]) * (1000 + step))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (folder / "manifest.json").write_text("a file of the trainer's, not the commit")
    (folder / "sub" / "deeper" / "rng.bin").write_bytes(b"rng" * step)
    return folder


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_nested_folder_round_trips_byte_for_byte(url, tmp_path):
    store = open_store(url)
    source = write_checkpoint(tmp_path / "out", 20)
    manifest = commit_folder(store, source, step=20, meta={"run_id": "r1"})
    assert manifest.kind == FOLDER_KIND
    assert read_manifest(store, 20) == manifest
    assert set(manifest.blobs) == {f"{FILES_DIR}/{name}" for name in tree(source)}

    restored = restore_latest(store, tmp_path / "elsewhere")
    assert restored is not None and restored.step == 20
    assert restored.path == tmp_path / "elsewhere" / "checkpoint-20"
    assert tree(restored.path) == tree(source)
    assert [p.name for p in (tmp_path / "elsewhere").iterdir()] == ["checkpoint-20"]  # no temp left


def test_the_newest_that_verifies_is_restored_past_corrupt_and_partial_ones(url, tmp_path, caplog):
    store = open_store(url)
    out = tmp_path / "out"
    for step in (10, 20, 30, 40):
        commit_folder(store, write_checkpoint(out, step), step=step)
    # 40: bit rot, same size (only the sha256 catches it); 30: a file gone
    key = blob_key(40, f"{FILES_DIR}/model.safetensors")
    data = bytearray(store.get(key))
    data[7] ^= 0xFF
    store.put(key, bytes(data))
    store.delete(blob_key(30, f"{FILES_DIR}/sub/deeper/rng.bin"))
    # 50: blobs uploaded, manifest never written (the VM died mid-commit)
    store.put(blob_key(50, f"{FILES_DIR}/model.safetensors"), b"half")

    target = tmp_path / "restore"
    write_checkpoint(target, 20)
    (target / "checkpoint-20" / "model.safetensors").write_bytes(b"a partial save of the life that died")
    with caplog.at_level(logging.WARNING, logger="skygreen"):
        restored = restore_latest(store, target)
    assert restored is not None and restored.step == 20
    assert tree(restored.path) == tree(write_checkpoint(tmp_path / "expected", 20))
    assert "step 40" in caplog.text and "does not match the manifest" in caplog.text
    assert "step 30" in caplog.text and "missing" in caplog.text
    assert not [p for p in target.iterdir() if p.name.startswith(".skygreen-")]


def test_an_empty_bucket_restores_nothing(url, tmp_path):
    assert restore_latest(open_store(url), tmp_path / "out") is None


def test_retention_keeps_the_last_keep_and_never_counts_a_corrupt_one(url, tmp_path):
    store = open_store(url)
    out = tmp_path / "out"
    for step in (1, 2, 3):
        commit_and_retain(store, write_checkpoint(out, step), step=step, keep=2)
    assert committed_folder_steps(store) == [2, 3]
    store.delete(blob_key(3, f"{FILES_DIR}/trainer_state.json"))  # 3 no longer verifies
    commit_and_retain(store, write_checkpoint(out, 4), step=4, keep=2)
    assert committed_folder_steps(store) == [2, 4]  # 2 stays: the broken 3 does not count
    assert store.list("quarantine/")  # 3 moved aside, not lost


def test_a_manifest_naming_a_path_outside_the_folder_is_refused(url, tmp_path):
    store = open_store(url)
    commit_folder(store, write_checkpoint(tmp_path / "out", 5), step=5)
    created_at = read_manifest(store, 5).created_at
    # step 6: a file name that climbs out of the folder (the local store refuses such a key
    # itself, the GCS emulator drops the connection; S3 stores it)
    evil_blob = f"{FILES_DIR}/../../escaped.txt"
    if url.startswith("s3://"):
        store.put(blob_key(6, evil_blob), b"x")
    fair = Manifest(kind=FOLDER_KIND, step=6, created_at=created_at, blobs={f"{FILES_DIR}/x": blob_info(b"x")},
                    meta={"folder": "checkpoint-6"})  # fmt: skip
    evil_json = {**fair.to_json(), "blobs": {evil_blob: blob_info(b"x").to_json()}}  # no writer makes such a name
    store.put(manifest_key(6), json.dumps(evil_json).encode())
    # step 7: a folder name that climbs out of the target
    store.put(blob_key(7, f"{FILES_DIR}/x"), b"x")
    evil = Manifest(kind=FOLDER_KIND, step=7, created_at=created_at, blobs={f"{FILES_DIR}/x": blob_info(b"x")},
                    meta={"folder": "../escaped"})  # fmt: skip
    store.put(manifest_key(7), evil.dumps())

    restored = restore_latest(store, tmp_path / "restore" / "inner")
    assert restored is not None and restored.step == 5
    assert sorted(p.name for p in (tmp_path / "restore").rglob("*") if "escaped" in p.name) == []
    assert not (tmp_path / "escaped.txt").exists()


def test_a_folder_holding_a_name_no_restore_can_write_is_refused_before_any_upload(tmp_path):
    store = open_store(str(tmp_path / "bucket"))
    folder = write_checkpoint(tmp_path / "out", 3)
    (folder / "odd\\name.bin").write_bytes(b"x")  # a legal Linux file name a restore would refuse
    with pytest.raises(CheckpointError, match=r"'odd\\\\name.bin' cannot be restored on another machine"):
        commit_folder(store, folder, step=3)
    assert store.list() == []


def test_commit_of_a_missing_or_empty_folder_is_an_error(tmp_path):
    store = open_store(str(tmp_path / "bucket"))
    with pytest.raises(CheckpointError, match="does not exist"):
        commit_folder(store, tmp_path / "nope", step=1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no files"):
        commit_folder(store, tmp_path / "empty", step=1)
    assert store.list() == []


def test_the_runtime_loader_passes_folder_commits_over(tmp_path):
    url = str(tmp_path / "bucket" / "run")
    with Checkpointer(url, keep=3) as ck:
        ck.save(1, {"w": torch.ones(2)})
        ck.wait()
    commit_folder(open_store(url), write_checkpoint(tmp_path / "out", 2), step=2)
    with Checkpointer(url, keep=3) as ck:
        loaded = ck.load_latest()
    assert loaded is not None and loaded.step == 1
    assert restore_latest(open_store(url), tmp_path / "restore").step == 2  # type: ignore[union-attr]


@pytest.mark.parametrize(("name", "step"), [("checkpoint-500", 500), ("global_step12", 12), ("best", None)])
def test_folder_step_reads_the_trailing_number(name, step):
    assert folder_step(name) == step


def test_a_folder_commit_names_its_model_by_the_model_files_alone(tmp_path):
    store = open_store(str(tmp_path / "bucket" / "run"))
    first = commit_folder(store, write_checkpoint(tmp_path / "a", 4), step=4)
    again = write_checkpoint(tmp_path / "b", 4)
    (again / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log": "another run"}))
    (again / "sub" / "deeper" / "rng.bin").write_bytes(b"other rng")
    second = commit_folder(open_store(str(tmp_path / "bucket" / "other")), again, step=4)
    assert first.model_sha256 is not None and first.model_sha256 == second.model_sha256  # same weights
    assert commit_folder(store, write_checkpoint(tmp_path / "c", 8), step=8).model_sha256 != first.model_sha256
    assert folder_model_sha256({"files/optimizer.pt": blob_info(b"x")}) is None
    assert folder_model_sha256({"files/epoch=1-step=8.ckpt": blob_info(b"x")}) is not None  # Lightning


def test_the_last_commit_of_a_finished_run_is_marked_completed_and_still_restores(tmp_path):
    store = open_store(str(tmp_path / "bucket" / "run"))
    manifest = commit_folder(store, write_checkpoint(tmp_path / "out", 12), step=12, meta={"state": "running"})
    done = mark_completed(store, manifest)
    assert read_manifest(store, 12).meta["state"] == "completed" == done.meta["state"]
    assert done.blobs == manifest.blobs and done.model_sha256 == manifest.model_sha256
    restored = restore_latest(store, tmp_path / "restored")
    assert restored is not None and tree(restored.path) == tree(tmp_path / "out" / "checkpoint-12")


def test_every_committer_fills_the_run_meta_status_reads():
    values = dict.fromkeys(RUN_META_KEYS)
    assert run_meta(**values, run_id="r") == {**values, "run_id": "r"}
    del values["wall_s"]
    with pytest.raises(ValueError, match="lacks wall_s"):
        run_meta(**values)
