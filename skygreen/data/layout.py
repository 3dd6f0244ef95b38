"""The shard format and layout: what `skygreen.data` stores in the bucket, and why.

Why NumPy `.npy` files, not Parquet or WebDataset tar:

- Exact resume draws *global sample indices* from a seeded permutation
  (`skygreen.runtime.data.SampleStream`), so a row must be reachable by index in O(1). A
  `.npy` file memory-maps: row `i` is an offset, with no decoding and no row group to read
  (Parquet decodes whole row groups), and no sequential stream with a shuffle buffer whose
  contents would become part of the position (WebDataset tar).
- What preprocessing produces here is fixed-shape: packed token blocks (rows x block size),
  resized images (rows x H x W x C) and labels. Nothing needs a record container.
- `.npy` is numpy's own documented format (stable since 2007), and numpy is already in the
  runtime: no new dependency (pyarrow is a 40 MB wheel). Karpathy's build-nanogpt stores
  FineWeb the same way, as uint16 `.npy` shards.
- The cost: no compression. Token ids are stored in the narrowest unsigned type that holds
  the vocabulary (`skygreen.data.text.token_dtype`: uint16 for BERT's and GPT-2's), which
  is most of what a compressor would win; images stored as uint8 pixels take more room than
  JPEG, traded for decoding once instead of every epoch.

Layout under `<data_url>/<name>-<key>/`:

    00000.<field>.npy   one file per field per shard, `rows_per_shard` rows each (the last fewer)
    files/<name>        extra files the build produced (a tokenizer, a label map)
    manifest.json       written last: the commit. A folder without one is rebuilt.

Every file's sha256 and size are in the manifest; a download is checked against them. A file
already in the local cache with the right size is reused without hashing it again (the cache
is this machine's own disk; the bucket is the untrusted side).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skygreen.errors import InputError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
"""The file that commits a prepared dataset: written last, after every shard is up, so a
dataset whose folder has it is whole; delete it to make the next start prepare again."""
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}\Z")


@dataclass(frozen=True, kw_only=True)
class ShardSpec:
    """What to prepare: a name, where the data comes from and how it is preprocessed.

    `source` and `config` are JSON values; together they are the cache key, so put in them
    everything that changes the rows (dataset id and revision, tokenizer, block size, dedup
    settings, image size) and nothing that does not (paths on this machine, worker counts).

    Attributes:
        name: the dataset's name: a letter or digit, then letters, digits, '.', '_' or '-'
            (at most 81 characters).
        source: where the data comes from (dataset id, revision, files), as JSON values.
        config: how it is preprocessed, as JSON values.
        rows_per_shard: rows in each shard file (65,536); the last shard may have fewer.

    Raises:
        InputError: a bad name or `rows_per_shard`, or a source or config that is not JSON.
    """

    name: str
    source: Mapping[str, Any]
    config: Mapping[str, Any]
    rows_per_shard: int = 1 << 16

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            raise InputError(f"data name {self.name!r}: use letters, digits, '.', '_' or '-' (at most 81 characters)")
        if not isinstance(self.rows_per_shard, int) or self.rows_per_shard < 1:
            raise InputError(f"rows_per_shard must be a positive integer, got {self.rows_per_shard!r}")
        try:
            canonical({"source": self.source, "config": self.config})
        except (TypeError, ValueError) as e:  # ValueError: NaN or infinity, which JSON cannot write
            raise InputError(f"data {self.name}: source and config must be JSON values: {e}") from e

    @property
    def key(self) -> str:
        """The cache key: 16 hex digits of sha256 over the format version, the source and the config."""
        payload = canonical({"format": FORMAT_VERSION, "source": self.source, "config": self.config})
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def folder(self) -> str:
        """The folder name under the data URL and the cache: `<name>-<key>`."""
        return f"{self.name}-{self.key}"


def canonical(value: Any) -> str:
    """Return the JSON text a key is hashed from: sorted keys, no spaces, no NaN.

    Args:
        value: JSON values.

    Returns:
        The text; equal values give equal text whatever their key order.

    Raises:
        TypeError: `value` holds something JSON cannot write.
        ValueError: `value` holds NaN or infinity.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
