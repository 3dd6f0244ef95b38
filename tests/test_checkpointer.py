"""The torch side of the checkpoint protocol: async save, verified load, DDP, retention,
and the fault cases: corrupt blobs, manifests without blobs, partial saves, unsafe pickles."""

from __future__ import annotations

import hashlib
import json
import pickle
import threading

import numpy as np
import pytest
import torch

from skygreen.checkpoint.manifest import SHARED_BLOB, Manifest, blob_info, committed_steps, manifest_key
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import CheckpointError, InputError, RankTimeoutError
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.tensors import model_sha256
from skygreen.timestamps import utc_now_iso


def make_model(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    return model, opt


def train_state(model, opt, step: int) -> dict:
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "step": step,
        "data": {"epoch": 1, "index": step * 4},
    }


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_round_trip_is_exact_and_verified(tmp_path):
    model, opt = make_model()
    rng = {"torch": torch.get_rng_state(), "python": [3, [1, 2, 3], None]}
    with Checkpointer(str(tmp_path)) as ck:
        ck.save(10, train_state(model, opt, 10), rank_state=rng, metric=0.5, meta={"state": "running"})
    loaded = Checkpointer(str(tmp_path)).load_latest()
    assert loaded.step == 10
    assert_same(loaded.state, train_state(model, opt, 10))
    assert_same(loaded.rank_state, rng)
    assert loaded.manifest.model_sha256 == model_sha256(model.state_dict())
    assert loaded.manifest.meta == {"state": "running"} and loaded.manifest.metric == 0.5
    fresh, fresh_opt = make_model(seed=1)
    fresh.load_state_dict(loaded.state["model"])
    fresh_opt.load_state_dict(loaded.state["optim"])
    x = torch.randn(3, 8)
    assert torch.equal(fresh(x), model(x))


def test_model_sha256_follows_its_documented_definition():
    state = {"b": torch.arange(3, dtype=torch.int64), "a": torch.ones(2, 2)}
    digest = hashlib.sha256()
    for name in ("a", "b"):
        t = state[name]
        digest.update(f"{name}\0{t.dtype}\0{list(t.shape)}\0".encode())
        digest.update(t.numpy().tobytes() + b"\0")
    assert model_sha256(state) == digest.hexdigest()
    state["a"][0, 0] = 2.0
    assert model_sha256(state) != digest.hexdigest()


def test_the_snapshot_is_isolated_from_training_that_goes_on(tmp_path):
    model, opt = make_model()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    ck = Checkpointer(str(tmp_path))
    ck.save(1, train_state(model, opt, 1))
    with torch.no_grad():  # the next optimizer step, while the upload may still run
        for p in model.parameters():
            p.add_(1.0)
    ck.close()
    assert_same(Checkpointer(str(tmp_path)).load_latest().state["model"], expected)


def test_corrupt_newest_is_skipped_with_a_warning_and_the_previous_loads(tmp_path, caplog):
    model, opt = make_model()
    with Checkpointer(str(tmp_path), keep=3) as ck:
        ck.save(1, train_state(model, opt, 1))
        ck.wait()
        ck.save(2, train_state(model, opt, 2))
    blob = tmp_path / "ckpt" / "000000000002" / SHARED_BLOB
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # bit rot after commit, same size
    blob.write_bytes(bytes(data))
    loaded = Checkpointer(str(tmp_path)).load_latest()
    assert loaded.step == 1
    assert "skipping checkpoint step 2 (ckpt/000000000002/)" in caplog.text
    assert "shared.pt does not match the manifest" in caplog.text
    assert committed_steps(open_store(str(tmp_path))) == [1, 2], "nothing committed is deleted by a reader"


def test_manifest_without_blobs_and_partial_saves_are_never_loaded(tmp_path, caplog):
    model, opt = make_model()
    with Checkpointer(str(tmp_path)) as ck:
        ck.save(1, train_state(model, opt, 1))
    store = open_store(str(tmp_path))
    orphan = Manifest(step=5, created_at=utc_now_iso(microseconds=True), blobs={SHARED_BLOB: blob_info(b"gone")})
    store.put(manifest_key(5), orphan.dumps())
    store.put("ckpt/000000000007/shared.pt", b"half an upload")  # died before its manifest
    loaded = Checkpointer(str(tmp_path)).load_latest()
    assert loaded.step == 1
    assert "skipping checkpoint step 5" in caplog.text and "shared.pt is missing" in caplog.text
    assert not store.exists("ckpt/000000000007/shared.pt"), "rank 0 clears uncommitted leftovers on resume"


class Exploit:
    def __reduce__(self):
        return (open, ("/tmp/skygreen-pwned-by-checkpoint", "w"))


def test_a_bucket_cannot_run_code_even_with_a_valid_manifest(tmp_path, caplog):
    import os

    model, opt = make_model()
    with Checkpointer(str(tmp_path)) as ck:
        ck.save(1, train_state(model, opt, 1))
    evil = pickle.dumps({"model": Exploit()})
    store = open_store(str(tmp_path))
    store.put("ckpt/000000000002/shared.pt", evil)
    store.put(
        manifest_key(2),
        Manifest(step=2, created_at=utc_now_iso(microseconds=True), blobs={SHARED_BLOB: blob_info(evil)}).dumps(),
    )
    target = "/tmp/skygreen-pwned-by-checkpoint"
    if os.path.exists(target):
        os.remove(target)
    assert Checkpointer(str(tmp_path)).load_latest().step == 1
    assert not os.path.exists(target)
    assert "cannot be loaded safely" in caplog.text


def test_half_precision_storage_is_smaller_and_not_bit_exact(tmp_path):
    model, opt = make_model()
    with Checkpointer(str(tmp_path / "bf16"), half_precision="bf16") as ck:
        ck.save(1, train_state(model, opt, 1))
    with Checkpointer(str(tmp_path / "fp32")) as ck:
        ck.save(1, train_state(model, opt, 1))
    half = Checkpointer(str(tmp_path / "bf16")).load_latest()
    full = Checkpointer(str(tmp_path / "fp32")).load_latest()
    assert half.manifest.blobs[SHARED_BLOB].size < full.manifest.blobs[SHARED_BLOB].size
    assert all(t.dtype == torch.bfloat16 for t in half.state["model"].values())
    assert half.state["optim"]["state"][0]["exp_avg"].dtype == torch.float32, "only weights are halved"
    assert half.manifest.meta["stored_weights"] == "bf16"
    w = model.state_dict()["0.weight"]
    assert torch.allclose(half.state["model"]["0.weight"].float(), w, rtol=1e-2, atol=1e-2)
    fresh, _ = make_model(seed=3)
    fresh.load_state_dict(half.state["model"])  # load_state_dict casts back to fp32
    assert fresh[0].weight.dtype == torch.float32


def test_unloadable_types_fail_at_save_time_naming_where(tmp_path):
    ck = Checkpointer(str(tmp_path))
    with pytest.raises(CheckpointError, match=r"rank_state\['numpy'\][\s\S]*numpy.ndarray[\s\S]*torch.from_numpy"):
        ck.save(1, {"model": {}}, rank_state={"numpy": np.zeros(3)})
    assert committed_steps(open_store(str(tmp_path))) == []


def test_bad_arguments_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="keep"):
        Checkpointer(str(tmp_path), keep=1)
    with pytest.raises(InputError, match="half_precision"):
        Checkpointer(str(tmp_path), half_precision="fp8")
    with pytest.raises(InputError, match="rank"):
        Checkpointer(str(tmp_path), rank=2, world_size=2)
    with pytest.raises(InputError, match="supported"):
        Checkpointer("hdfs://x/y")


def test_retention_keeps_last_k_best_and_pinned_after_each_commit(tmp_path):
    model, opt = make_model()
    metrics = {1: 9.0, 2: 1.0, 3: 8.0, 4: 7.0, 5: 6.0, 6: 5.0}
    with Checkpointer(str(tmp_path), keep=2) as ck:
        for step, metric in metrics.items():
            ck.save(step, train_state(model, opt, step), metric=metric, pin=step == 3)
    assert committed_steps(open_store(str(tmp_path))) == [2, 3, 5, 6]


def test_ddp_ranks_commit_together_and_each_gets_its_own_state(tmp_path):
    model, opt = make_model()
    url = str(tmp_path)
    ranks = [Checkpointer(url, rank=r, world_size=2, rank_wait_s=300) for r in (0, 1)]
    threads = [
        threading.Thread(
            target=lambda r=r: ranks[r].save(
                4, train_state(model, opt, 4), rank_state={"rank": r, "rng": torch.tensor([r])}
            )
        )
        for r in (1, 0)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ck in ranks:
        ck.close()
    manifest = Checkpointer(url).load_latest().manifest
    assert set(manifest.blobs) == {"shared.pt", "rank00000.pt", "rank00001.pt"} and manifest.world_size == 2
    loaded = [Checkpointer(url, rank=r, world_size=2).load_latest() for r in (0, 1)]
    assert [each.step for each in loaded] == [4, 4]
    assert [each.rank_state["rank"] for each in loaded] == [0, 1]


def test_ddp_a_missing_rank_means_no_commit_and_training_goes_on(tmp_path, caplog):
    model, opt = make_model()
    ck = Checkpointer(str(tmp_path), rank=0, world_size=2, rank_wait_s=0.5)
    ck.save(4, train_state(model, opt, 4), rank_state={})
    with pytest.raises(RankTimeoutError, match=r"rank\(s\) 1 did not upload their part"):
        ck.wait()
    assert committed_steps(open_store(str(tmp_path))) == []
    ck.save(5, train_state(model, opt, 5), rank_state={})  # rank 1 is still missing
    ck.save(6, train_state(model, opt, 6), rank_state={})  # the previous failure is a warning
    assert "checkpoint was not committed" in caplog.text
    with pytest.raises(CheckpointError, match="3 checkpoints in a row failed"):
        ck.save(7, train_state(model, opt, 7), rank_state={})


def test_ddp_all_ranks_agree_on_the_step_when_one_rank_blob_is_corrupt(tmp_path):
    """Without a process group each rank verifies every blob, so all reach the same answer."""
    model, opt = make_model()
    url = str(tmp_path)
    for step in (1, 2):
        cks = [Checkpointer(url, rank=r, world_size=2, rank_wait_s=30) for r in (1, 0)]
        for ck in cks:
            ck.save(step, train_state(model, opt, step), rank_state={"r": ck.rank})
        for ck in cks:
            ck.close()
    (tmp_path / "ckpt" / "000000000002" / "rank00001.pt").write_bytes(b"rot")
    steps = [Checkpointer(url, rank=r, world_size=2).load_latest().step for r in (0, 1)]
    assert steps == [1, 1]


def _ddp_worker(rank: int, url: str, init_file: str, out_dir: str) -> None:
    import json
    import os

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        loaded = Checkpointer(url, rank=rank, world_size=2).load_latest()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump([loaded.step, loaded.rank_state["r"]], f)
    finally:
        dist.destroy_process_group()


def test_ddp_with_a_process_group_all_ranks_resume_from_the_same_step(tmp_path):
    """Rank 1's newest blob is corrupt: with gloo, both ranks agree on the older step."""
    import torch.multiprocessing as mp

    model, opt = make_model()
    url = str(tmp_path / "bucket")
    for step in (1, 2):
        cks = [Checkpointer(url, rank=r, world_size=2, rank_wait_s=30) for r in (1, 0)]
        for ck in cks:
            ck.save(step, train_state(model, opt, step), rank_state={"r": ck.rank})
        for ck in cks:
            ck.close()
    (tmp_path / "bucket" / "ckpt" / "000000000002" / "rank00001.pt").write_bytes(b"rot")
    mp.start_processes(_ddp_worker, args=(url, str(tmp_path / "init"), str(tmp_path)), nprocs=2, start_method="spawn")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert results == [[1, 0], [1, 1]]
