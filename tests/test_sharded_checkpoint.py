"""The sharded checkpoint core in one process (DCP without a process group): staging, the
manifest, verification before reading, and the restricted unpickler for DCP's `.metadata`."""

from __future__ import annotations

import json
import logging
import os
import pickle
from pathlib import Path

import pytest
import torch

from skygreen.checkpoint.lease import LAUNCH_ENV, read_lease
from skygreen.checkpoint.manifest import (
    Manifest,
    blob_info,
    blob_key,
    committed_steps,
    manifest_key,
    read_manifest,
    sharded_model_sha256,
)
from skygreen.errors import CheckpointError
from skygreen.exit_codes import SUPERSEDED
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.dcp_files import join_tensors, read_dcp_metadata, split_tensors
from skygreen.runtime.sharded import ShardedCheckpointer
from skygreen.runtime.state import BatchShape, TrainingState


def state(scale: float) -> dict:
    return {
        "model": {"w": torch.arange(12.0).reshape(3, 4) * scale, "b": torch.ones(4) * scale},
        "optimizer": {"state": {"w": {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": ["w"]}]},
        "progress": {"step": 7, "samples_seen": 56},
    }


def checkpointer(url: str, live: dict) -> ShardedCheckpointer:
    return ShardedCheckpointer(url, template=lambda: live, environ={})


def test_split_and_join_round_trip_and_name_tensors_by_path():
    skeleton, tensors = split_tensors(state(1.0))
    assert sorted(tensors) == ["model.b", "model.w", "optimizer.state.w.step"]
    assert skeleton["progress"] == {"step": 7, "samples_seen": 56}
    assert skeleton["optimizer"]["param_groups"] == [{"lr": 0.1, "params": ["w"]}]
    joined = join_tensors(skeleton, tensors)
    assert torch.equal(joined["model"]["w"], state(1.0)["model"]["w"])
    with pytest.raises(CheckpointError, match=r"model\.b"):
        join_tensors(skeleton, {k: v for k, v in tensors.items() if k != "model.b"})


def test_save_stages_a_copy_so_training_can_change_the_tensors_at_once(tmp_path):
    live = state(1.0)
    ck = checkpointer(str(tmp_path), state(0.0))
    ck.save(5, live, rank_state={"rng": torch.tensor([1, 2])}, meta={"state": "running"})
    live["model"]["w"].add_(100.0)  # the optimizer steps on while the upload runs
    ck.wait()
    loaded = ck.load_latest()
    assert loaded is not None and loaded.step == 5
    assert torch.equal(loaded.state["model"]["w"], state(1.0)["model"]["w"])
    assert loaded.state["progress"] == {"step": 7, "samples_seen": 56}
    assert torch.equal(loaded.rank_state["rng"], torch.tensor([1, 2]))
    manifest = read_manifest(ck.store, 5)
    assert manifest.layout == "sharded-dcp" and manifest.meta == {"state": "running"}
    assert {"dcp.metadata", "dcp__0_0.distcp", "shared.pt", "rank00000.pt"} == set(manifest.blobs)
    assert ck.last_stage_s is not None and ck.last_save_cost_s is not None


def _two_commits(tmp_path: Path) -> ShardedCheckpointer:
    ck = checkpointer(str(tmp_path), state(0.0))
    ck.save(1, state(1.0))
    ck.save(2, state(2.0))
    ck.wait()
    assert committed_steps(ck.store) == [1, 2]
    return ck


def test_a_corrupt_shard_is_skipped_and_the_previous_commit_loads(tmp_path, caplog):
    ck = _two_commits(tmp_path)
    shard = tmp_path / blob_key(2, "dcp__0_0.distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="skygreen.checkpoint"):
        loaded = checkpointer(str(tmp_path), state(0.0)).load_latest()
    assert loaded is not None and loaded.step == 1
    assert torch.equal(loaded.state["model"]["b"], torch.ones(4))
    assert "dcp__0_0.distcp does not match the manifest" in caplog.text
    assert ck.last_committed_step == 2


class _Payload:
    """Unpickling this runs `os.system` (what a hostile bucket would plant)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_metadata_pickle_naming_any_other_global_is_refused_even_with_a_matching_manifest(tmp_path, caplog):
    ck = _two_commits(tmp_path)
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Payload(marker))
    ck.store.put(blob_key(2, "dcp.metadata"), evil)
    old = read_manifest(ck.store, 2)  # whoever can write the bucket can rewrite the manifest too
    blobs = dict(old.blobs, **{"dcp.metadata": blob_info(evil)})
    forged = Manifest(step=2, created_at=old.created_at, blobs=blobs, layout=old.layout, meta=old.meta)
    ck.store.put(manifest_key(2), forged.dumps())
    with caplog.at_level(logging.WARNING, logger="skygreen.checkpoint"):
        loaded = checkpointer(str(tmp_path), state(0.0)).load_latest()
    assert loaded is not None and loaded.step == 1
    assert not marker.exists()
    assert "refusing to load posix.system" in caplog.text or "refusing to load os.system" in caplog.text


def test_real_dcp_metadata_reads_and_a_foreign_object_does_not(tmp_path):
    _two_commits(tmp_path)
    metadata = read_dcp_metadata((tmp_path / blob_key(2, "dcp.metadata")).read_bytes(), where="test")
    assert "model.w" in metadata.state_dict_metadata
    with pytest.raises(CheckpointError, match=r"refusing to load builtins\.eval"):
        read_dcp_metadata(pickle.dumps(eval), where="test")
    with pytest.raises(CheckpointError, match="not DCP's Metadata"):
        read_dcp_metadata(pickle.dumps({"a": 1}), where="test")


def test_a_ddp_run_skips_a_sharded_checkpoint_naming_why(tmp_path, caplog):
    _two_commits(tmp_path)
    with caplog.at_level(logging.WARNING, logger="skygreen.checkpoint"):
        assert Checkpointer(str(tmp_path)).load_latest() is None
    assert "written by an FSDP run" in caplog.text


def test_a_sharded_run_skips_a_full_checkpoint(tmp_path, caplog):
    with Checkpointer(str(tmp_path)) as full:
        full.save(3, {"model": {"w": torch.ones(2)}})
    with caplog.at_level(logging.WARNING, logger="skygreen.checkpoint"):
        assert checkpointer(str(tmp_path), state(0.0)).load_latest() is None
    assert "written by a DDP run" in caplog.text


def test_save_state_and_restore_state_take_the_same_named_states_as_the_full_checkpointer(tmp_path):
    """The mapping `Run` hands either checkpointer: restored objects hold the saved tensors and
    progress; the states given are what a load fills, so no template is needed."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    training = TrainingState(batch=BatchShape(effective=8, micro=2))
    training.advance()
    saver = ShardedCheckpointer(str(tmp_path), environ={})
    saved = saver.save_state(1, {"model": model, "optimizer": opt, "training": training, "scheduler": None})
    saver.close()
    assert set(saved) == {"model", "optimizer", "training"}

    fresh_model = torch.nn.Linear(4, 3)
    fresh_opt = torch.optim.AdamW(fresh_model.parameters(), lr=0.1)
    fresh_opt.zero_grad()
    fresh_model(torch.randn(5, 4)).sum().backward()
    fresh_opt.step()  # the optimizer has state of its own, which the load must replace
    fresh_training = TrainingState(batch=BatchShape(effective=8, micro=2))
    loader = ShardedCheckpointer(str(tmp_path), environ={})
    with pytest.raises(CheckpointError, match="nothing to load into"):
        loader.load_latest()
    loaded = loader.restore_state({"model": fresh_model, "optimizer": fresh_opt, "training": fresh_training})
    assert loaded is not None and loaded.step == 1
    assert torch.equal(fresh_model.weight, model.weight) and torch.equal(fresh_model.bias, model.bias)
    want, got = opt.state_dict()["state"][0], fresh_opt.state_dict()["state"][0]
    assert torch.equal(got["exp_avg"], want["exp_avg"]) and torch.equal(got["step"], want["step"])
    assert (fresh_training.step, fresh_training.samples_seen) == (1, 8)


def test_a_sharded_writer_whose_lease_a_newer_launch_took_commits_and_deletes_nothing(tmp_path, caplog):
    """Rank 0 checks the writer lease before its manifest and retention, as the full checkpointer
    does: the older life exits with the superseded code, and the newer life's commits stay."""
    url = str(tmp_path)
    old = ShardedCheckpointer(url, template=lambda: state(0.0), keep=2, environ={LAUNCH_ENV: "1"})
    assert old.load_latest() is None  # takes launch 1's lease
    old.save(10, state(1.0))
    old.wait()
    new = ShardedCheckpointer(url, template=lambda: state(0.0), keep=2, environ={LAUNCH_ENV: "2"})
    assert new.load_latest().step == 10  # launch 2 takes over
    new.save(11, state(2.0))
    new.wait()
    assert read_lease(new.store).launch == 2

    caplog.set_level(logging.ERROR, logger="skygreen.checkpoint")
    old.save(20, state(3.0))
    with pytest.raises(SystemExit) as stopped:
        old.wait()
    assert stopped.value.code == SUPERSEDED
    assert "launch 1 of this run is superseded" in caplog.text
    assert committed_steps(new.store) == [10, 11]  # no step 20, nothing of launch 2's deleted

    late = ShardedCheckpointer(url, template=lambda: state(0.0), keep=2, environ={LAUNCH_ENV: "1"})
    with pytest.raises(SystemExit) as refused:
        late.load_latest()  # an older life that starts late stops before removing anything
    assert refused.value.code == SUPERSEDED


def test_the_load_plan_names_the_files_a_rank_reads_and_the_reader_refuses_any_other(tmp_path):
    import torch.distributed.checkpoint as dcp

    from skygreen.runtime.dcp_files import VerifiedReader, planned_files

    _two_commits(tmp_path)
    folder = tmp_path / "dcp"
    folder.mkdir()
    for name in ("dcp.metadata", "dcp__0_0.distcp"):
        (folder / name[len("dcp") :]).write_bytes((tmp_path / blob_key(2, name)).read_bytes())
    metadata = read_dcp_metadata((folder / ".metadata").read_bytes(), where="test")
    _, targets = split_tensors(state(0.0))
    into = {k: t.clone() for k, t in targets.items()}
    assert planned_files(metadata, into) == {"__0_0.distcp"}
    with pytest.raises(CheckpointError, match="cannot plan"):
        planned_files(metadata, {"model.w": torch.zeros(5, 5)})  # a shape the checkpoint does not hold
    with pytest.raises(BaseException, match=r"__0_0\.distcp, which was not verified"):
        dcp.load(into, storage_reader=VerifiedReader(folder, verified=set()), no_dist=True)
    assert torch.equal(into["model.w"], torch.zeros(3, 4))  # nothing was read
    dcp.load(into, storage_reader=VerifiedReader(folder, verified={"__0_0.distcp"}), no_dist=True)
    assert torch.equal(into["model.w"], state(2.0)["model"]["w"])


def test_a_manifest_naming_one_shard_file_twice_or_a_path_is_skipped(tmp_path, caplog):
    """Each blob is read under its base name (the life tag taken out): a manifest that lists two
    files for one blob, or a name that is no file name, cannot say which to read, and is skipped."""
    url = str(tmp_path)
    ck = ShardedCheckpointer(url, template=lambda: state(0.0), environ={LAUNCH_ENV: "1"})
    ck.save(1, state(1.0))
    ck.save(2, state(2.0))
    ck.save(3, state(3.0))
    ck.close()
    assert ck.life is not None
    shard = f"dcp__0_0.{ck.life}.distcp"
    for step, extra in ((3, "dcp__0_0.distcp"), (2, "../dcp__0_0.distcp")):
        old = read_manifest(ck.store, step)
        forged = old.to_json()  # as JSON: the Manifest class itself refuses the path
        forged["blobs"][extra] = old.blobs[shard].to_json()
        ck.store.put(manifest_key(step), json.dumps(forged).encode())
    with caplog.at_level(logging.WARNING, logger="skygreen.checkpoint"):
        loaded = checkpointer(url, state(0.0)).load_latest()
    assert loaded is not None and loaded.step == 1
    assert torch.equal(loaded.state["model"]["w"], state(1.0)["model"]["w"])
    assert f"lists dcp__0_0.distcp twice (dcp__0_0.distcp, {shard})" in caplog.text
    assert "'../dcp__0_0.distcp' is not a plain file name" in caplog.text


def test_a_sharded_commit_names_its_weights_by_its_shard_files(tmp_path):
    manifests = []
    for name, scale in (("a", 1.0), ("b", 1.0), ("c", 2.0)):
        ck = checkpointer(str(tmp_path / name), state(0.0))
        ck.save(5, state(scale), rank_state={"rng": torch.tensor([1])}, meta={"state": "running"})
        ck.wait()
        manifests.append(read_manifest(ck.store, 5))
        ck.close()
    first, same, other = manifests
    # equal weights and optimizer state: one identity, although DCP's index differs between saves
    assert first.model_sha256 is not None and first.model_sha256 == same.model_sha256
    assert other.model_sha256 != first.model_sha256
    assert sharded_model_sha256({"dcp.metadata": blob_info(b"x"), "shared.pt": blob_info(b"y")}) is None
