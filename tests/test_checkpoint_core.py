"""The torch-free checkpoint core: layout, manifest, latest, retention, interval, gc planning."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skygreen.checkpoint.gc import stale_steps
from skygreen.checkpoint.interval import CheckpointSchedule, IntervalPolicy, optimal_interval_s
from skygreen.checkpoint.manifest import (
    SHARED_BLOB,
    BlobInfo,
    Manifest,
    blob_info,
    committed_steps,
    latest_manifest,
    manifest_key,
    parse_step_key,
)
from skygreen.checkpoint.retention import apply_retention, deletable_steps, retained_steps
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import CheckpointError, InputError
from skygreen.task.readers import read_duration_s
from skygreen.timestamps import utc_now_iso


def manifest(step: int, *, metric=None, pinned=False, mode="min", created_at=None, blobs=None) -> Manifest:
    return Manifest(
        step=step,
        created_at=created_at or utc_now_iso(microseconds=True),
        blobs=blobs or {SHARED_BLOB: blob_info(b"w%d" % step)},
        metric=metric,
        metric_mode=mode,
        pinned=pinned,
    )


def commit(store, step: int, *, payload: bytes | None = None, **kw) -> Manifest:
    """Write a checkpoint the way the protocol does: blob first, manifest last."""
    payload = payload if payload is not None else b"w%d" % step
    store.put(f"ckpt/{step:012d}/{SHARED_BLOB}", payload)
    m = manifest(step, blobs={SHARED_BLOB: blob_info(payload)}, **kw)
    store.put(manifest_key(step), m.dumps())
    return m


def test_layout_keys():
    assert manifest_key(42) == "ckpt/000000000042/manifest.json"
    assert parse_step_key("ckpt/000000000042/shared.pt") == (42, "shared.pt")
    assert parse_step_key("ckpt/42/shared.pt") is None
    assert parse_step_key("other/000000000042/x") is None


def test_a_sha256_with_a_trailing_newline_is_not_a_sha256():
    with pytest.raises(ValueError, match="64 lowercase hex digits"):
        BlobInfo(size=1, sha256="0" * 64 + "\n")


def test_manifest_round_trips_through_json():
    m = manifest(7, metric=0.25, pinned=True)
    m = Manifest(
        **{
            **{f: getattr(m, f) for f in Manifest.__dataclass_fields__},
            "meta": {"state": "completed", "energy_j": 12.5},
        }
    )
    back = Manifest.loads(m.dumps(), where="x")
    assert back == m
    assert json.loads(m.dumps())["format_version"] == 1


@pytest.mark.parametrize(
    "text, problem",
    [
        (b"{not json", "unreadable"),
        (b"[]", "not a JSON object"),
        (json.dumps({"format_version": 99}).encode(), "format_version 99"),
        (
            json.dumps({"format_version": 1, "step": 1, "created_at": "2025-01-01T00:00:00Z", "blobs": {}}).encode(),
            "shared.pt",
        ),
        (
            json.dumps(
                {
                    "format_version": 1,
                    "step": 1,
                    "created_at": "2025-01-01T00:00:00Z",
                    "blobs": {"shared.pt": {"size": 1, "sha256": "zz"}},
                }
            ).encode(),
            "sha256",
        ),
    ],
)
def test_malformed_manifests_are_checkpoint_errors_naming_the_place(text, problem):
    with pytest.raises(CheckpointError, match=problem) as info:
        Manifest.loads(text, where="s3://b/run/ckpt/000000000001/manifest.json")
    assert "s3://b/run/ckpt/000000000001/manifest.json" in str(info.value)


SHA = "0" * 64


def manifest_json(blobs: dict[str, str], **extra) -> bytes:
    raw = {"format_version": 1, "step": 1, "created_at": "2025-01-01T00:00:00Z", **extra}
    raw["blobs"] = {name: {"size": 1, "sha256": SHA} for name in blobs}
    return json.dumps(raw).encode()


@pytest.mark.parametrize(
    "name",
    ["../shared.pt", "../../home/u/.bashrc", "/etc/passwd", "a/../../b", "./x", "a//b", "a\\..\\b", "x\x00y", ""],
)
def test_a_manifest_naming_a_blob_outside_its_folder_is_unreadable(name):
    # A bucket is untrusted: readers store blobs under their names in local folders.
    for kind, names in (("state", [SHARED_BLOB, name]), ("folder", [f"files/{name}"] if name else [""])):
        extra = {} if kind == "state" else {"kind": "folder"}
        with pytest.raises(CheckpointError, match="is not a"):
            Manifest.loads(manifest_json(dict.fromkeys(names, ""), **extra), where="s3://b/r")


def test_blob_names_of_the_runtime_state_are_plain_and_of_a_folder_relative_paths():
    with pytest.raises(CheckpointError, match="plain file name"):
        Manifest.loads(manifest_json({SHARED_BLOB: "", "sub/rank0.pt": ""}), where="w")
    folder = Manifest.loads(
        manifest_json({"files/model.safetensors": "", "files/a/b.json": ""}, kind="folder"), where="w"
    )
    assert sorted(folder.blobs) == ["files/a/b.json", "files/model.safetensors"]


def test_a_folder_without_manifest_does_not_exist_and_latest_skips_missing_blobs(tmp_path, caplog):
    store = open_store(str(tmp_path))
    commit(store, 1)
    commit(store, 2)
    store.put("ckpt/000000000003/shared.pt", b"uploaded but never committed")
    bad = manifest(4, blobs={SHARED_BLOB: blob_info(b"never uploaded")})
    store.put(manifest_key(4), bad.dumps())  # a manifest without its blobs
    assert committed_steps(store) == [1, 2, 4]
    assert latest_manifest(store).step == 2
    assert "skipping checkpoint step 4" in caplog.text and "shared.pt is missing" in caplog.text
    store.put("ckpt/000000000002/shared.pt", b"w2 truncated")
    assert latest_manifest(store).step == 1
    assert latest_manifest(open_store(str(tmp_path))).step == 1


def test_progress_of_an_empty_bucket_is_none(tmp_path):
    assert latest_manifest(open_store(str(tmp_path / "nothing-yet"))) is None


def test_reading_progress_imports_no_torch_or_cloud_library(tmp_path):
    store = open_store(str(tmp_path))
    commit(store, 3)
    code = (
        "import sys\nfrom skygreen.checkpoint.manifest import latest_manifest\n"
        "from skygreen.checkpoint.store_factory import open_store\n"
        f"print(latest_manifest(open_store({str(tmp_path)!r})).step)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'boto3', 'google', 'sky'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "3" and out[1] == "[]"


# -- retention ---------------------------------------------------------------------------


def test_retention_keeps_last_k_best_and_pinned():
    ms = [manifest(s, metric=m) for s, m in [(1, 5.0), (2, 0.5), (3, 3.0), (4, 4.0), (5, 6.0)]]
    ms[0] = manifest(1, metric=5.0, pinned=True)
    assert retained_steps(ms, keep=2) == {1, 2, 4, 5}
    assert deletable_steps(ms, [1, 2, 3, 4, 5], keep=2) == [3]
    maxed = [manifest(s, metric=float(s % 3), mode="max") for s in range(1, 7)]
    assert retained_steps(maxed, keep=2) == {5, 6}  # best (2.0) at steps 2 and 5: the newest tie


def test_retention_refuses_keep_below_two():
    with pytest.raises(InputError, match="at least 2"):
        retained_steps([manifest(1)], keep=1)


@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.none() | st.floats(-10, 10), st.booleans()),
        min_size=1,
        max_size=15,
        unique_by=lambda t: t[0],
    ),
    st.lists(st.integers(0, 60), max_size=5),
    st.integers(2, 5),
)
def test_retention_never_deletes_what_it_must_keep(entries, leftovers, keep):
    ms = [manifest(step, metric=metric, pinned=pinned) for step, metric, pinned in entries]
    folders = sorted({m.step for m in ms} | set(leftovers))
    doomed = set(deletable_steps(ms, folders, keep=keep))
    newest = max(m.step for m in ms)
    steps = sorted(m.step for m in ms)
    assert not doomed & set(steps[-keep:]), "the last K stay"
    assert not doomed & {m.step for m in ms if m.pinned}, "pinned stay"
    assert all(s < newest for s in doomed), "nothing at or after the newest commit goes"
    scored = [m for m in ms if m.metric is not None]
    if scored:
        best = min(m.metric for m in scored if m.metric is not None)
        assert any(m.metric == best and m.step not in doomed for m in scored), "a best stays"


def test_apply_retention_deletes_old_commits_and_dead_leftovers_but_not_newer_partials(tmp_path):
    store = open_store(str(tmp_path))
    for step in (1, 2, 3, 4):
        commit(store, step)
    store.put("ckpt/000000000000/shared.pt", b"dead save, older than the newest commit")
    store.put("ckpt/000000000009/shared.pt", b"a save in flight")
    assert apply_retention(store, keep=2) == [0, 1, 2]
    assert sorted({k.split("/")[1] for k in store.list()}) == ["000000000003", "000000000004", "000000000009"]


# -- interval ----------------------------------------------------------------------------


def daly(save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order formula, written out independently of the code under test."""
    r = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(r) / 3 + r / 9) - save_s


def test_optimal_interval_is_dalys():
    assert optimal_interval_s(2.0, 36000.0) == pytest.approx(daly(2.0, 36000.0))
    assert optimal_interval_s(2.0, 36000.0) == pytest.approx(math.sqrt(2 * 2 * 36000), rel=0.01), "near Young's"
    assert optimal_interval_s(5000.0, 2000.0) == 2000.0, "a save longer than 2 MTBF: checkpoint once per MTBF"
    assert optimal_interval_s(1.0, math.inf) == math.inf
    with pytest.raises(ValueError):
        optimal_interval_s(1.0, 0.0)


def test_auto_interval_from_measured_cost_and_rate():
    policy = IntervalPolicy(preemptions_per_hour=0.5)  # one preemption per 2 h
    assert policy.mode == "auto"
    assert policy.auto_interval_s(None) == policy.first_auto_s
    assert policy.auto_interval_s(1.0) == pytest.approx(daly(1.0, 7200))
    assert policy.auto_interval_s(1.0, upload_s=500.0) == 500.0, "never shorter than an upload"
    assert policy.auto_interval_s(0.0001) == policy.min_interval_s
    assert policy.auto_interval_s(1e6) == policy.max_interval_s


def test_schedule_by_steps_seconds_and_auto(caplog):
    caplog.set_level("INFO", logger="skygreen.checkpoint")
    steps = CheckpointSchedule(IntervalPolicy(every_steps=100), start_step=0, start_s=0.0)
    assert not steps.due(99, 1e9) and steps.due(100, 0.0)
    steps.saved(100, 5.0)
    assert not steps.due(199, 0.0) and steps.due(200, 0.0)
    secs = CheckpointSchedule(IntervalPolicy(every_s=90.0), start_step=0, start_s=10.0)
    assert not secs.due(1, 99.0) and secs.due(1, 100.0)
    auto = CheckpointSchedule(IntervalPolicy(preemptions_per_hour=1.0), start_step=0, start_s=0.0)
    assert auto.due(5, 120.0)
    auto.saved(5, 120.0, save_cost_s=2.0)
    assert auto.interval_s == pytest.approx(daly(2.0, 3600))
    assert "auto, every 120 s" in caplog.text and "auto, every 119 s" in auto.describe()


def test_interval_policy_rejects_nonsense():
    with pytest.raises(ValueError, match="not both"):
        IntervalPolicy(every_steps=1, every_s=1.0)
    with pytest.raises(ValueError, match="preemptions_per_hour"):
        IntervalPolicy(preemptions_per_hour=0.0)


# -- gc planning -------------------------------------------------------------------------


def test_stale_steps_never_include_latest_best_or_pinned():
    old = "2020-01-01T00:00:00.000000Z"
    ms = [
        manifest(1, created_at=old, metric=0.1),  # best
        manifest(2, created_at=old, pinned=True),
        manifest(3, created_at=old),
        manifest(4, created_at=old),
        manifest(5, created_at=old),  # newest
    ]
    now_s = ms[0].created_at_s + 100 * 86400
    assert stale_steps(ms, latest_step=4, now_s=now_s, older_than_s=90 * 86400) == [3]
    assert stale_steps(ms, latest_step=5, now_s=now_s, older_than_s=101 * 86400) == []


@pytest.mark.parametrize(
    "text, seconds",
    [("90d", 90 * 86400), ("12h", 43200), ("2w", 14 * 86400), ("1.5d", 1.5 * 86400), ("90s", 90), ("5m", 300)],
)
def test_one_duration_reader_for_task_files_and_flags(text, seconds):
    assert read_duration_s(text, "--older-than") == seconds


@pytest.mark.parametrize("text", ["90 days", "0d", "soon", 90])
def test_a_bad_duration_names_the_field(text):
    with pytest.raises(InputError, match="--older-than"):
        read_duration_s(text, "--older-than")


def test_blob_info_validates():
    with pytest.raises(ValueError):
        BlobInfo(size=-1, sha256="0" * 64)
