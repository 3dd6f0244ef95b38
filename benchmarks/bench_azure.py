"""Azure store throughput vs azure-storage-blob's own calls, side by side on Azurite (one run).

Upload: skygreen's `put_file` (what the checkpointer calls) and `put` of an open file vs the
library's `upload_blob(file, max_concurrency=8)` on a client with its defaults. Download:
the store's `get_to` and `fetch_verified` (ranged GETs hashed as they land: what a restore
does per blob) vs the library's `download_blob(max_concurrency=8).readinto(file)`. Each round
runs each variant once, order rotated, the uploaded object deleted (untimed) after each; the
ratio is the library's time over ours within a round (above 1: ours is faster), the median over
rounds. Azurite runs on loopback with its data in a temporary folder, started as the tests
start it (tests/servers.py), so it needs `scripts/install.sh` to have installed it.

Run: .venv/bin/python benchmarks/bench_azure.py [--blob-mb 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from servers import AZURITE_ACCOUNT, AZURITE_BLOB, azurite_connection_string, azurite_process  # noqa: E402


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def side_by_side(
    variants: dict[str, Callable[[int], object]], rounds: int, after: Callable[[], None]
) -> dict[str, list[float]]:
    """Seconds per variant per round, order rotated each round, `after` (untimed) after each."""
    names = list(variants)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            seconds[name].append(timed(functools.partial(variants[name], i)))
            after()
    return seconds


def summary(seconds: dict[str, list[float]], size_mb: float) -> dict[str, tuple[float, float]]:
    """Per variant: (median MB/s, median of the per-round ratios library time / its time)."""
    return {
        name: (
            size_mb / statistics.median(times),
            statistics.median(base / ours for base, ours in zip(seconds["library"], times, strict=True)),
        )
        for name, times in seconds.items()
    }


def bench(blob: Path, rounds: int, tmp: Path) -> tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]]]:
    from azure.storage.blob import BlobServiceClient

    from skygreen.checkpoint.manifest import file_info
    from skygreen.checkpoint.ranged import fetch_verified
    from skygreen.checkpoint.store_factory import open_store

    service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
    container = service.create_container(f"bench-{os.getpid()}")
    store = open_store(f"az://{AZURITE_ACCOUNT}/{container.container_name}/run")
    size_mb = blob.stat().st_size / 1e6

    def library_upload(i: int) -> None:
        with open(blob, "rb") as f:
            container.get_blob_client(f"library/{i}").upload_blob(f, overwrite=True, max_concurrency=8)

    def stream(i: int) -> None:
        with open(blob, "rb") as f:
            store.put(f"stream/{i}", f)

    def drop_uploads() -> None:
        for name in list(container.list_blob_names()):
            if name != "run/blob.pt":
                container.delete_blob(name)

    uploads = summary(
        side_by_side(
            {"library": library_upload, "put_file": lambda i: store.put_file(f"file/{i}", blob), "put stream": stream},
            rounds,
            drop_uploads,
        ),
        size_mb,
    )

    store.put_file("blob.pt", blob)
    want = file_info(blob)
    out = tmp / "download.bin"

    def library_download(_: int) -> None:
        with open(out, "wb") as f:
            container.get_blob_client("run/blob.pt").download_blob(max_concurrency=8).readinto(f)

    def get_to(_: int) -> None:
        with open(out, "wb") as f:
            store.get_to("blob.pt", f)

    downloads = summary(
        side_by_side(
            {
                "library": library_download,
                "get_to": get_to,
                "fetch_verified": lambda _: fetch_verified(store, "blob.pt", out, want),
            },
            rounds,
            lambda: out.unlink(),
        ),
        size_mb,
    )
    return uploads, downloads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blob-mb", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not AZURITE_BLOB.exists():
        sys.exit(f"Azurite is not installed at {AZURITE_BLOB}: run scripts/install.sh (it needs npm)")
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        server = azurite_process(data_dir=tmp / "azurite-data").start(log_dir=tmp)
        try:
            os.environ["AZURE_STORAGE_CONNECTION_STRING"] = azurite_connection_string(server.url)
            for name in ("AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN"):
                os.environ.pop(name, None)
            blob = tmp / "blob.bin"
            blob.write_bytes(os.urandom(args.blob_mb * 1024 * 1024))
            uploads, downloads = bench(blob, args.rounds, tmp)
        finally:
            server.stop()
    print(f"Azurite, {args.blob_mb} MiB blob, medians of {args.rounds} rounds; ratio = library time / ours")
    for title, result in (("upload", uploads), ("download", downloads)):
        parts = [f"{name} {mb_s:.0f} MB/s (x{ratio:.2f})" for name, (mb_s, ratio) in result.items()]
        print(f"{title}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
