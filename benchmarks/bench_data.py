"""Data levers: what prepared shards cost in storage and save in start-up time per resume.

Side by side in one run, interleaved, medians of rounds, for two workloads:

- `tiny`: tasks/tiny.py's training data (2,048 generated sequences: its "preprocessing");
- `bert-mlm small`: tasks/bert_mlm.py at SKYGREEN_TASK_SIZE=small (train a WordPiece tokenizer
  on the shipped sample, tokenize, pack 32-token blocks);

and for each, the data part of a start (imports warmed, model excluded):

- **preprocess every time**: what a start costs without shards (build the rows in memory);
- **first start, shards**: build once, write the shards and upload them (paid once per dataset);
- **resume on a new VM**: `prepare` finds the manifest and streams the shards from the bucket
  into an empty cache (time to the first row, and until every shard is local and verified);
- **resume, warm cache**: the same VM restarts (the shards are already on its disk).

The bucket is S3 (`moto_server` on loopback), so a "download" crosses boto3 and HTTP, not a
filesystem; a real region bucket is slower per request and faster per byte than this.

Run: .venv/bin/python benchmarks/bench_data.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tasks"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from servers import FAKE_AWS_ENV, make_s3_bucket, moto_process  # noqa: E402
from skygreen.data.shards import ShardSpec, prepare  # noqa: E402
from skygreen.data.text import token_dtype  # noqa: E402

S3_USD_PER_GB_MONTH = 0.023  # S3 Standard, us-east-1, first 50 TB


class MemoryWriter:
    """Collects what a build produces, with no store: preprocessing every time."""

    def __init__(self) -> None:
        self.rows = 0
        self.nbytes = 0

    def add(self, batch) -> None:
        arrays = [np.asarray(v) for v in batch.values()]
        self.rows += len(arrays[0])
        self.nbytes += sum(a.nbytes for a in arrays)

    def add_file(self, name: str, data: bytes) -> None:
        self.nbytes += len(data)


def tiny_workload():
    import tiny

    spec = ShardSpec(
        name="tiny",
        source={"generator": "tiny.make_sequences", "seed": 1},
        config={"rows": tiny.TRAIN_SEQUENCES},
        rows_per_shard=512,
    )

    def build(writer) -> None:
        tokens = tiny.make_sequences(tiny.TRAIN_SEQUENCES, seed=1).numpy()
        writer.add({"tokens": tokens.astype(token_dtype(tiny.VOCAB))})

    return spec, build, tiny.TRAIN_SEQUENCES * (tiny.SEQ_LEN + 1) * 8  # what tiny.py holds: int64 tokens


def bert_small_workload():
    import bert_mlm
    import textdata

    data = dataclasses.replace(bert_mlm.WIKITEXT_103, block_size=bert_mlm.SIZES["small"]["block"])
    spec, build = textdata.text_shards(data, size="small", dedup=None)
    return spec, build, len(textdata._sample_text().encode())


def tokenize_rate(rounds: int) -> tuple[float, float]:
    """(MB of text per second, bytes of text per token) for tokenize + pack alone, with the
    tokenizer already made: the hub path's per-start work, which downloads its tokenizer."""
    import bert_mlm
    import textdata
    from skygreen.data.text import pack_blocks

    data = dataclasses.replace(bert_mlm.WIKITEXT_103, block_size=128)
    texts = textdata._sample_documents()
    tokenizer = textdata._train_tokenizer(data, texts)
    text_bytes = sum(len(t.encode()) for t in texts)
    times, tokens = [], 0
    for _ in range(rounds):
        t, blocks = timed(
            lambda: list(
                pack_blocks(
                    textdata._token_lists(tokenizer, texts), block_size=127, separator=3, dtype=np.dtype(np.uint16)
                )
            )
        )
        times.append(t)
        tokens = sum(b.size for b in blocks)
    return text_bytes / statistics.median(times) / 1e6, text_bytes / tokens


def stream_rate(url: str, tmp: Path, rounds: int) -> float:
    """MB/s for full-size shards: 8 MiB files (32,768 blocks of 128 uint16 tokens), new VM each round."""
    spec = ShardSpec(name="rate", source={"random": 8}, config={}, rows_per_shard=32_768)
    rng = np.random.default_rng(0)
    prepare(
        spec,
        lambda w: w.add({"input_ids": rng.integers(0, 30_522, (4 * 32_768, 128)).astype(np.uint16)}),
        url=url,
        cache_dir=tmp / "rate-vm0",
        prefetch=False,
    )
    rates = []
    for r in range(rounds):
        t, ds = timed(prepare, spec, None, url=url, cache_dir=tmp / f"rate-vm{r + 1}", prefetch=False)
        t2, _ = timed(ds.fetch_all)
        rates.append(ds.nbytes / (t + t2) / 1e6)
        shutil.rmtree(tmp / f"rate-vm{r + 1}", ignore_errors=True)
    return statistics.median(rates)


def timed(fn, *args, **kwargs) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - start, value


def measure(name: str, spec: ShardSpec, build, raw_bytes: int, *, url: str, rounds: int, tmp: Path) -> dict:
    every, first, cold_first_row, cold_all, warm = [], [], [], [], []
    for r in range(rounds):
        round_url = f"{url}/round{r}"
        every.append(timed(build, MemoryWriter())[0])
        t, built = timed(prepare, spec, build, url=round_url, cache_dir=tmp / f"{name}-vm0-{r}", prefetch=False)
        assert built.built
        first.append(t)
        cache = tmp / f"{name}-vm1-{r}"
        t0 = time.perf_counter()
        streamed = prepare(spec, build, url=round_url, cache_dir=cache, prefetch=False)
        assert not streamed.built
        _ = streamed[0]
        cold_first_row.append(time.perf_counter() - t0)
        streamed.fetch_all()
        cold_all.append(time.perf_counter() - t0)
        t, again = timed(prepare, spec, build, url=round_url, cache_dir=cache, prefetch=False)
        again.fetch_all()
        warm.append(t)
        shutil.rmtree(cache, ignore_errors=True)
    stored = built.nbytes
    return {
        "name": name,
        "rows": len(built),
        "raw_bytes": raw_bytes,
        "stored_bytes": stored,
        "shards": len(built.manifest["shards"]),
        "every_s": statistics.median(every),
        "first_s": statistics.median(first),
        "cold_first_row_s": statistics.median(cold_first_row),
        "cold_all_s": statistics.median(cold_all),
        "warm_s": statistics.median(warm),
    }


def report(results: list[dict], tokenize_mb_s: float, bytes_per_token: float, stream_mb_s: float) -> None:
    print(
        "| workload | rows | input | shards stored | S3 $/month | preprocess every start, s | first start with shards, s | resume on a new VM: first row / all shards, s | resume, warm cache, s | saved per resume (new VM, all shards) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        saved = r["every_s"] / r["cold_all_s"]
        print(
            f"| {r['name']} | {r['rows']} | {r['raw_bytes'] / 1e3:.0f} kB | {r['stored_bytes'] / 1e3:.0f} kB in {r['shards']} shards "
            f"| {r['stored_bytes'] / 1e9 * S3_USD_PER_GB_MONTH:.6f} | {r['every_s']:.3f} | {r['first_s']:.3f} "
            f"| {r['cold_first_row_s']:.3f} / {r['cold_all_s']:.3f} | {r['warm_s']:.4f} "
            f"| {r['every_s'] - r['cold_all_s']:+.3f} s ({saved:.1f}x faster) |"
        )
    print(
        f"tokenize + pack alone (tokenizer ready): {tokenize_mb_s:.2f} MB of text/s, {bytes_per_token:.2f} bytes of text per token"
    )
    print(f"streaming full-size shards (8 MiB each) from the bucket into an empty cache: {stream_mb_s:.1f} MB/s")
    for r in results:
        print(
            f"{r['name']}: preprocessing {r['raw_bytes'] / r['every_s'] / 1e6:.2f} MB of input/s; "
            f"streaming shards {r['stored_bytes'] / r['cold_all_s'] / 1e6:.2f} MB/s from the bucket"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.update(FAKE_AWS_ENV)
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp_dir:
        tmp = Path(tmp_dir)
        server = moto_process().start(log_dir=tmp)
        try:
            os.environ["AWS_ENDPOINT_URL_S3"] = server.url
            make_s3_bucket("bench-data")
            url = "s3://bench-data/runs/skygreen-data"
            workloads = [("tiny", *tiny_workload()), ("bert-mlm small", *bert_small_workload())]
            for _name, _spec, build, _raw in workloads:  # warm imports and caches outside the timings
                build(MemoryWriter())
            results = [
                measure(name, spec, build, raw, url=f"{url}/{i}", rounds=args.rounds, tmp=tmp)
                for i, (name, spec, build, raw) in enumerate(workloads)
            ]
            tokenize_mb_s, bytes_per_token = tokenize_rate(args.rounds)
            stream_mb_s = stream_rate(f"{url}/rate", tmp, args.rounds)
        finally:
            server.stop()
    report(results, tokenize_mb_s, bytes_per_token, stream_mb_s)


if __name__ == "__main__":
    main()
