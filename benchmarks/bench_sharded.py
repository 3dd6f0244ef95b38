"""Sharded checkpoint benchmarks (`skygreen.runtime.sharded`), ratios measured side by side in one run.

1. stall: what `ShardedCheckpointer.save` blocks training for, against the staging copy of the
          same tensors to host memory (target < 1.2) and against a synchronous `dcp.save` of
          the same state to local disk (what training would wait for without the background
          thread). One process, medians of rounds, interleaved.
2. upload: the aggregate rate of a sharded save at 1, 2 and 4 ranks (torchrun, gloo, CPU; an
          FSDP2 model of the same total size sharded over the ranks; the bytes of every rank
          over the time from `save` to the manifest on rank 0: DCP staging write, sha256, each
          rank's parallel uploads, notes, manifest) against one boto3 `upload_file` stream of
          the same number of bytes, on a loopback moto_server.

Run: .venv/bin/python benchmarks/bench_sharded.py [--model-mb 256] [--rounds 5] [--ranks 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

LAYER_MB = 16


def make_model(total_mb: int) -> torch.nn.Sequential:
    """Linear layers of 1024 x 4096 fp32 (16 MiB each) up to about `total_mb`."""
    return torch.nn.Sequential(*[torch.nn.Linear(4096, 1024, bias=False) for _ in range(max(1, total_mb // LAYER_MB))])


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_stall(total_mb: int, rounds: int, tmp: Path) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    from skygreen.runtime.dcp_files import stage_tensors
    from skygreen.runtime.sharded import ShardedCheckpointer

    model = make_model(total_mb)
    state = {"model": model.state_dict()}
    ck = ShardedCheckpointer(str(tmp / "stall"), template=lambda: state, keep=2, environ={})
    staging, stall, sync = [], [], []
    for step in range(rounds):
        staging.append(timed(lambda: stage_tensors(dict(model.state_dict()))))
        stall.append(timed(lambda step=step: ck.save(step, state)))
        ck.wait()  # the next save starts with nothing in flight, as when uploads keep up
        folder = tmp / f"sync-{step}"
        sync.append(
            timed(lambda folder=folder: dcp.save(state, storage_writer=dcp.FileSystemWriter(folder), no_dist=True))
        )
    ck.close()
    return {
        "staging_s": statistics.median(staging),
        "stall_s": statistics.median(stall),
        "sync_s": statistics.median(sync),
    }


def worker(bucket: str, total_mb: int, rounds: int, out: Path) -> None:
    """One rank of the upload benchmark (under torchrun)."""
    import torch.distributed as dist

    from skygreen.runtime.fsdp import shard
    from skygreen.runtime.sharded import ShardedCheckpointer

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(total_mb)
    shard(model, blocks=list(model))
    ck = ShardedCheckpointer(f"{bucket}/w{world}", template=dict, rank=rank, world_size=world, keep=2, environ={})
    times = []
    for step in range(rounds):
        dist.barrier()
        started = time.perf_counter()
        ck.save(step, {"model": model.state_dict()})
        ck.wait()
        dist.barrier()  # every rank's note is in: rank 0 wrote the manifest after them
        times.append(time.perf_counter() - started)
    if rank == 0:
        out.write_text(json.dumps({"times_s": times}))
    ck.close()
    dist.destroy_process_group()


def bench_upload(total_mb: int, rounds: int, ranks: list[int], tmp: Path) -> dict[str, float]:
    import boto3

    from servers import FAKE_AWS_ENV, moto_process

    server = moto_process().start(log_dir=tmp)
    try:
        os.environ.update(FAKE_AWS_ENV, AWS_ENDPOINT_URL_S3=server.url)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="bench")
        blob = tmp / "blob.bin"
        blob.write_bytes(os.urandom(total_mb * 1024 * 1024))
        results: dict[str, float] = {}
        one = []
        for i in range(rounds):
            one.append(timed(lambda i=i: s3.upload_file(str(blob), "bench", f"one/{i}")))
        results["boto3_one_stream_MBps"] = total_mb / statistics.median(one)
        torchrun = Path(sys.executable).parent / "torchrun"
        for n in ranks:
            out = tmp / f"ranks{n}.json"
            cmd = [
                str(torchrun),
                "--standalone",
                "--nproc-per-node",
                str(n),
                __file__,
                "--worker",
                "s3://bench/sharded",
            ]
            cmd += ["--model-mb", str(total_mb), "--rounds", str(rounds), "--out", str(out)]
            env = dict(os.environ, PYTHONPATH=str(REPO))
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{n} rank(s) failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
            times = json.loads(out.read_text())["times_s"]
            results[f"ranks{n}_MBps"] = total_mb / statistics.median(times)
        return results
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--only", choices=["stall", "upload"], action="append")
    parser.add_argument("--worker", metavar="BUCKET")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model_mb, args.rounds, args.out)
        return
    with tempfile.TemporaryDirectory(prefix="bench-sharded-") as tmp:
        if not args.only or "stall" in args.only:
            s = bench_stall(args.model_mb, args.rounds, Path(tmp))
            print(
                f"stall ({args.model_mb} MiB, median of {args.rounds}): staging copy {s['staging_s']:.3f} s, "
                f"async sharded save {s['stall_s']:.3f} s ({s['stall_s'] / s['staging_s']:.2f}x the copy, target < 1.2), "
                f"synchronous dcp.save {s['sync_s']:.3f} s ({s['stall_s'] / s['sync_s']:.2f}x of it)"
            )
        if not args.only or "upload" in args.only:
            u = bench_upload(args.model_mb, args.rounds, args.ranks, Path(tmp))
            base = u["boto3_one_stream_MBps"]
            print(f"upload ({args.model_mb} MiB, moto_server): one boto3 upload_file stream {base:.0f} MB/s")
            for n in args.ranks:
                rate = u[f"ranks{n}_MBps"]
                print(f"  sharded save, {n} rank(s): {rate:.0f} MB/s aggregate ({rate / base:.2f}x the one stream)")


if __name__ == "__main__":
    main()
