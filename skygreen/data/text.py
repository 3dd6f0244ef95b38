"""Text preprocessing for language-model pre-training: pack token streams, drop near-duplicates.

`pack_blocks` concatenates tokenized documents (each followed by a separator token) and cuts
the stream into fixed blocks, as GPT-2 and RoBERTa ("full sentences") pre-training do: no
padding, every token of every block trains. The tail shorter than a block is dropped.

`near_duplicates` finds documents whose word 5-gram sets have an estimated Jaccard similarity
at or above a threshold (MinHash with LSH, `datasketch`), keeping the first of each group.
Web crawls repeat boilerplate, mirrors and templated pages; removing them saves compute and
reduces memorisation. **Off by default**, and not to be switched on blindly: in curated
medical or legal data, near-identical documents are often distinct and meaningful (a
discharge summary template filled in for two patients, two versions of a contract clause, a
statute and its amendment), and dropping them loses exactly the differences that matter.
Look at what it would remove (`near_duplicates` returns the indices) before training on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

DEDUP_WARNING = (
    "near-duplicate removal is on: fine for web crawls, but in curated medical or legal data "
    "near-identical documents are often distinct (templates filled for different patients, clause "
    "versions); check what it removes before training on the result"
)
_WORD = re.compile(r"\w+", re.UNICODE)


def token_dtype(vocab_size: int) -> np.dtype:
    """Return the narrowest unsigned integer type that holds every token id.

    Shards are memory-mapped and streamed: uint16 for a 50k vocabulary halves the bytes of int32.

    Args:
        vocab_size: the number of token ids (ids 0 to `vocab_size - 1`).

    Returns:
        uint8, uint16 or uint32.

    Raises:
        ValueError: the vocabulary does not fit in uint32.
    """
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    raise ValueError(f"vocabulary of {vocab_size} tokens does not fit in uint32")


def pack_blocks(
    token_lists: Iterable[Sequence[int]],
    *,
    block_size: int,
    separator: int | None,
    dtype: np.dtype,
    blocks_per_batch: int = 1024,
) -> Iterator[np.ndarray]:
    """Cut the documents, laid end to end, into fixed blocks.

    Args:
        token_lists: each document's token ids, in order.
        block_size: tokens per block.
        separator: the token put after each document (an end-of-text id); None for none.
        dtype: the blocks' dtype (`token_dtype(vocab_size)`).
        blocks_per_batch: a batch is yielded once this many blocks are full, to bound memory.

    Yields:
        Arrays of shape `(n, block_size)`, n at least 1; the tail shorter than a block is dropped.

    Raises:
        ValueError: `block_size` below 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    chunk = block_size * blocks_per_batch
    buffer: list[int] = []
    for ids in token_lists:
        buffer.extend(ids)
        if separator is not None:
            buffer.append(separator)
        if len(buffer) >= chunk:
            usable = len(buffer) - len(buffer) % block_size
            yield np.asarray(buffer[:usable], dtype=dtype).reshape(-1, block_size)
            buffer = buffer[usable:]
    usable = len(buffer) - len(buffer) % block_size
    if usable:
        yield np.asarray(buffer[:usable], dtype=dtype).reshape(-1, block_size)


def near_duplicates(
    texts: Sequence[str],
    *,
    threshold: float = 0.8,
    num_perm: int = 128,
    shingle_words: int = 5,
    seed: int = 1,
) -> list[int]:
    """Return the indices of documents that near-duplicate an earlier one (to drop), in order.

    Read the module docstring before using this on curated data. Documents without a word
    are never dropped.

    Args:
        texts: the documents.
        threshold: the estimated Jaccard similarity of word shingles at which a document counts
            as a duplicate, strictly between 0 and 1.
        num_perm: MinHash permutations (more: a closer estimate, slower).
        shingle_words: words per shingle.
        seed: the MinHash seed, so the same texts give the same answer.

    Returns:
        Ascending indices into `texts`; the first of each group is kept.

    Raises:
        ValueError: `threshold` not strictly between 0 and 1.
        ModuleNotFoundError: `datasketch` is not installed (`pip install 'skygreen[tasks]'`).
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"near-duplicate threshold must be between 0 and 1 (exclusive), got {threshold}")
    try:
        from datasketch import MinHash, MinHashLSH
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "near-duplicate removal needs the package 'datasketch'\n  fix: pip install 'skygreen[tasks]'"
        ) from e
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    drop: list[int] = []
    for index, text in enumerate(texts):
        shingles = _shingles(text, shingle_words)
        if not shingles:
            continue
        sketch = MinHash(num_perm=num_perm, seed=seed)
        sketch.update_batch([s.encode("utf-8") for s in shingles])
        if lsh.query(sketch):
            drop.append(index)
        else:
            lsh.insert(str(index), sketch)
    return drop


def _shingles(text: str, n: int) -> set[str]:
    words = _WORD.findall(text.lower())
    if len(words) < n:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}
