"""Data levers: preprocess once, store shards in the bucket, stream them on every later start.

A spot run starts many times: the first launch, then once after every preemption. Tokenizing
WikiText-103 or FineWeb on every start would pay the same CPU hours again and again while the
GPU waits. `skygreen.data.shards.prepare` runs the preprocessing once, writes the result as
shards under the run's bucket (keyed by a hash of the source and the preprocessing config),
and every later start (a resume, another run of the same task, another rank) downloads and
memory-maps those shards instead.

- `skygreen.data.shards`: `prepare` (build once or stream) and where the data lives; its
  public names are also importable from here (`from skygreen.data import ShardSpec, prepare`).
- `skygreen.data.layout`: the shard format (NumPy `.npy`) and layout, and why; `ShardSpec`.
- `skygreen.data.writer` / `skygreen.data.reader`: `ShardWriter`, `ShardedDataset`.
- `skygreen.data.cache`: the local cache's whole-file writes and hashing.
- `skygreen.data.text`: packing token streams into fixed blocks, and optional near-duplicate
  removal (MinHash; off by default).

This folder also holds skygreen's packaged tables (`default_catalog.csv`,
`carbon_intensity.csv`) as package data. Importing `skygreen.data` imports nothing else: the
planner reads those tables by path and must not pay for numpy.
"""

from __future__ import annotations

from skygreen.lazy_names import lazy_getattr

_LAZY = {
    "MANIFEST": "skygreen.data.layout",
    "ShardSpec": "skygreen.data.layout",
    "ShardWriter": "skygreen.data.writer",
    "ShardedDataset": "skygreen.data.reader",
    "open_prepared": "skygreen.data.shards",
    "prepare": "skygreen.data.shards",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = ["MANIFEST", "ShardSpec", "ShardWriter", "ShardedDataset", "open_prepared", "prepare"]
