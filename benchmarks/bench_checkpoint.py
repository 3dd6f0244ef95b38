"""Checkpoint benchmarks, each a ratio measured side by side in one run (medians of rounds).

1. stall:  blocking time of `Checkpointer.save` vs a plain state_dict copy to CPU memory of
           the same model (target <= 1.5).
2. s3 / gcs upload: throughput of skygreen's store `put_file` (what the checkpointer calls)
           and `put` of an open stream vs boto3's own `upload_file` / google-cloud-storage's
           `upload_from_filename` of the same bytes, against moto_server /
           gcp-storage-emulator on loopback, order rotated per round (target >= 0.95).
3. resume: `Checkpointer.load_latest` (find latest, download, verify sha256, load) vs a raw
           boto3 download + `torch.load` of the same blob (target <= 1.3).
4. download: a verified download of one big blob (what a restore does per blob) three ways,
           side by side on the same server: one GET stream then a hash of the file, the
           store's `get_to` (the library's managed download) then a hash, and `fetch_verified`
           (ranged parallel GETs hashed as they land), on S3 and GCS; then again through a
           loopback proxy that serves each connection at `--stream-mb-s` (a cloud front end's
           per-stream rate; the local servers alone are bound by this machine's CPUs instead).

Run: .venv/bin/python benchmarks/bench_checkpoint.py [--model-mb 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from moto_ranged import s3_server  # noqa: E402
from servers import FAKE_AWS_ENV, gcs_process  # noqa: E402


def make_model(total_mb: int) -> torch.nn.Module:
    """Linear layers of 1024 x 4096 fp32 (16 MiB each) up to about `total_mb`."""
    layers = max(1, total_mb // 16)
    return torch.nn.Sequential(*[torch.nn.Linear(4096, 1024, bias=False) for _ in range(layers)])


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_stall(model: torch.nn.Module, rounds: int, tmp: Path) -> tuple[float, float]:
    from skygreen.runtime.checkpointer import Checkpointer

    ck = Checkpointer(str(tmp / "stall"), keep=2)
    plain, ours = [], []
    for step in range(rounds):
        plain.append(timed(lambda: {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}))
        ours.append(timed(lambda step=step: ck.save(step, {"model": model.state_dict()})))
        ck.wait()  # the next save starts with nothing in flight, as when uploads keep up
    ck.close()
    return statistics.median(plain), statistics.median(ours)


def bench_upload(kind: str, blob: Path, rounds: int) -> dict[str, tuple[float, float]]:
    """Per variant: (median MB/s, median of the per-round throughput ratios to the library's
    own file upload). The variants: the library's upload, skygreen's `put_file` (what the
    checkpointer calls) and `put` of an open stream. Each round runs each variant once, back
    to back, the order rotated from round to round so that none always goes first, and each
    upload deleted again (untimed) before the next: the servers keep every object in memory and
    slow down as they fill, and the shared machine's load drifts, so a ratio is taken within a
    round, never across rounds."""
    from skygreen.checkpoint.store_factory import open_store

    bucket = f"bench-{kind}-{os.getpid()}"
    if kind == "s3":
        import boto3

        client = boto3.client("s3")
        client.create_bucket(Bucket=bucket)
        baseline = lambda i: client.upload_file(str(blob), bucket, f"baseline/{i}")  # noqa: E731
    else:
        from google.cloud import storage

        gcs_bucket = storage.Client().create_bucket(bucket)
        baseline = lambda i: gcs_bucket.blob(f"baseline/{i}").upload_from_filename(str(blob))  # noqa: E731
    store = open_store(f"{'s3' if kind == 's3' else 'gs'}://{bucket}/ours")

    def drop_uploads() -> None:
        """Untimed: delete what was uploaded, so the server holds the same bytes before each upload."""
        if kind == "s3":
            for obj in client.list_objects_v2(Bucket=bucket).get("Contents", []):
                client.delete_object(Bucket=bucket, Key=obj["Key"])
        else:
            for item in gcs_bucket.list_blobs():
                item.delete()

    def stream(i: int) -> None:
        with open(blob, "rb") as f:
            store.put(f"stream/{i}", f)

    variants = {"library": baseline, "put_file": lambda i: store.put_file(f"file/{i}", blob), "put stream": stream}
    names = list(variants)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            seconds[name].append(timed(lambda name=name, i=i: variants[name](i)))
            drop_uploads()
    size_mb = blob.stat().st_size / 1e6
    return {
        name: (
            size_mb / statistics.median(seconds[name]),
            statistics.median(base / ours for base, ours in zip(seconds["library"], seconds[name], strict=True)),
        )
        for name in names
    }


def print_upload(label: str, library: str, result: dict[str, tuple[float, float]]) -> None:
    (base, _), (file_mb_s, file_ratio), (stream_mb_s, stream_ratio) = (
        result["library"],
        result["put_file"],
        result["put stream"],
    )
    print(
        f"{label}: {library} {base:.0f} MB/s; skygreen put_file {file_mb_s:.0f} MB/s, ratio {file_ratio:.2f} "
        f"(target >= 0.95); put of an open stream {stream_mb_s:.0f} MB/s, ratio {stream_ratio:.2f}"
    )


def bench_resume(model: torch.nn.Module, rounds: int, tmp: Path) -> tuple[float, float, float]:
    """Medians of: raw download (boto3 defaults) + torch.load, the same with skygreen's
    transfer settings (16 MiB parts, which moto serves faster), and load_latest."""
    import boto3

    from skygreen.checkpoint.manifest import SHARED_BLOB, blob_key
    from skygreen.checkpoint.s3_store import _TRANSFER
    from skygreen.runtime.checkpointer import Checkpointer

    bucket = f"bench-resume-{os.getpid()}"
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/run"
    with Checkpointer(url) as ck:
        ck.save(100, {"model": model.state_dict()})
    key = "run/" + blob_key(100, SHARED_BLOB)

    def raw(config=None) -> None:
        path = tmp / "raw.pt"
        client.download_file(bucket, key, str(path), Config=config)
        torch.load(path, map_location="cpu", weights_only=True)
        path.unlink()

    def ours() -> None:
        loaded = Checkpointer(url).load_latest()
        assert loaded is not None and loaded.step == 100

    raw_s, same_s, ours_s = [], [], []
    for _ in range(rounds):
        raw_s.append(timed(raw))
        same_s.append(timed(lambda: raw(_TRANSFER)))
        ours_s.append(timed(ours))
    return statistics.median(raw_s), statistics.median(same_s), statistics.median(ours_s)


def bench_download(kind: str, blob: Path, rounds: int, tmp: Path, *, tag: str = "d") -> dict[str, tuple[float, float]]:
    """Per variant: (median MB/s, median of the per-round time ratios to the ranged download).
    Each round runs each variant once, order rotated, into a file deleted (untimed) after it."""
    from skygreen.checkpoint.manifest import file_info
    from skygreen.checkpoint.ranged import fetch_verified
    from skygreen.checkpoint.store_factory import open_store

    bucket = f"bench-get-{tag}-{kind}-{os.getpid()}"
    key = "blob.pt"
    if kind == "s3":
        import boto3
        from boto3.s3.transfer import TransferConfig

        client = boto3.client("s3")
        client.create_bucket(Bucket=bucket)
        one_get = TransferConfig(multipart_threshold=1 << 40, use_threads=False)
        single = lambda out: client.download_file(bucket, f"run/{key}", str(out), Config=one_get)  # noqa: E731
    else:
        from google.cloud import storage

        gcs_bucket = storage.Client().create_bucket(bucket)
        single = lambda out: gcs_bucket.blob(f"run/{key}").download_to_filename(str(out), checksum=None)  # noqa: E731
    store = open_store(f"{kind}://{bucket}/run")
    store.put_file(key, blob)
    want = file_info(blob)

    def hashed(download):
        def run(out: Path) -> None:
            download(out)
            assert file_info(out) == want

        return run

    def managed(out: Path) -> None:
        with open(out, "wb") as f:
            store.get_to(key, f)

    variants = {
        "ranged": lambda out: fetch_verified(store, key, out, want),
        "one GET + hash": hashed(single),
        "get_to + hash": hashed(managed),
    }
    names = list(variants)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    out = tmp / "download.bin"
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            seconds[name].append(timed(lambda name=name: variants[name](out)))
            out.unlink()
    size_mb = blob.stat().st_size / 1e6
    return {
        name: (
            size_mb / statistics.median(seconds[name]),
            statistics.median(theirs / ranged for theirs, ranged in zip(seconds[name], seconds["ranged"], strict=True)),
        )
        for name in names
    }


def print_download(label: str, result: dict[str, tuple[float, float]]) -> None:
    parts = [f"{name} {mb_s:.0f} MB/s (time x{ratio:.2f} of ranged)" for name, (mb_s, ratio) in result.items()]
    print(f"{label}: " + "; ".join(parts))


def bench_downloads(s3_url: str, gcs_url: str, blob: Path, args: argparse.Namespace, tmp: Path) -> None:
    """The download figure straight from the servers, then with each stream paced by a proxy."""
    from faultproxy import FaultProxy

    print_download("s3 download, direct", bench_download("s3", blob, args.rounds, tmp))
    print_download("gcs download, direct", bench_download("gs", blob, args.rounds, tmp))
    for kind, url, env in (("s3", s3_url, "AWS_ENDPOINT_URL_S3"), ("gs", gcs_url, "STORAGE_EMULATOR_HOST")):
        proxy = FaultProxy(url, flavour="gcs" if kind == "gs" else "s3").start()
        proxy.reply_mb_s = args.stream_mb_s
        os.environ[env] = proxy.url
        try:
            label = f"{kind} download, {args.stream_mb_s:.0f} MB/s per stream"
            print_download(label, bench_download(kind, blob, args.rounds, tmp, tag="paced"))
        finally:
            os.environ[env] = url
            proxy.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream-mb-s", type=float, default=80.0, help="per-connection rate of the paced download")
    parser.add_argument("--only", choices=["stall", "s3", "gcs", "resume", "download"], action="append")
    parser.add_argument("--server", choices=["moto", "moto-ranged"], default="moto-ranged",
                        help="the S3 server: moto_server serving a ranged GET from its range as S3 does "
                             "(default), or moto as released, which copies the whole object per ranged GET")  # fmt: skip
    args = parser.parse_args()
    only = set(args.only or ["stall", "s3", "gcs", "resume", "download"])
    torch.manual_seed(0)
    model = make_model(args.model_mb)
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"model: {n_bytes / 2**20:.0f} MiB of fp32 weights; {args.rounds} rounds; medians")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if "stall" in only:
            plain, ours = bench_stall(model, args.rounds, tmp)
            print(
                f"stall:  plain copy {plain:.3f} s, Checkpointer.save {ours:.3f} s, ratio {ours / plain:.2f} (target <= 1.5)"
            )
        blob = tmp / "blob.pt"
        torch.save({"model": model.state_dict()}, blob)
        os.environ.update(FAKE_AWS_ENV)
        servers = []
        try:
            moto = gcs = None
            if only & {"s3", "resume", "download"}:
                moto = s3_server(args.server).start(log_dir=tmp)
                servers.append(moto)
                os.environ["AWS_ENDPOINT_URL_S3"] = moto.url
            if "s3" in only:
                print_upload("s3 upload", "boto3 upload_file", bench_upload("s3", blob, args.rounds))
            if only & {"gcs", "download"}:
                gcs = gcs_process().start(log_dir=tmp)
                servers.append(gcs)
                os.environ["STORAGE_EMULATOR_HOST"] = gcs.url
            if "gcs" in only:
                print_upload("gcs upload", "upload_from_filename", bench_upload("gcs", blob, args.rounds))
            if "resume" in only:
                raw, same, ours = bench_resume(model, args.rounds, tmp)
                print(
                    f"resume: raw download + torch.load {raw:.2f} s (boto3 defaults), {same:.2f} s (same transfer "
                    f"settings as skygreen); load_latest {ours:.2f} s; ratios {ours / raw:.2f} and {ours / same:.2f} (target <= 1.3)"
                )
            if "download" in only and moto is not None and gcs is not None:
                bench_downloads(moto.url, gcs.url, blob, args, tmp)
        finally:
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
