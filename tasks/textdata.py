"""Data for the text tasks (`bert_mlm.py`, `gpt2.py`): tokenize and pack once, stream after.

Two sources, one code path:

- **hub** (the full task on a cloud VM): the corpus through `datasets.load_dataset` and the
  model's own tokenizer through `transformers.AutoTokenizer` (a vocabulary file, no weights);
- **sample** (`SKYGREEN_TASK_SIZE=small`, which `skygreen smoke` sets, or a machine with
  `HF_HUB_OFFLINE=1` / `HF_DATASETS_OFFLINE=1`): the English prose of Python's own reference
  manual (`pydoc_data.topics`, about 460 kB, shipped with every CPython), with a tokenizer
  of the same kind trained on it in a second or two with `tokenizers`.

Either way the result goes through `skygreen.data.shards.prepare`: the first start tokenizes,
packs and uploads the shards (with the tokenizer beside them, as `tokenizer.json`); every
later start, a resume after a preemption included, streams the shards and reads the
tokenizer back from the bucket: no hub, no tokenizing again.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from skygreen.data.shards import ShardedDataset, ShardSpec, ShardWriter, prepare
from skygreen.data.text import DEDUP_WARNING, near_duplicates, pack_blocks, token_dtype
from skygreen.task.settings import TASK_SIZE_ENV

_OFFLINE_ENVS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_TEXT_BATCH = 1000


@dataclass(frozen=True, kw_only=True)
class TextData:
    """What a text task trains on, at full size from the hub and at small size from the sample."""

    name: str
    dataset: str
    """`datasets` path, e.g. 'Salesforce/wikitext'."""
    dataset_config: str | None
    split: str
    revision: str
    text_column: str
    tokenizer: str
    """Hub name of the model's tokenizer, e.g. 'bert-base-uncased'."""
    tokenizer_kind: str
    """'wordpiece' (BERT) or 'bytelevel-bpe' (GPT-2): what to train on the sample."""
    block_size: int
    cls_token: str | None = None
    """Put this token first in every block (BERT's [CLS]); None for GPT-style blocks."""
    separator_token: str = "[SEP]"
    sample_vocab_size: int = 2000


def use_sample(size: str) -> bool:
    return size == "small" or any(os.environ.get(v, "") not in ("", "0") for v in _OFFLINE_ENVS)


def prepare_text(data: TextData, *, size: str, dedup: float | None) -> tuple[ShardedDataset, Any]:
    """The packed blocks (`input_ids` rows of `block_size` tokens) and the tokenizer."""
    spec, build = text_shards(data, size=size, dedup=dedup)
    dataset = prepare(spec, build)
    from tokenizers import Tokenizer

    return dataset, Tokenizer.from_str(dataset.file("tokenizer.json").decode())


def text_shards(data: TextData, *, size: str, dedup: float | None) -> tuple[ShardSpec, Callable[[ShardWriter], None]]:
    """The shard spec (what the cache key covers) and the preprocessing that fills it."""
    sample = use_sample(size)
    if sample and size == "full":
        print("textdata: the hub is switched off here (HF_*_OFFLINE): training on the shipped sample", file=sys.stderr)
    if sample:
        source: dict[str, Any] = {
            "corpus": "pydoc_data.topics",
            "sha256": hashlib.sha256(_sample_text().encode()).hexdigest(),
        }
        tokenizer_id: object = {"train": data.tokenizer_kind, "vocab_size": data.sample_vocab_size}
    else:
        source = {
            "dataset": data.dataset,
            "config": data.dataset_config,
            "split": data.split,
            "revision": data.revision,
            "column": data.text_column,
        }
        tokenizer_id = data.tokenizer
    config = {
        "tokenizer": tokenizer_id,
        "block_size": data.block_size,
        "cls": data.cls_token,
        "separator": data.separator_token,
        "dedup": dedup,
    }
    spec = ShardSpec(name=data.name, source=source, config=config, rows_per_shard=1 << 15 if not sample else 256)

    def build(writer: ShardWriter) -> None:
        texts = _sample_documents() if sample else _hub_documents(data)
        if dedup is not None:
            print(f"textdata: warning: {DEDUP_WARNING}", file=sys.stderr)
            texts = list(texts)
            dropped = set(near_duplicates(texts, threshold=dedup))
            print(f"textdata: near-duplicates removed: {len(dropped)} of {len(texts)} documents", file=sys.stderr)
            texts = [t for i, t in enumerate(texts) if i not in dropped]
        tokenizer = _train_tokenizer(data, texts) if sample else _hub_tokenizer(data)
        writer.add_file("tokenizer.json", tokenizer.to_str().encode())
        cls_id = tokenizer.token_to_id(data.cls_token) if data.cls_token else None
        width = data.block_size - (1 if cls_id is not None else 0)
        for blocks in pack_blocks(
            _token_lists(tokenizer, texts),
            block_size=width,
            separator=tokenizer.token_to_id(data.separator_token),
            dtype=token_dtype(tokenizer.get_vocab_size()),
        ):
            if cls_id is not None:
                blocks = np.concatenate([np.full((len(blocks), 1), cls_id, dtype=blocks.dtype), blocks], axis=1)
            writer.add({"input_ids": blocks})

    return spec, build


# -- sources -------------------------------------------------------------------------------


def _sample_text() -> str:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a Python without its docs: this folder's own sources stand in
        return "\n\n".join(p.read_text() for p in sorted(Path(__file__).parent.glob("*.py")))
    return "\n\n".join(topics[k] for k in sorted(topics))


def _sample_documents() -> list[str]:
    """Paragraphs of the sample, in a fixed order."""
    return [p.strip() for p in _sample_text().split("\n\n") if len(p.strip()) > 40]


def _hub_documents(data: TextData) -> Iterator[str]:
    try:
        import datasets
    except ModuleNotFoundError as e:
        sys.exit(
            f"error: the full-size task needs '{e.name}': pip install 'skygreen[tasks]' (or set {TASK_SIZE_ENV}=small)"
        )
    try:
        corpus = datasets.load_dataset(data.dataset, data.dataset_config, split=data.split, revision=data.revision)
    except Exception as e:  # no network, no such dataset: say what to do
        sys.exit(
            f"error: could not load {data.dataset} ({data.dataset_config}, {data.split}) from the hub: {type(e).__name__}: {e}\n"
            f"  fix: check the network and the dataset name, or set {TASK_SIZE_ENV}=small (or HF_DATASETS_OFFLINE=1) "
            "to train on the shipped sample"
        )
    for start in range(0, len(corpus), _TEXT_BATCH):
        for text in corpus[start : start + _TEXT_BATCH][data.text_column]:
            if text and text.strip():
                yield text


def _hub_tokenizer(data: TextData):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(data.tokenizer).backend_tokenizer
    except Exception as e:
        sys.exit(
            f"error: could not load the tokenizer {data.tokenizer!r} from the hub: {type(e).__name__}: {e}\n"
            f"  fix: check the network, or set {TASK_SIZE_ENV}=small to use a tokenizer trained on the shipped sample"
        )


def _train_tokenizer(data: TextData, texts: list[str] | Iterator[str]):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    trainer: Any

    texts = list(texts)
    if data.tokenizer_kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=data.sample_vocab_size,
            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
            show_progress=False,
        )
    elif data.tokenizer_kind == "bytelevel-bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=data.sample_vocab_size,
            special_tokens=[data.separator_token],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    else:
        raise ValueError(f"unknown tokenizer kind {data.tokenizer_kind!r}")
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def _token_lists(tokenizer, texts) -> Iterator[list[int]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == _TEXT_BATCH:
            yield from (e.ids for e in tokenizer.encode_batch(batch, add_special_tokens=False))
            batch = []
    if batch:
        yield from (e.ids for e in tokenizer.encode_batch(batch, add_special_tokens=False))
