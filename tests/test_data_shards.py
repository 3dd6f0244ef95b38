"""skygreen.data: preprocess once, stream shards from the bucket on every later start, resume exactly.

Real stores: a local directory, S3 (`moto_server`) and GCS (`gcp-storage-emulator`) on loopback.
A "new machine" (a resume after a preemption) is a fresh `prepare` call with an empty local cache.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from skygreen.data.shards import MANIFEST, ShardSpec, open_prepared, prepare
from skygreen.data.text import DEDUP_WARNING, near_duplicates, pack_blocks, token_dtype
from skygreen.errors import InputError, RuntimeSetupError
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.run import Run
from skygreen.runtime.tensors import first_difference
from skygreen.task.settings import RuntimeSettings

ROWS, WIDTH, VOCAB = 45, 8, 50
IGNORE = frozenset({"state['training']['counters']['wall_s']", "state['training']['counters']['restarts']"})


class Builder:
    """A preprocessing step that counts its calls: tokenize-and-pack stands-in, deterministic."""

    def __init__(self, rows: int = ROWS) -> None:
        self.calls = 0
        self.rows = rows

    def __call__(self, writer) -> None:
        self.calls += 1
        rng = np.random.default_rng(7)
        tokens = rng.integers(0, VOCAB, (self.rows, WIDTH)).astype(np.uint16)
        labels = (tokens.sum(axis=1) % 3).astype(np.int16)
        for start in range(0, self.rows, 10):  # batches that do not line up with the shards
            writer.add({"input_ids": tokens[start : start + 10], "label": labels[start : start + 10]})
        writer.add_file("vocab.json", json.dumps({"size": VOCAB}).encode())


def spec(**config) -> ShardSpec:
    return ShardSpec(
        name="toy", source={"generator": "default_rng(7)"}, config={"width": WIDTH, **config}, rows_per_shard=16
    )


@pytest.fixture(params=["local", "s3", "gcs"])
def data_url(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "bucket" / "skygreen-data")
    if request.param == "s3":
        return f"s3://{request.getfixturevalue('s3_bucket')}/runs/skygreen-data"
    return f"gs://{request.getfixturevalue('gcs_bucket')}/runs/skygreen-data"


def test_preprocessing_runs_once_and_later_starts_stream_the_same_rows(data_url, tmp_path):
    build = Builder()
    first = prepare(spec(), build, url=data_url, cache_dir=tmp_path / "vm1")
    assert build.calls == 1 and first.built and len(first) == ROWS
    assert [s["rows"] for s in first.manifest["shards"]] == [16, 16, 13]

    # a resume on a new VM: empty cache, the shards come from the bucket, nothing is preprocessed
    again = prepare(spec(), build, url=data_url, cache_dir=tmp_path / "vm2")
    assert build.calls == 1 and not again.built
    again.fetch_all()
    for i in range(ROWS):
        a, b = first[i], again[i]
        assert a[0].dtype == np.int64 and np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert json.loads(again.file("vocab.json")) == {"size": VOCAB}
    assert sorted(p.name for p in (tmp_path / "vm2" / spec().folder).glob("*.npy")) == sorted(
        f"{i:05d}.{f}.npy" for i in range(3) for f in ("input_ids", "label")
    )
    assert again.nbytes == first.nbytes > ROWS * WIDTH * 2


def test_a_changed_preprocessing_config_prepares_again_under_a_new_key(tmp_path):
    url = str(tmp_path / "data")
    build = Builder()
    a = prepare(spec(), build, url=url, cache_dir=tmp_path / "c")
    b = prepare(spec(dedup=0.8), build, url=url, cache_dir=tmp_path / "c")
    assert build.calls == 2 and a.key != b.key
    assert spec().key == spec().key  # stable: the same source and config give the same key
    assert open_prepared(spec(block=9), url=url, cache_dir=tmp_path / "c") is None


def test_a_half_prepared_folder_without_manifest_is_prepared_again(tmp_path):
    url = str(tmp_path / "data")

    def dies_half_way(writer):
        writer.add({"input_ids": np.zeros((20, WIDTH), np.uint16), "label": np.zeros(20, np.int16)})
        raise KeyboardInterrupt("preempted while preprocessing")

    with pytest.raises(KeyboardInterrupt):
        prepare(spec(), dies_half_way, url=url, cache_dir=tmp_path / "c")
    folder = Path(url) / spec().folder
    assert (folder / "00000.input_ids.npy").exists() and not (folder / MANIFEST).exists()
    build = Builder()
    assert len(prepare(spec(), build, url=url, cache_dir=tmp_path / "c2")) == ROWS and build.calls == 1


def test_a_corrupt_shard_in_the_bucket_is_refused(tmp_path):
    url = str(tmp_path / "data")
    prepare(spec(), Builder(), url=url, cache_dir=tmp_path / "c1")
    shard = Path(url) / spec().folder / "00001.input_ids.npy"
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF
    shard.write_bytes(bytes(raw))
    fresh = prepare(spec(), Builder(), url=url, cache_dir=tmp_path / "c2", prefetch=False)
    assert np.array_equal(fresh[0][0], fresh[0][0])  # shard 0 is intact
    with pytest.raises(RuntimeSetupError, match="does not match the manifest"):
        fresh[20]


def test_a_data_manifest_whose_shard_key_leaves_the_cache_is_refused_and_writes_nothing(s3_bucket, tmp_path):
    # The data manifest is the bucket's, and a bucket is untrusted: a shard key that climbs out
    # of the local cache (an object under that literal S3 key, its true sha256 in the manifest)
    # must not be downloaded there.
    import hashlib

    from skygreen.checkpoint.store_factory import open_store

    url = f"s3://{s3_bucket}/runs/skygreen-data"
    prepare(spec(), Builder(), url=url, cache_dir=tmp_path / "c1")
    store = open_store(f"{url}/{spec().folder}")
    manifest = json.loads(store.get(MANIFEST))
    payload, escape = b"written outside", "../../../escaped.npy"
    store.put(escape, payload)
    manifest["shards"][1]["files"]["input_ids"] = {
        "key": escape, "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()
    }  # fmt: skip
    store.put(MANIFEST, json.dumps(manifest).encode())
    fresh = prepare(spec(), Builder(), url=url, cache_dir=tmp_path / "cache" / "c2", prefetch=False)
    assert np.array_equal(fresh[0][0], fresh[0][0])  # shard 0 is intact
    with pytest.raises(
        RuntimeSetupError, match=r"'\.\./\.\./\.\./escaped\.npy' is not a relative path inside its folder"
    ):
        fresh[20]
    assert not list(tmp_path.rglob("escaped.npy"))


def test_other_ranks_wait_for_rank_0s_manifest(tmp_path):
    url = str(tmp_path / "data")
    with pytest.raises(RuntimeSetupError, match="rank 0 did not commit"):
        prepare(spec(), Builder(), url=url, cache_dir=tmp_path / "c", rank=1, wait_s=0.3, poll_s=0.1)
    prepare(spec(), Builder(), url=url, cache_dir=tmp_path / "c")
    build = Builder()
    assert len(prepare(spec(), build, url=url, cache_dir=tmp_path / "c1", rank=1, poll_s=0.1)) == ROWS
    assert build.calls == 0


def test_the_data_url_comes_from_the_runs_bucket(tmp_path):
    env = {"SKYGREEN_BUCKET": str(tmp_path / "bucket"), "SKYGREEN_DATA_CACHE": str(tmp_path / "cache")}
    prepare(spec(), Builder(), environ=env)
    assert (tmp_path / "bucket" / "skygreen-data" / spec().folder / MANIFEST).exists()
    assert (tmp_path / "cache" / spec().folder / MANIFEST).exists()
    shared = {**env, "SKYGREEN_DATA_URL": str(tmp_path / "team-data")}
    prepare(spec(), Builder(), environ=shared)
    assert (tmp_path / "team-data" / spec().folder / MANIFEST).exists()
    with pytest.raises(RuntimeSetupError, match="SKYGREEN_DATA_URL"):
        prepare(spec(), Builder(), environ={})


def test_bad_names_and_rows_are_clear_errors(tmp_path):
    with pytest.raises(InputError, match="data name 'a/b'"):
        ShardSpec(name="a/b", source={}, config={})
    with pytest.raises(InputError, match="data name 'ok\\\\n'"):
        ShardSpec(name="ok\n", source={}, config={})  # `$` would match before a final newline
    with pytest.raises(InputError, match="JSON values"):
        ShardSpec(name="ok", source={"when": object()}, config={})
    with pytest.raises(InputError, match="JSON values"):  # NaN has no JSON form either
        ShardSpec(name="ok", source={}, config={"dropout": float("nan")})

    def mixed(writer):
        writer.add({"input_ids": np.zeros((3, WIDTH), np.uint16)})
        writer.add({"input_ids": np.zeros((3, WIDTH + 1), np.uint16)})

    with pytest.raises(ValueError, match="field 'input_ids'"):
        prepare(spec(), mixed, url=str(tmp_path / "d"), cache_dir=tmp_path / "c")
    with pytest.raises(RuntimeSetupError, match="produced no rows"):
        prepare(spec(x=1), lambda writer: None, url=str(tmp_path / "d"), cache_dir=tmp_path / "c")


# ---------------------------------------------------------------- exact resume through the shards


class Crash(Exception):
    pass


def train(
    bucket: Path,
    cache: Path,
    build: Builder,
    *,
    crash_at: tuple[int, int] | None = None,
    data_spec: ShardSpec | None = None,
) -> Run:
    """A small classifier over the shards; a fresh process each call (new data cache = new VM)."""
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    data = prepare(data_spec or spec(), build, url=str(bucket / "skygreen-data"), cache_dir=cache)
    model = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, 8), torch.nn.Flatten(), torch.nn.Dropout(0.1), torch.nn.Linear(8 * WIDTH, 3)
    )
    settings = RuntimeSettings(
        run_id="run", bucket=str(bucket), precision="fp32", effective_batch=12, micro_batch=3, checkpoint_every_steps=2
    )
    run = Run(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
        dataset=data,
        extra_state={"data": data},
        settings=settings,
        environ={},
    )
    with run:
        for step in run.steps(10):
            with step:
                for k, (ids, label) in enumerate(step.micro_batches()):
                    if crash_at == (step.index, k):
                        raise Crash()
                    loss = F.cross_entropy(run.model(ids), label.long())
                    step.backward(loss)
                step.optimizer_step()
    return run


def final(bucket: Path):
    loaded = Checkpointer(f"{bucket}/run").load_latest()
    assert loaded is not None and loaded.manifest.meta["state"] == "completed"
    return loaded


def test_kill_mid_epoch_and_resume_through_the_shard_stream_is_bit_identical(tmp_path):
    # 45 rows, 12 per step: the step-4 checkpoint sits 3 rows into epoch 1; the crash at step 5,
    # micro-step 2 throws away half an accumulation window that straddles nothing but is redone
    reference_bucket, bucket = tmp_path / "reference", tmp_path / "interrupted"
    train(reference_bucket, tmp_path / "ref-cache", Builder())
    build = Builder()
    with pytest.raises(Crash):
        train(bucket, tmp_path / "vm1", build, crash_at=(5, 2))
    resumed = train(bucket, tmp_path / "vm2", build)
    assert build.calls == 1, "the resume preprocessed again instead of streaming the shards"
    assert resumed.counters["restarts"] == 1
    a, b = final(reference_bucket), final(bucket)
    assert a.step == b.step == 10
    assert b.state["extra"]["data"]["key"] == spec().key
    assert first_difference(a.state, b.state, ignore=IGNORE) is None, first_difference(a.state, b.state, ignore=IGNORE)
    assert first_difference(a.rank_state, b.rank_state) is None


def test_resuming_against_differently_prepared_data_stops_with_a_clear_error(tmp_path):
    with pytest.raises(Crash):
        train(tmp_path, tmp_path / "vm1", Builder(), crash_at=(5, 0))
    with pytest.raises(RuntimeSetupError, match="the source or the preprocessing config changed"):
        train(tmp_path, tmp_path / "vm2", Builder(), data_spec=spec(dedup=0.9))


# ---------------------------------------------------------------- text helpers


def test_pack_blocks_lays_documents_end_to_end_with_separators():
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    blocks = np.concatenate(
        list(pack_blocks(docs, block_size=4, separator=0, dtype=np.dtype(np.uint16), blocks_per_batch=1))
    )
    stream = [1, 2, 3, 0, 4, 5, 0, 6, 7, 8, 9, 0, 10, 0]
    assert blocks.dtype == np.uint16
    assert blocks.tolist() == [stream[0:4], stream[4:8], stream[8:12]]  # the 2-token tail is dropped
    assert token_dtype(30522) == np.uint16 and token_dtype(50257) == np.uint16 and token_dtype(200_000) == np.uint32


def test_near_duplicates_finds_edited_copies_and_keeps_distinct_documents():
    base = (
        "The patient was admitted with chest pain and shortness of breath. An electrocardiogram showed "
        "sinus rhythm without acute changes, and troponin levels were within normal limits on arrival. "
    )
    docs = [
        base * 3,
        (base * 3).replace("arrival", "admission"),  # a one-word edit of the first: a near-duplicate
        "Gradient accumulation sums the gradients of several micro-batches before one optimizer step, "
        "so that the effective batch stays the same on a smaller GPU. " * 3,
        base * 3 + " Follow-up in two weeks.",  # the first plus a sentence: still near
    ]
    assert near_duplicates(docs, threshold=0.8) == [1, 3]
    assert near_duplicates(docs, threshold=0.98) == []  # a one-word edit is ~90% similar, not 98%
    with pytest.raises(ValueError, match="between 0 and 1"):
        near_duplicates(docs, threshold=1.5)
    assert "medical or legal" in DEDUP_WARNING


def test_text_tasks_leave_deduplication_off_by_default():
    tasks = Path(__file__).resolve().parents[1] / "tasks"
    sys.path.insert(0, str(tasks))
    try:
        import bert_mlm
        import gpt2
    finally:
        sys.path.remove(str(tasks))
    for module in (bert_mlm, gpt2):
        sys.argv = [str(module.__file__)]
        assert module.parse_args().dedup is None


def test_rows_come_in_one_field_order_where_built_and_where_streamed(tmp_path):
    """The process that builds and every later start (which reads the manifest back) see a
    row's fields in the same order, whatever order the build added them in."""

    def build(writer) -> None:
        writer.add({"label": np.arange(3, dtype=np.int16), "input_ids": np.ones((3, WIDTH), np.uint16)})

    url = str(tmp_path / "bucket" / "skygreen-data")
    built = prepare(spec(order="label-first"), build, url=url, cache_dir=tmp_path / "a", environ={}, prefetch=False)
    streamed = prepare(spec(order="label-first"), build, url=url, cache_dir=tmp_path / "b", environ={}, prefetch=False)
    assert built.built and not streamed.built
    assert built.fields == streamed.fields == ("input_ids", "label")
    for got, want in zip(built[1], streamed[1], strict=True):
        assert np.array_equal(got, want)
